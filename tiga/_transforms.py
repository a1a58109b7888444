"""api: composes forward mode (jvp, linearize, jacfwd, jacrev, hessian), vmap and custom rules.

Each entry point traces the function once per input types (the cache tg.grad uses),
transforms the program with autodiff's rules (jvp_program, batch_program, partial
evaluation), and runs the result on the one compile path (`api.run_staged`): inlined into
an enclosing trace, so the transformations compose with each other, with tg.grad/tg.vjp
and with tg.jit.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import api, opt
from .autodiff.batching import batch_program, final_batch_moves
from .autodiff.custom import custom_jvp, custom_vjp
from .autodiff.inlining import inline_custom_calls
from .autodiff.jvp import jvp_program
from .autodiff.linearize import partial_eval
from .core.errors import ShapeError, TigaError
from .core.types import GraphType, TensorType
from .trace import math as m
from .trace.pytree import tree_flatten, tree_unflatten
from .trace.staging import leaf_aval, leaf_value
from .trace.tracer import Tracer, current_builder
from .xla_free_runtime.memory.tensor import Tensor, _wrap

_JVP = opt.ProgramFacts("vjp")   # derived programs get the passes a VJP gets


def _float_leaf(x) -> bool:
    t = leaf_aval(x)
    return isinstance(t, TensorType) and t.dtype.is_float


def _tangent_leaves(primals, tangents) -> list:
    """One tangent leaf per primal leaf (None: zero); `tangents[i]` may be None for a
    primal that is not differentiated (a relation, integers)."""
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(primals):
        raise TigaError("jvp: tangents must be a tuple with one entry per primal")
    out = []
    for p, t in zip(primals, tangents):
        p_leaves, p_tree = tree_flatten(p)
        if t is None:
            out += [None] * len(p_leaves)
            continue
        t_leaves, t_tree = tree_flatten(t)
        if t_tree != p_tree:
            raise ShapeError("jvp: each tangent must have the structure of its primal")
        for pl, tl in zip(p_leaves, t_leaves):
            if _float_leaf(pl) and tuple(leaf_aval(tl).shape) != tuple(leaf_aval(pl).shape):
                raise ShapeError(f"jvp: tangent {leaf_aval(tl)} differs in shape from its "
                                 f"primal {leaf_aval(pl)}")
            out.append(tl)
    return out


def _as_value(t, like):
    """A concrete tangent in its primal's dtype (a traced one is left as it is)."""
    if isinstance(t, Tracer):
        return t
    return np.asarray(leaf_value(t), leaf_aval(like).dtype.np)


def _jvp_programs(traced) -> tuple:
    """(jvp program, its memo): every floating leaf (not the lifted captures) gets a
    tangent binder."""
    n_caps = len(traced.caps)
    wrt = [False] * n_caps + [isinstance(t, TensorType) and t.dtype.is_float
                              for t in traced.program.in_types[n_caps:]]
    program = opt.optimize_program(jvp_program(traced.program, wrt), _JVP)[0]
    return program, {}, wrt


def jvp(fn: Callable, primals, tangents, has_aux: bool = False):
    """`y, y_dot = tg.jvp(f, primals, tangents)`: forward mode, as `jax.jvp`.

    Args:
        fn (Callable): a function of arrays (pytrees of arrays) and relations.
        primals (tuple): the point, one entry per positional argument of `fn`.
        tangents (tuple): one entry per primal, each with its primal's structure and
            shapes; None (or anything, ignored) for a relation or an integer argument.
        has_aux (bool): `fn` returns `(out, aux)`; then `(y, y_dot, aux)` is returned.

    Returns:
        tuple: `(fn(*primals), the directional derivative along tangents)`.
    """
    primals = tuple(primals)
    t_leaves = _tangent_leaves(primals, tuple(tangents))
    traced, program, memo, wrt = api._traced_for(fn, "jvp", (), has_aux, primals,
                                                 _jvp_programs)
    leaves = traced.args()[len(traced.caps):]
    seeds = []
    for w, x, t in zip(wrt[len(traced.caps):], leaves, t_leaves):
        if w:
            seeds.append(np.zeros(leaf_aval(x).shape, leaf_aval(x).dtype.np) if t is None
                         else _as_value(t, x))
    res = api.run_staged(program, traced.args() + seeds, memo)
    n = len(traced.program.out_types)
    value, aux = traced.split(res[:n])
    tangent, _ = traced.split(res[n:])
    return (value, tangent, aux) if has_aux else (value, tangent)


