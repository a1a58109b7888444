"""trace: branches on a traced value: tg.cond and tg.switch (the cond primitive)."""
from __future__ import annotations

from collections.abc import Callable

from ..core.dtypes import int32
from ..core.errors import DTypeError, ShapeError, TigaError
from ..core.prims.control import cond_p
from ..core.program import ClosedProgram
from ..core.types import TensorType
from . import math as m
from .control import _eager, hooks
from .pytree import tree_flatten, tree_unflatten
from .staging import inline_program, leaf_aval, leaf_value, trace_flat
from .tracer import aval_of, bind


def _type(v):
    t = aval_of(v)
    return t.strong() if isinstance(t, TensorType) else t


def _trace_branches(branches, in_tree, avals, what):
    """Each branch traced on the operands; (programs, captures per branch, output tree)."""
    traced = []
    for fn in branches:
        def flat(*xs, fn=fn):
            return fn(*tree_unflatten(in_tree, list(xs)))

        prog, caps, out_tree = trace_flat(flat, avals, top=False)
        traced.append((prog, caps, out_tree))
    first_tree = traced[0][2]
    first = [t.strong() for t in traced[0][0].out_types]
    for k, (prog, _, tree) in enumerate(traced):
        found = [t.strong() for t in prog.out_types]
        if tree != first_tree or found != first:
            raise ShapeError(
                f"{what}: branch {k} returns {tree} of ({', '.join(map(str, found))}) but "
                f"branch 0 returns {first_tree} of ({', '.join(map(str, first))}); every "
                "branch must return the same structure, shapes and dtypes")
    return traced, first_tree


def _uniform(traced, avals):
    """Every branch as one program over (all captures, operands): the cond primitive hands
    every branch the same operands."""
    caps, where = [], {}
    for _, own, _ in traced:
        for c in own:
            if id(c) not in where:
                where[id(c)] = len(caps)
                caps.append(c)
    cap_types = [_type(leaf_value(c)) for c in caps]
    programs = []
    for prog, own, _ in traced:
        pick = [where[id(c)] for c in own]

        def fn(*a, prog=prog, pick=pick):
            return inline_program(prog, *[a[i] for i in pick], *a[len(caps):])

        uniform, inner, _ = trace_flat(fn, cap_types + avals)
        if inner:
            raise TigaError("cond: a branch closes over values the trace could not lift")
        programs.append(ClosedProgram(uniform))
    return [leaf_value(c) for c in caps], tuple(programs)


def switch(index, branches, *operands):
    """`branches[index](*operands)`, with `index` a traced integer scalar, as jax.lax.switch.

    An index below 0 runs branch 0 and one past the end runs the last branch (clamped, as
    JAX does), never an error at run time.

    Args:
        index (array | int): an integer scalar.
        branches (Sequence[Callable]): the functions; each returns the same structure,
            shapes and dtypes (else tg.ShapeError naming the branch).
        *operands: the arguments every branch takes (arrays, pytrees, relations).

    Returns:
        The selected branch's output. Only it runs; compiled like a loop body, eager and
        jitted alike, and differentiable (reverse, forward, vmap) through the branch taken.
    """
    branches = list(branches) if isinstance(branches, (list, tuple)) else branches
    if not isinstance(branches, list) or not branches or not all(map(callable, branches)):
        raise TigaError(f"switch: branches must be a non-empty list of callables, found "
                        f"{branches!r}")
    t = leaf_aval(index)
    if not isinstance(t, TensorType) or t.shape != ():
        raise ShapeError(f"switch: index must be a scalar, found {t}")
    if not (t.dtype.is_int or t.dtype.name == "bool"):
        raise DTypeError(f"switch: index must be an integer scalar, found {t}")
    if _eager():
        return hooks["eager"](lambda st: switch(st[0], branches, *st[1]),
                              (index, tuple(operands)), tuple(branches))
    i = m.convert(leaf_value(index), int32)
    if len(branches) > 1:
        i = m.minimum(m.maximum(i, 0), len(branches) - 1)
    return _bind_cond(i, branches, operands, "switch")


def _bind_cond(index, branches, operands, what):
    leaves, in_tree = tree_flatten(list(operands))
    avals = [_type(leaf_value(x)) for x in leaves]
    traced, out_tree = _trace_branches(branches, in_tree, avals, what)
    caps, programs = _uniform(traced, avals)
    outs = bind(cond_p, index, *caps, *[leaf_value(x) for x in leaves], branches=programs)
    return tree_unflatten(out_tree, list(outs))


def cond(pred, true_fn: Callable, false_fn: Callable, *operands):
    """`true_fn(*operands)` if `pred` else `false_fn(*operands)`, with `pred` a traced
    scalar, as jax.lax.cond. Only the branch taken runs.

    Args:
        pred (array | bool): a scalar bool (an integer scalar: nonzero is true).
        true_fn (Callable), false_fn (Callable): return the same structure, shapes and
            dtypes (else tg.ShapeError naming the branch: 0 is false_fn, 1 true_fn).
        *operands: the arguments both take.

    Returns:
        The taken branch's output; differentiable through it.
    """
    t = leaf_aval(pred)
    if not isinstance(t, TensorType) or t.shape != ():
        raise ShapeError(f"cond: pred must be a scalar, found {t} (reduce it first, e.g. "
                         "tg.math.max(err) < tol)")
    if not (t.dtype.is_int or t.dtype.name == "bool"):
        raise DTypeError(f"cond: pred must be a bool (or integer) scalar, found {t}")
    if not callable(true_fn) or not callable(false_fn):
        raise TigaError("cond: true_fn and false_fn must be callables, found "
                        f"{type(true_fn).__name__} and {type(false_fn).__name__}")
    if _eager():
        return hooks["eager"](lambda st: cond(st[0], true_fn, false_fn, *st[1]),
                              (pred, tuple(operands)), (true_fn, false_fn))
    p = leaf_value(pred)
    index = m.convert(m.not_equal(p, 0) if t.dtype.name != "bool" else p, int32)   # 0 or 1
    return _bind_cond(index, [false_fn, true_fn], operands, "cond")
