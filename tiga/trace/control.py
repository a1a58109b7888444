"""trace: structured control: tg.repeat (the repeat primitive) and bounded tg.while_loop."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.errors import ShapeError, TigaError
from ..core.prims.control import UNBOUNDED, repeat_p, while_loop_p
from ..core.program import ClosedProgram
from .math import less, logical_and
from .pytree import tree_flatten, tree_unflatten
from .staging import leaf_aval, leaf_value, trace_flat
from .tracer import Tracer, bind, current_builder

# Set by tiga/api: runs a loop called outside any trace on the compiled path (traced once per
# body and input types, like tg.grad's function), never on the reference impl rule.
hooks: dict[str, Callable | None] = {"eager": None}


def _eager() -> bool:
    return current_builder() is None and hooks["eager"] is not None


def _trace_body(fn, in_tree, avals, what):
    def flat(*xs):
        return fn(tree_unflatten(in_tree, list(xs)))

    prog, caps, out_tree = trace_flat(flat, avals, top=False)
    return prog, caps, out_tree


def _check_carry(in_tree, out_tree, in_avals, out_avals, what):
    if in_tree != out_tree:
        raise ShapeError(f"{what}: the body must return the same structure as init "
                         f"({in_tree} vs {out_tree})")
    for i, (a, b) in enumerate(zip(in_avals, out_avals)):
        if a.strong() != b.strong():
            raise ShapeError(f"{what}: carried value {i} changes type from {a} to {b}; "
                             "loop-carried shape and dtype are invariant")


def repeat(n: int, body: Callable, init):
    """Apply `body` to the state `n` times (n static): `body(state) -> state`.

    Args:
        n (int): the trip count, a non-negative Python int (part of the program).
        body (Callable[[State], State]): one iteration; it returns the structure of `init`
            with the same shapes and dtypes (a change is a tg.ShapeError at trace time).
        init (State): an array, or a tuple / list / dict of arrays.

    Returns:
        State: the state after `n` iterations. Differentiable (tg.grad, tg.vjp,
            torch).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise TigaError(f"repeat: n must be a non-negative Python int, found {n!r}")
    if _eager():
        return hooks["eager"](lambda state: repeat(n, body, state), init, (body,))
    leaves, in_tree = tree_flatten(init)
    avals = [leaf_aval(x).strong() for x in leaves]
    prog, caps, out_tree = _trace_body(body, in_tree, avals, "repeat")
    _check_carry(in_tree, out_tree, avals, prog.out_types, "repeat")
    outs = bind(repeat_p, *[leaf_value(c) for c in caps], *[leaf_value(x) for x in leaves],
                body=ClosedProgram(prog), length=n, num_consts=len(caps),
                num_carry=len(leaves), reverse=False)
    return tree_unflatten(in_tree, outs)




def _checked_bound(max_iterations):
    """A Python int (static), or the runtime value (numpy integer scalar, traced scalar)."""
    if isinstance(max_iterations, int) and not isinstance(max_iterations, bool):
        if max_iterations < 0:
            raise TigaError(f"while_loop: max_iterations must be >= 0, found {max_iterations}")
        return max_iterations
    t = leaf_aval(max_iterations) if isinstance(max_iterations, (Tracer, np.ndarray,
                                                                 np.integer)) else None
    if t is None or t.shape != () or not t.dtype.is_int:
        raise TigaError("while_loop: max_iterations must be a non-negative int (a Python int, "
                        f"a numpy integer or a traced integer scalar), found {max_iterations!r}")
    if not isinstance(max_iterations, Tracer):
        if int(max_iterations) < 0:
            raise TigaError(f"while_loop: max_iterations must be >= 0, found "
                            f"{int(max_iterations)}")
        return (int(max_iterations) if current_builder() is None else
            np.int64(max_iterations))
    return max_iterations


def _counted(cond, body, init, bound):
    """while_loop against a runtime bound: a step counter and the bound ride in the state,
    and cond also asks counter < bound (one compiled loop serves every bound)."""
    def counted_cond(state):
        return logical_and(less(state[0], state[1]), cond(state[2]))

    def counted_body(state):
        return state[0] + 1, state[1], body(state[2])

    n = bound if isinstance(bound, Tracer) else np.int64(bound)
    return while_loop(counted_cond, counted_body, (np.int64(0), n, init), UNBOUNDED)[2]


def while_loop(cond: Callable, body: Callable, init, max_iterations: int):
    """Run `body` while `cond(state)` holds, at most `max_iterations` times (bounded).

    Args:
        cond (Callable[[State], array]): a scalar boolean of the state.
        body (Callable[[State], State]): one iteration, as for `tg.repeat`.
        init (State): an array, or a tuple / list / dict of arrays.
        max_iterations (int): the bound; reaching it ends the loop without an error. A
            Python int is static inside `tg.jit` (a new value traces again); a numpy
            integer, a traced integer scalar, or any bound of an eager call is a runtime
            value: a new value runs the same compiled loop.

    Returns:
        State: the state when `cond` is false or the bound is reached. Not
            differentiable (the trip count depends on the data): use `tg.repeat`.
    """
    bound = _checked_bound(max_iterations)
    if _eager():
        # the bound travels as an argument, so a new value reuses the trace (and its kernels)
        return hooks["eager"](lambda state: while_loop(cond, body, state[0], state[1]),
                              (init, np.int64(bound)), (cond, body))
    if not isinstance(bound, int):
        return _counted(cond, body, init, bound)
    leaves, in_tree = tree_flatten(init)
    avals = [leaf_aval(x).strong() for x in leaves]
    cprog, ccaps, _ = _trace_body(cond, in_tree, avals, "while_loop cond")
    bprog, bcaps, out_tree = _trace_body(body, in_tree, avals, "while_loop body")
    _check_carry(in_tree, out_tree, avals, bprog.out_types, "while_loop")
    outs = bind(while_loop_p, *[leaf_value(c) for c in ccaps + bcaps],
                *[leaf_value(x) for x in leaves], cond=ClosedProgram(cprog),
                body=ClosedProgram(bprog), cond_nconsts=len(ccaps), body_nconsts=len(bcaps),
                max_iterations=max_iterations)
    return tree_unflatten(in_tree, outs)