def linearize(fn: Callable, *primals):
    """`y, f_jvp = tg.linearize(f, *primals)`: `f_jvp(*tangents)` is the JVP at `primals`;
    what does not depend on the tangents (the forward, residuals) runs once, here."""
    traced, program, _, wrt = api._traced_for(fn, "jvp", (), False, primals, _jvp_programs)
    n = len(traced.program.out_types)
    # (a linear propagate's primal and tangent come from one walk: the unknown part
    # computes every output, the primal is the function's own forward)
    known, unknown = _linearized(program, len(program.in_binders) - sum(wrt))
    value, _ = traced.split(api.run_staged(traced.program, traced.args(), {}))
    residuals = list(api.run_staged(known, traced.args(), {})) + traced.args()
    leaves = traced.args()[len(traced.caps):]
    memo_t: dict = {}

    def f_jvp(*tangents):
        t_leaves = _tangent_leaves(primals, tangents)
        seeds = [np.zeros(leaf_aval(x).shape, leaf_aval(x).dtype.np) if t is None
                 else _as_value(t, x)
                 for w, x, t in zip(wrt[len(traced.caps):], leaves, t_leaves) if w]
        outs = api.run_staged(unknown, residuals + seeds, memo_t)
        return traced.split(outs[n:])[0]

    return value, f_jvp


@functools.lru_cache(maxsize=64)
def _linearized(program, n_in):
    unknown = [False] * n_in + [True] * (len(program.in_binders) - n_in)
    return partial_eval(program, unknown, 0)


# ---- Jacobians -----------------------------------------------------------------------------

def _argnums(argnums) -> tuple:
    return tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)


def _basis(size: int, shape: tuple, dtype) -> np.ndarray:
    return np.eye(size, dtype=dtype).reshape((size,) + tuple(shape))


def _assemble(batched, lead_shape: tuple, tail_shape: tuple, lead_last: bool):
    """(size, *tail) -> (*tail, *lead) (lead_last) or (size, *tail) -> (*lead, *tail)."""
    if lead_last:
        nd = len(tail_shape)
        moved = m.transpose(batched, tuple(range(1, nd + 1)) + (0,)) if nd else batched
        return m.reshape(moved, tuple(tail_shape) + tuple(lead_shape))
    return m.reshape(batched, tuple(lead_shape) + tuple(tail_shape))


def _single_input(args, i):
    x = args[i]
    t = leaf_aval(x)
    if isinstance(t, GraphType) or not t.dtype.is_float:
        raise TigaError(f"argument {i}: Jacobians need a floating array, found {t}")
    return x, t


def jacfwd(fn: Callable, argnums=0):
    """`tg.jacfwd(f)(*args)`: the Jacobian by forward mode, one JVP per input entry (a
    `vmap` of `jvp` over the standard basis); shape `out.shape + arg.shape`."""
    nums = _argnums(argnums)

    def jac(*args):
        jacs = [_jacfwd_one(fn, args, i) for i in nums]
        return tuple(jacs) if isinstance(argnums, (tuple, list)) else jacs[0]

    return _staged(jac, fn)


def _staged(jac: Callable, fn: Callable) -> Callable:
    """`jac` traced as one program per input types (the tg.grad cache, guarded by what
    `fn` reads) and run on the compiled path: a warm call does not trace again."""
    @functools.wraps(fn)
    def call(*args):
        if current_builder() is not None:
            return jac(*args)   # inside another transformation: trace inline
        traced, memo = api._traced_for(jac, "jacobian", (), False, args, lambda _: ({},),
                                       (fn,))
        return traced.split(api.run_staged(traced.program, traced.args(), memo))[0]

    return call


def _jacfwd_one(fn, args, i):
    x, t = _single_input(args, i)
    size = int(np.prod(t.shape))

    def push(v):
        def g(xx):
            return fn(*args[:i], xx, *args[i + 1:])
        return jvp(g, (x,), (v,))[1]

    out = vmap(push)(_basis(size, t.shape, t.dtype.np))
    leaves, tree = tree_flatten(out)
    return tree_unflatten(tree, [_assemble(o, t.shape, leaf_aval(o).shape[1:], True)
                                 for o in leaves])


