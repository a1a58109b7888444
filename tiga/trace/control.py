"""trace: structured control: tg.repeat (the repeat primitive) and bounded tg.while_loop."""
from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable

import numpy as np

from ..core.errors import ShapeError, TigaError
from ..core.prims.control import UNBOUNDED, repeat_p, while_loop_p
from ..core.program import ClosedProgram
from ..core.types import TensorType
from .math import concatenate, less, logical_and, reshape, slice_static
from .pytree import tree_flatten, tree_unflatten
from .staging import leaf_aval, leaf_value, trace_flat
from .tracer import Tracer, aval_of, bind, current_builder

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
    outs = bind_loop(ClosedProgram(prog), [leaf_value(c) for c in caps],
                     [leaf_value(x) for x in leaves], [], n, False, _current_policy())
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


# ---- scan, fori_loop and checkpoint policies ---------------------------------------------

_policy = threading.local()


def _current_policy():
    return getattr(_policy, "value", "all")


def checked_policy(policy):
    """"all" | "sqrt" | "none" | ("every", k) with k a positive int; anything else raises."""
    if policy in ("all", "sqrt", "none"):
        return policy
    if (isinstance(policy, tuple) and len(policy) == 2 and policy[0] == "every"
            and isinstance(policy[1], int) and not isinstance(policy[1], bool)
            and policy[1] >= 1):
        return policy
    raise TigaError(f"checkpoint: policy must be \"all\", \"sqrt\", \"none\" or "
                    f"(\"every\", k) with k a positive int, found {policy!r}")


def chunk_of(policy, length: int) -> int | None:
    """The steps per stored carry a policy asks of a loop of `length` steps (None: keep
    every step's carry, as a plain repeat's VJP does)."""
    if policy == "all" or length <= 2:
        return None
    if policy == "sqrt":
        k = math.isqrt(length - 1) + 1           # ceil(sqrt(length))
    elif policy == "none":
        k = (length + 1) // 2                     # halves, recursively: O(log n) carries
    else:
        k = policy[1]
    return None if k <= 1 or k >= length else k


def bind_loop(body: ClosedProgram, consts, carry, xs, length, reverse, policy="all"):
    """repeat_p of `body` over (consts, carry, xs). A checkpoint policy nests it: an outer
    loop over chunks of k steps whose body is the inner loop of one chunk, so the outer VJP
    stores one carry per chunk and the inner VJP, run per chunk in the backward pass,
    recomputes (and stores) only that chunk's carries."""
    nc, nk = len(consts), len(carry)
    k = chunk_of(policy, length)
    if k is None:
        return list(bind(repeat_p, *consts, *carry, *xs, body=body, length=length,
                         num_consts=nc, num_carry=nk, reverse=reverse))
    chunks, rest = divmod(length, k)
    inner = policy if policy == "none" else "all"
    head = [slice_static(x, (0,) + (0,) * (x_ndim(x) - 1), (chunks * k,) + x_shape(x)[1:])
            for x in xs] if rest else list(xs)
    tail = [slice_static(x, (chunks * k,) + (0,) * (x_ndim(x) - 1), x_shape(x))
            for x in xs] if rest else []
    split = [reshape(x, (chunks, k) + x_shape(x)[1:]) for x in head]

    def outer_fn(*a):
        return bind_loop(body, a[:nc], a[nc:nc + nk], a[nc + nk:], k, reverse, inner)

    avals = ([_aval(c) for c in consts] + [_aval(c) for c in carry]
             + [TensorType(x_shape(x)[1:], aval_of(x).dtype) for x in split])
    prog, caps, _ = trace_flat(outer_fn, avals)
    outer = ClosedProgram(prog)
    if not rest:
        o = bind_loop(outer, [*caps, *consts], carry, split, chunks, reverse)
        return list(o[:nk]) + [reshape(y, (length,) + x_shape(y)[2:]) for y in o[nk:]]
    if reverse:     # a reversed loop starts at the tail
        t = bind_loop(body, consts, carry, tail, rest, True, inner)
        o = bind_loop(outer, [*caps, *consts], t[:nk], split, chunks, True)
        final = o[:nk]
    else:
        o = bind_loop(outer, [*caps, *consts], carry, split, chunks, False)
        t = bind_loop(body, consts, o[:nk], tail, rest, False, inner)
        final = t[:nk]
    ys = [concatenate([reshape(y, (chunks * k,) + x_shape(y)[2:]), ty], axis=0)
          for y, ty in zip(o[nk:], t[nk:])]
    return list(final) + ys


def x_shape(x) -> tuple:
    return tuple(aval_of(x).shape)


def x_ndim(x) -> int:
    return len(aval_of(x).shape)


def _aval(v):
    t = aval_of(v)
    return t.strong() if isinstance(t, TensorType) else t


