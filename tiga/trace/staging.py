"""trace: staging Python functions into GraphPrograms, and inlining programs back."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.dtypes import bool_, float64, int64
from ..core.errors import TraceError
from ..core.program import GraphProgram, Lit
from ..core.types import TensorType
from .pytree import tree_flatten, tree_unflatten
from .tracer import Builder, Tracer, aval_of, bind, building


def leaf_aval(x):
    """Type of an argument leaf. Python scalars are weakly typed and held at 64 bits, so a
    value like 0.3 stays exact and still adopts the dtype of the arrays it meets."""
    if isinstance(x, np.generic):  # np.float64 subclasses float but carries its own dtype
        return aval_of(x)
    if isinstance(x, bool):
        return TensorType((), bool_, True)
    if isinstance(x, int):
        return TensorType((), int64, True)
    if isinstance(x, float):
        return TensorType((), float64, True)
    return aval_of(x)


def leaf_value(x):
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return np.asarray(x, leaf_aval(x).dtype.np)
    return x


def trace_flat(fn: Callable, in_avals: list, *, top: bool = True, lift: bool = False):
    """Trace `fn(*tracers)`; returns (program, captured outer values, output treedef).

    The program's binders are the captured values first, then the arguments. `lift`: disk
    tensors the function closes over are captured values too (Builder), not literals.
    """
    builder = Builder(top, lift)
    with building(builder):
        args = [builder.new_arg(a) for a in in_avals]
        out = fn(*args)
        leaves, out_tree = tree_flatten(out)
        for leaf in leaves:
            if (not isinstance(leaf, (Tracer, np.ndarray, np.generic, int, float, bool))
                    and not hasattr(leaf, "__array__")):
                raise TraceError(f"a traced function returned {type(leaf).__name__}; "
                                 "outputs must be arrays (or pytrees of arrays)")
        program = builder.program([leaf_value(x) for x in leaves])
    return program, [x for x, _ in builder.captures], out_tree


def make_program(fn: Callable, static_argnums=()) -> Callable:
    """`tg.make_program(f)(*args)` returns the typed GraphProgram of `f` at those args."""
    static = _as_tuple(static_argnums)

    def build(*args) -> GraphProgram:
        program, captures, _ = trace_args(fn, args, static)
        if captures:
            raise TraceError("make_program: the function closes over traced values of an "
                             "enclosing transformation; call make_program outside it")
        return program

    return build


def trace_args(fn: Callable, args: tuple, static: tuple, lift: bool = False):
    """Trace `fn` at `args` (pytrees), keeping `static` positions as Python values."""
    dyn = [a for i, a in enumerate(args) if i not in static]
    leaves, in_tree = tree_flatten(dyn)

    def flat_fn(*tracers):
        rebuilt = iter(tree_unflatten(in_tree, tracers))
        full = [args[i] if i in static else next(rebuilt) for i in range(len(args))]
        return fn(*full)

    return trace_flat(flat_fn, [leaf_aval(x) for x in leaves], lift=lift)


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    return (x,) if isinstance(x, int) else tuple(x)


def replay(program: GraphProgram, args):
    """Bind every equation of `program` on `args`; returns `read(atom) -> value`."""
    env = {id(v): a for v, a in zip(program.in_binders, args)}

    def read(a):
        return a.value if isinstance(a, Lit) else env[id(a)]

    for eqn in program.eqns:
        outs = bind(eqn.primitive, *[read(a) for a in eqn.inputs], **eqn.params)
        outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = o
    return read


def inline_program(program: GraphProgram, *args) -> list:
    """Evaluate `program` by binding each equation: stages into the current trace when an
    argument is traced, runs eagerly otherwise."""
    read = replay(program, args)
    return [read(a) for a in program.outs]
