"""torch_bridge: a sum of source rows per destination (GIN's aggregation, global_add_pool) as
one torch autograd node: the bucketed padding (buckets.py), the Tiga propagate, the slice of
the real destinations and GIN's root term (1 + eps) x_i, forward and backward (issue 40).

Through the general path the same computation is five torch nodes around the Tiga call (the
padding `cat`, the call, the slice, the root's `mul` and `add`), each with its own
allocation, autograd bookkeeping and backward, plus the bridge's per-call work (the call
object, the call cache's key, the operand checks): about as much host time as the kernels of
a batch of 128 molecules. Here the call's program and VJP are looked up once per relation
and row shape (`_plan`), and a call runs them on the padded rows directly.

The results are the general path's, bit for bit: the same programs on the same padded rows
(copied into 64-byte aligned torch memory, as the `cat` was), the real rows sliced off, the
root term added after the sum as `out + (1 + eps) * x` (skipping the product where eps is
0: 1 * x is x), and in the backward the two gradients of x added (a sum of two terms, which
the autograd engine's accumulation gives in either order). Anything else (another reducer,
a device tensor, torch.func transforms, forward-mode AD, a trainable eps, a dtype other
than float32/float64, no rows) returns None and runs the general path.
"""
from __future__ import annotations

import numpy as np
import torch
import torch._C._functorch as _F
import torch.autograd.forward_ad as fwAD

from ...trace import call_cache
from ...xla_free_runtime.caches.relations import memo
from ...xla_free_runtime.executor import execute
from ..autograd import _prepare, _Run
from .buckets import bucketed, padded_relation
from .common import source_reducer

_DTYPES = (torch.float32, torch.float64)
STATS = {"forward": 0, "backward": 0}    # calls that took this path (tests count them)


def summed(graph, x: torch.Tensor, eps: torch.Tensor | None = None,
           pad: bool | None = None) -> torch.Tensor | None:
    """sum_{j -> i} x_j per destination of `graph` (+ (1 + eps) x_i where eps is given: x is
    then the destination rows too), as the general path computes it, or None where this
    path does not apply (see the module docstring). pad: run at bucketed counts (None:
    `bucketed(graph)`)."""
    if not _plain(x) or eps is not None and not _plain_eps(eps, x):
        return None
    pad = bucketed(graph) if pad is None else pad
    if pad:
        rel, rows, n_dst = padded_relation(graph)
    else:
        rel, rows, n_dst = graph, graph.num_src, graph.num_dst
    if x.size(0) != graph.num_src or eps is not None and graph.num_dst != graph.num_src:
        return None
    grad = torch.is_grad_enabled() and x.requires_grad
    plan = _plan(rel, rows, tuple(x.shape[1:]), x.dtype, grad)
    if plan is None:
        return None
    one = eps is None or float(eps) == 0.0     # (the root term is then x itself)
    root = None if eps is None else (x.detach() if one else x.detach() * (1 + eps))
    STATS["forward"] += 1
    if not grad:
        return _forward(plan, x.detach(), n_dst, root)[0]
    return _Summed.apply(plan, x, n_dst, root, None if one else 1 + eps)


def _plain(x) -> bool:
    return (type(x) in (torch.Tensor, torch.nn.Parameter) and x.is_cpu and x.dtype in _DTYPES
            and x.layout is torch.strided and x.dim() >= 2 and x.numel() > 0
            and not x.is_conj() and not x.is_neg()
            and _F.peek_interpreter_stack() is None and fwAD._current_level < 0)


def _plain_eps(eps, x) -> bool:
    return (type(eps) in (torch.Tensor, torch.nn.Parameter) and eps.is_cpu and
            eps.numel() == 1 and eps.dtype == x.dtype and
            not (eps.requires_grad and torch.is_grad_enabled()))


class _Plan:
    """A relation's sum call at one row shape: its program, and (where x requires grad) the
    forward returning its residuals and the VJP program (autograd._Run's)."""

    __slots__ = ("rel", "rows", "program", "forward", "vjp", "generation", "out_dtype")