def jacrev(fn: Callable, argnums=0):
    """`tg.jacrev(f)(*args)`: the Jacobian by reverse mode, one VJP per output entry (a
    `vmap` of the VJP over the standard basis); shape `out.shape + arg.shape`."""
    nums = _argnums(argnums)

    def jac(*args):
        def g(*xs):
            full = list(args)
            for i, xx in zip(nums, xs):
                full[i] = xx
            return fn(*full)

        xs = [_single_input(args, i)[0] for i in nums]
        y, pull = _pullback(g, xs)
        t_y = leaf_aval(y)
        size = int(np.prod(t_y.shape))
        rows = vmap(pull)(_basis(size, t_y.shape, t_y.dtype.np))
        jacs = [_assemble(r, t_y.shape, leaf_aval(x).shape, False) for r, x in zip(rows, xs)]
        return tuple(jacs) if isinstance(argnums, (tuple, list)) else jacs[0]

    return _staged(jac, fn)


def _pullback(fn, xs):
    """(fn(*xs), ct -> cotangents of xs) for one array output, as tg.vjp, except that the
    cotangent may be traced (a vmap over the basis traces it)."""
    nums = tuple(range(len(xs)))
    traced, program, memo_fwd, memo = api._traced_for(fn, "vjp", nums, False, xs,
                                                      api._vjp_programs)
    outs = api.run_staged(traced.program, traced.args(), memo_fwd)
    if traced.n_out != 1:
        raise TigaError("jacrev: the function must return one array")
    extra = api._cotangent_seeds(traced, traced.program.out_types, False)[traced.n_out:]

    def pull(ct):
        res = api.run_staged(program, traced.args() + [ct] + extra, memo)
        return traced.grads_tree(res, True)

    return traced.split(outs)[0], pull


def hessian(fn: Callable, argnums=0):
    """`tg.hessian(f)(*args)`: `jacfwd(jacrev(f))`, forward over reverse."""
    return jacfwd(jacrev(fn, argnums), argnums)


# ---- vmap ----------------------------------------------------------------------------------

def _leaf_axes(in_axes, args) -> list:
    """One batch axis (or None) per argument leaf; relations are never batched."""
    per_arg = in_axes if isinstance(in_axes, (tuple, list)) else [in_axes] * len(args)
    if len(per_arg) != len(args):
        raise TigaError(f"vmap: in_axes names {len(per_arg)} arguments, the function was "
                        f"called with {len(args)}")
    axes = []
    for a, ax in zip(args, per_arg):
        leaves, tree = tree_flatten(a)
        if isinstance(ax, (tuple, list, dict)):
            ax_leaves, ax_tree = tree_flatten(ax)
            if len(ax_leaves) != len(leaves):
                raise TigaError("vmap: an in_axes pytree must match its argument's structure")
        else:
            ax_leaves = [ax] * len(leaves)
        for x, k in zip(leaves, ax_leaves):
            t = leaf_aval(x)
            axes.append(None if isinstance(t, GraphType) or k is None else k % t.ndim)
    return axes


def _batch_size(leaves, axes) -> int:
    sizes = {leaf_aval(x).shape[k] for x, k in zip(leaves, axes) if k is not None}
    if len(sizes) != 1:
        raise ShapeError(f"vmap: the mapped axes must have one common size, found "
                         f"{sorted(map(str, sizes)) or 'no mapped argument'}")
    return sizes.pop()


