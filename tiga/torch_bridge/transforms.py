"""torch_bridge: torch.func and forward-mode AD around a Tiga call (what works, what raises).

Both modes work, first order: functorch hands the bridge tensors wrapped per transform
level, and the bridge reads their values (`plain`); `_PropagateFunction` is the node that
torch differentiates. Reverse mode (`grad`, `vjp`, `jacrev`) runs Tiga's VJP program;
forward mode (`torch.autograd.forward_ad`, `torch.func.jvp`, `jacfwd`) runs the VJP of that
VJP program in its cotangents (`_Run.jvp`). `jacrev` / `jacfwd` batch the cotangents /
tangents with vmap: the program runs once per batch entry (`batched`). `vmap` of the
forward, second derivatives and forward mode on the GPU route raise `tg.UnsupportedError`
naming the alternative: no tangent is ever dropped silently.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from ..core.errors import UnsupportedError

_F = torch._C._functorch

VMAP_HINT = ("batch along the entity axis instead: put the batch's graphs into one relation "
             "(a disjoint union, as PyG batches graphs), or give the fields a trailing batch "
             "axis; or call the layer once per sample in a Python loop")
FORWARD_HINT = ("differentiate in reverse mode: loss.backward(), torch.autograd.grad, "
                "torch.func.grad, torch.func.vjp or torch.func.jacrev (a Jacobian of a Tiga "
                "call comes from jacrev, not jacfwd)")


SECOND_HINT = ("take first derivatives only (torch.func.grad, vjp, jvp, jacrev or jacfwd), or "
               "nest tg.grad / tg.vjp on numpy or tg.Tensor inputs")


def vmap_error(name: str) -> UnsupportedError:
    return UnsupportedError(
        f"{name}: is batched by torch.func.vmap; vmap over a Tiga message-passing call is "
        "not supported (its kernels walk one relation per call)", hint=VMAP_HINT)


def plain(t: torch.Tensor, name: str) -> torch.Tensor:
    """The value under torch.func's grad wrappers (what the Tiga kernels read); a tensor
    batched by vmap raises, since dropping its batch wrapper would change its meaning."""
    while _F.is_functorch_wrapped_tensor(t):
        if _F.is_batchedtensor(t):
            raise vmap_error(name)
        t = _F.get_unwrapped(t)
    return t


def check_first_order(tensors, names) -> None:
    """A tensor wrapped by two nested torch.func differentiation levels (hessian, grad of
    grad, jacfwd of jacrev) asks for a second derivative: refused here, before functorch
    would reach the Tiga node's backward from inside another transform."""
    for t, name in zip(tensors, names):
        depth = 0
        while isinstance(t, torch.Tensor) and _F.is_functorch_wrapped_tensor(t):
            depth += not _F.is_batchedtensor(t)
            t = _F.get_unwrapped(t)
        if depth > 1:
            raise UnsupportedError(
                f"{name}: is differentiated by {depth} nested torch.func transforms (a "
                "second derivative: hessian, grad of grad, jacfwd of jacrev); a Tiga "
                "message-passing call has first derivatives only", hint=SECOND_HINT)


def check_no_tangents(tensors, names) -> None:
    """Forward-mode AD is refused, not dropped: a dual tensor (torch.autograd.forward_ad,
    torch.func.jvp / jacfwd) among a call's operands raises before anything runs."""
    if fwAD._current_level < 0:   # no dual level entered: no tangents can exist
        return
    for t, name in zip(tensors, names):
        if isinstance(t, torch.Tensor) and fwAD.unpack_dual(t).tangent is not None:
            raise forward_mode_error(name)


def has_tangent(t) -> bool:
    """Whether `t` carries a forward-mode tangent at the current dual level."""
    return fwAD._current_level >= 0 and fwAD.unpack_dual(t).tangent is not None


def forward_mode_error(name: str) -> UnsupportedError:
    return UnsupportedError(
        f"{name}: carries a forward-mode tangent (torch.autograd.forward_ad, torch.func.jvp, "
        "jacfwd or hessian); forward-mode AD through a Tiga message-passing call is not "
        "supported (Tiga differentiates in reverse mode: its backward runs Tiga's VJP "
        "program)", hint=FORWARD_HINT)


def batched(fn, values, what: str):
    """`fn(values)` when torch.func.vmap batches the cotangents or tangents (jacrev /
    jacfwd, or vmap over a vjp / jvp function): `fn` runs once per batch entry, and its
    results are stacked and returned batched at the same level. Otherwise `fn(values)`."""
    values = [None if g is None else _peel(g) for g in values]
    levels = [_F.maybe_get_level(g) for g in values
              if g is not None and _F.is_batchedtensor(g)]
    if not levels:
        return fn([None if g is None else plain(g, what) for g in values])
    level = max(levels)   # the innermost vmap; outer ones are peeled by the recursion
    columns, size = [], 0
    for g in values:
        if g is not None and _F.is_batchedtensor(g) and _F.maybe_get_level(g) == level:
            value, dim = _F._unwrap_batched(g, level)
            value = value.movedim(dim, 0)
            size = value.shape[0]
            columns.append((True, value))
        else:   # the same cotangent for every entry of the batch
            columns.append((False, g))
    per_entry = [batched(fn, [v[i] if sliced else v for sliced, v in columns], what)
                 for i in range(size)]
    return [_F._add_batch_dim(torch.stack(list(grads)), 0, level)
            for grads in zip(*per_entry)]


def _peel(t):
    """`t` without the grad wrappers above its outermost vmap batch (or its plain value)."""
    while _F.is_functorch_wrapped_tensor(t) and not _F.is_batchedtensor(t):
        t = _F.get_unwrapped(t)
    return t