def _plan(rel, rows: int, tail: tuple, dtype, grad: bool) -> _Plan | None:
    """The plan of sum calls over `rel` (rows source rows of shape `tail`), staged by the
    bridge's general route once and kept on the relation until the call cache is cleared."""
    kept = memo(rel)
    key = ("summed", tail, dtype, grad)
    plan = kept.get(key)
    if plan is not None and plan.generation == call_cache.CLEARS[0]:
        return plan
    generation = call_cache.CLEARS[0]
    x = torch.zeros((rows,) + tail, dtype=dtype).requires_grad_(grad)
    call = source_reducer("sum")._call(rel, {"x": x}, None, None, {})
    with torch.enable_grad():
        program, np_args, originals, vjps = _prepare(call)
        if len(originals) != 2 or len(program.outs) != 1:   # (captured values: general path)
            return None
        run = _Run(program, np_args, originals, "auto", vjps, None)
    plan = _Plan()
    plan.rel, plan.rows, plan.program = rel, rows, program
    plan.out_dtype = program.out_types[0].dtype.np
    plan.forward = plan.vjp = None
    if grad:
        forward, vjp, reads, _ = run._derived()
        if reads[0] or len(forward.outs) != 1:    # (the VJP reads the output, or residuals)
            return None
        plan.forward, plan.vjp = forward, vjp
    # (a guard-free built-in call: valid until the call cache is cleared, whatever else
    # it stores or evicts)
    plan.generation = generation
    kept[key] = plan
    return plan


def _padded(x: torch.Tensor, rows: int) -> np.ndarray:
    """x's rows followed by zero rows up to `rows`, in fresh 64-byte aligned torch memory
    (what the padding `cat` allocated; a misaligned gathered field is copied again by the
    runtime), as a numpy array."""
    if x.size(0) == rows and x.is_contiguous():
        return x.numpy()
    out = torch.empty((rows,) + tuple(x.shape[1:]), dtype=x.dtype)
    out[:x.size(0)].copy_(x)
    out[x.size(0):].zero_()
    return out.numpy()


def _forward(plan: _Plan, x: torch.Tensor, n_dst: int, root, program=None) -> tuple:
    """(the sum's real rows + root, as torch, the padded operands, the padded output)."""
    args = [plan.rel, _padded(x, plan.rows)]
    out = np.asarray(execute(plan.program if program is None else program, args)[0],
                     plan.out_dtype)
    # (a numpy slice: a torch view made inside the Function could not be changed in place)
    result = torch.from_numpy(out[:n_dst])
    if root is not None:
        result.add_(root)     # (a fresh output the VJP does not read: in place)
    return result, args, out


class _Summed(torch.autograd.Function):
    """summed() where x requires grad: one node, the VJP program in its backward."""

    @staticmethod
    def forward(ctx, plan, x, n_dst, root, scale):
        result, args, out = _forward(plan, x.detach(), n_dst, root, plan.forward)
        ctx.plan, ctx.args, ctx.out, ctx.scale = plan, args, out, scale
        ctx.n_src, ctx.root = x.size(0), root is not None
        return result

    @staticmethod
    def backward(ctx, g):
        plan = ctx.plan
        STATS["backward"] += 1
        g = g.detach()
        ct = _padded(g, ctx.out.shape[0]) if g.size(0) != ctx.out.shape[0] else (
            np.ascontiguousarray(g.numpy()))
        grads = execute(plan.vjp, ctx.args + [ct, ctx.out])
        arr = np.asarray(grads[0], ctx.out.dtype)
        gx = torch.from_numpy(arr[:ctx.n_src])
        if ctx.root:
            term = g if ctx.scale is None else g * ctx.scale
            # (in place on the VJP's fresh output; a copy where it is not one)
            fresh = arr.flags.writeable and not np.may_share_memory(arr, ct)
            gx = gx.add_(term) if fresh else gx + term
        return None, gx, None, None, None


__all__ = ["summed"]