def vmap(fn: Callable, in_axes=0, out_axes=0):
    """`tg.vmap(f, in_axes=0, out_axes=0)`: `f` mapped over an axis of its arguments, as
    `jax.vmap`. The program is batched by a rule per primitive: a propagate over batched
    fields is one propagate whose rows carry the batch (next to the features), not B.

    Args:
        fn (Callable): a function of arrays (pytrees) and relations.
        in_axes (int | None | tuple): per argument (or one for all), the mapped axis, None
            for an argument shared by every instance; relations are never mapped.
        out_axes (int | tuple): where the batch axis goes in each output (negative counts
            from the end).

    Returns:
        Callable: the batched function. A result that a propagate computed with the batch
            beside its features is that propagate's result with the batch axis moved to
            `out_axes` by a view (strided, not C-contiguous), not a copy.
    """
    @functools.wraps(fn)
    def batched(*args):
        leaves, in_tree = tree_flatten(list(args))
        axes = _leaf_axes(in_axes, args)
        size = _batch_size(leaves, axes)
        specs = tree_unflatten(in_tree, [x if k is None else _Instance(x, k)
                                         for x, k in zip(leaves, axes)])

        def derive(traced):
            n_caps = len(traced.caps)
            program = traced.program
            o_axes = _out_axes(out_axes, program)
            bprog = batch_program(program, [False] * n_caps + [a is not None for a in axes],
                                  size, [None] * n_caps + axes, o_axes)
            # run as it is, custom calls hold their function (no reference route); inlined
            # into an enclosing trace, they keep their rules for its differentiation. Run,
            # a propagate's result is returned as the kernel wrote it (batch beside the
            # features), its batch axis moved to out_axes by a view: the transpose back
            # was a full copy of the result, as long again as the batch-first input's
            # (each program its own memo of rewritten programs: they return different
            # layouts)
            run, perms = final_batch_moves(inline_custom_calls(bprog), o_axes)
            return (bprog, run, perms, {}), {}

        # traced once per (fn, per-instance types, axes), as tg.grad's function is
        what = ("vmap", tuple(axes), size, _axes_key(out_axes))
        traced, (bprog, run, perms, run_memo), memo = api._traced_for(
            fn, what, (), False, tuple(specs), derive)
        if current_builder() is not None:
            outs = api.run_staged(bprog, list(traced.caps) + leaves, memo)
        else:
            args = list(traced.caps) + leaves
            outs = api.run_staged(run, args, run_memo)
            if any(p is not None for p in perms):
                outs = _moved(outs, perms, args)
        return traced.split(outs)[0]

    return batched


def _moved(outs: list, perms: list, args: list) -> list:
    """Each output `outs[k]` with `perms[k]` applied as a view (np.transpose: strided, no
    copy), as the batched program's final transpose would have returned it by a copy. A
    copy still where the buffer is not the output's own: a paged run's result on disk (read
    to the host, as the transpose read it), or one that may share memory with an argument
    or another output (the program passes may merge two equal propagates into one)."""
    arrays = [a.numpy() if isinstance(a, Tensor) else a for a in args
              if isinstance(a, np.ndarray) or (isinstance(a, Tensor) and a.tier == "host")]
    arrays += [np.asarray(o) for o, p in zip(outs, perms)
               if p is None and getattr(o, "tier", "host") == "host"]
    res = []
    for o, p in zip(outs, perms):
        if p is None:
            res.append(o)
            continue
        own = getattr(o, "tier", "host") == "host"
        arr = np.asarray(o)
        view = np.transpose(arr, p)
        if own and not any(np.may_share_memory(arr, a) for a in arrays):
            res.append(_wrap(view))
            arrays.append(arr)
        else:
            res.append(_wrap(np.ascontiguousarray(view)))
    return res


class _Instance:
    """An argument leaf seen by one instance: its type without the mapped axis (what the
    per-instance trace and its cache key read)."""

    __slots__ = ("__tiga_type__",)

    def __init__(self, x, axis: int):
        t = leaf_aval(x)
        self.__tiga_type__ = TensorType(t.shape[:axis] + t.shape[axis + 1:], t.dtype)


def _axes_key(out_axes):
    return tuple(out_axes) if isinstance(out_axes, (tuple, list)) else out_axes


def _out_axes(out_axes, program) -> list:
    n = len(program.outs)
    per = list(out_axes) if isinstance(out_axes, (tuple, list)) else [out_axes] * n
    if len(per) != n:
        raise TigaError(f"vmap: out_axes names {len(per)} outputs, the function returns {n}")
    return [a % (t.ndim + 1) for a, t in zip(per, program.out_types)]


__all__ = ["jvp", "linearize", "jacfwd", "jacrev", "hessian", "vmap", "custom_vjp",
           "custom_jvp"]
