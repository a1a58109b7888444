"""torch_bridge: torch.func and forward-mode AD around a Tiga call (what works, what raises).

Reverse mode works under torch.func (`grad`, `vjp`, `jacrev`): functorch hands the bridge
tensors wrapped per transform level, and the bridge reads their values (the wrappers are
not differentiated by Tiga; `_PropagateFunction` is the node that functorch differentiates).
`jacrev` runs the backward under `vmap` over a batch of cotangents: the VJP program runs once
per cotangent (`batched_backward`). Forward mode (`torch.autograd.forward_ad`,
`torch.func.jvp`, `jacfwd`) and `vmap` of the forward raise `tg.UnsupportedError` naming the
alternative: no tangent is ever dropped silently.
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


def check_no_tangents(tensors, names) -> None:
    """Forward-mode AD is refused, not dropped: a dual tensor (torch.autograd.forward_ad,
    torch.func.jvp / jacfwd) among a call's operands raises before anything runs."""
    if fwAD._current_level < 0:   # no dual level entered: no tangents can exist
        return
    for t, name in zip(tensors, names):
        if isinstance(t, torch.Tensor) and fwAD.unpack_dual(t).tangent is not None:
            raise forward_mode_error(name)


def forward_mode_error(name: str) -> UnsupportedError:
    return UnsupportedError(
        f"{name}: carries a forward-mode tangent (torch.autograd.forward_ad, torch.func.jvp, "
        "jacfwd or hessian); forward-mode AD through a Tiga message-passing call is not "
        "supported (Tiga differentiates in reverse mode: its backward runs Tiga's VJP "
        "program)", hint=FORWARD_HINT)


def batched_backward(backward, grad_outs):
    """`backward(grad_outs)` when torch.func.vmap batches the cotangents (jacrev, or vmap
    over a vjp function): the VJP runs once per cotangent, and the gradients are stacked
    and returned batched at the same level. Otherwise `backward(grad_outs)` as is."""
    levels = [_F.maybe_get_level(g) for g in grad_outs
              if g is not None and _F.is_batchedtensor(g)]
    if not levels:
        return backward([None if g is None else plain(g, "output cotangent")
                         for g in grad_outs])
    level = max(levels)   # the innermost vmap; outer ones are peeled by the recursion
    columns, size = [], 0
    for g in grad_outs:
        if g is not None and _F.is_batchedtensor(g) and _F.maybe_get_level(g) == level:
            value, dim = _F._unwrap_batched(g, level)
            value = value.movedim(dim, 0)
            size = value.shape[0]
            columns.append((True, value))
        else:   # the same cotangent for every entry of the batch
            columns.append((False, g))
    per_entry = [batched_backward(backward, [v[i] if sliced else v for sliced, v in columns])
                 for i in range(size)]
    return [_F._add_batch_dim(torch.stack(list(grads)), 0, level)
            for grads in zip(*per_entry)]