def _scan_length(x_leaves, length):
    lengths = {tuple(leaf_aval(x).shape[:1]) for x in x_leaves}
    if any(leaf_aval(x).ndim == 0 for x in x_leaves):
        raise ShapeError("scan: every leaf of xs needs a leading step axis, found a scalar")
    if len(lengths) > 1:
        raise ShapeError(f"scan: the leaves of xs differ in their leading axis: "
                         f"{sorted(n for (n,) in lengths)}")
    found = next(iter(lengths))[0] if lengths else None
    if length is None and found is None:
        raise TigaError("scan: pass xs or length (found neither)")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool)
                               or length < 0):
        raise TigaError(f"scan: length must be a non-negative Python int, found {length!r}")
    if length is not None and found is not None and length != found:
        raise ShapeError(f"scan: length={length} but xs has {found} steps")
    return found if length is None else length


def scan(body: Callable, init, xs=None, length: int | None = None, reverse: bool = False):
    """Loop `body(carry, x) -> (carry, y)` over the leading axis of `xs`, as jax.lax.scan.

    Args:
        body (Callable[[Carry, X], tuple[Carry, Y]]): one step; the carry keeps its
            structure, shapes and dtypes (a change is a tg.ShapeError at trace time).
        init (Carry): an array, or a tuple / list / dict of arrays.
        xs (X | None): arrays (a pytree) whose leading axis is the step; None: `x` is None.
        length (int | None): the number of steps; needed when xs is None.
        reverse (bool): run the steps from the last to the first (ys keep their index).

    Returns:
        tuple: `(final carry, ys)`, ys the per-step outputs stacked on a leading axis.
            Compiled as tg.repeat is, and differentiable (reverse, forward, vmap).
    """
    if _eager():
        return hooks["eager"](lambda st: scan(body, st[0], st[1], length, reverse),
                              (init, xs), (body,))
    x_leaves, x_tree = tree_flatten(xs)
    n = _scan_length(x_leaves, length)
    leaves, in_tree = tree_flatten(init)
    avals = [leaf_aval(x).strong() for x in leaves]
    rows = [TensorType(leaf_aval(x).shape[1:], leaf_aval(x).dtype) for x in x_leaves]
    trees = []

    def flat(*a):
        out = body(tree_unflatten(in_tree, list(a[:len(leaves)])),
                   tree_unflatten(x_tree, list(a[len(leaves):])))
        if not isinstance(out, tuple) or len(out) != 2:
            raise TigaError("scan: body must return a pair (carry, y), found "
                            f"{type(out).__name__}")
        c_leaves, c_tree = tree_flatten(out[0])
        y_leaves, y_tree = tree_flatten(out[1])
        trees.append((c_tree, y_tree, len(c_leaves)))
        return c_leaves + y_leaves

    prog, caps, _ = trace_flat(flat, avals + rows, top=False)
    c_tree, y_tree, n_c = trees[0]
    _check_carry(in_tree, c_tree, avals, prog.out_types[:n_c], "scan")
    outs = bind_loop(ClosedProgram(prog), [leaf_value(c) for c in caps],
                     [leaf_value(x) for x in leaves], [leaf_value(x) for x in x_leaves], n,
                     bool(reverse), _current_policy())
    return (tree_unflatten(in_tree, outs[:len(leaves)]),
            tree_unflatten(y_tree, outs[len(leaves):]))


def fori_loop(lower: int, upper: int, body: Callable, init):
    """`body(i, state) -> state` for i in range(lower, upper), as jax.lax.fori_loop with
    static bounds: a tg.scan without outputs (so differentiable). `i` is an int64 scalar.

    Args:
        lower (int), upper (int): Python ints (static); upper <= lower runs no step.
        body (Callable[[array, State], State]): one step.
        init (State): an array, or a tuple / list / dict of arrays.

    Returns:
        State: the state after the last step.
    """
    for name, v in (("lower", lower), ("upper", upper)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TigaError(f"fori_loop: {name} must be a Python int (static bounds; use "
                            f"tg.while_loop for a traced bound), found {v!r}")
    lower, upper = int(lower), int(upper)
    steps = np.arange(lower, max(upper, lower), dtype=np.int64)

    def step(state, i):
        return body(i, state), None

    return scan(step, init, steps)[0]


def checkpoint(fn: Callable, policy="sqrt") -> Callable:
    """`fn` whose tg.repeat / tg.scan / tg.fori_loop loops keep fewer carries for their
    gradient, recomputing the rest in the backward pass (rematerialisation).

    Args:
        fn (Callable): any function; the policy applies to the loops it traces.
        policy: "all" (every step's carry: the plain loop), "sqrt" (one carry per
            ceil(sqrt(n)) steps, about 2 sqrt(n) kept, one extra forward), ("every", k)
            (one per k steps plus k inside the chunk being differentiated), or "none"
            (recursive halving: O(log n) carries, O(n log n) recomputation).

    Returns:
        Callable: `fn` with the policy; values are unchanged.
    """
    policy = checked_policy(policy)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        old = _current_policy()
        _policy.value = policy
        try:
            return fn(*args, **kwargs)
        finally:
            _policy.value = old

    return wrapped
