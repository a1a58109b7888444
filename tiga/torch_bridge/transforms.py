"""torch_bridge: how torch.func and forward-mode AD see a Tiga call (what the bridge reads).

functorch hands the bridge tensors wrapped per transform level: a grad or jvp level wraps
the value (`plain` reads it), a vmap level batches it. A call whose operands are batched
(torch.func.vmap, jacrev / jacfwd's batched cotangents and tangents), carry a forward-mode
tangent (torch.autograd.forward_ad, torch.func.jvp / jacfwd) or are differentiated by
several nested levels (hessian, grad of grad) runs as a `_ProgramFunction` node
(autograd.py), whose `vmap`, `jvp` and `backward` staticmethods run Tiga's own batching,
JVP and VJP rules on the call's program: each transformation is another Tiga program, run
by the same node, so they nest as far as torch nests them. The staging of such a call reads
only the per-instance types of its batched operands (`staging_types`).
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.autograd.forward_ad as fwAD

from ..core.errors import UnsupportedError

_F = torch._C._functorch

VMAP_HINT = ("batch the fields, features or parameters of a call instead: a relation (a "
             "tg.Graph, an edge_index) is never batched; put a batch of graphs into one "
             "relation (a disjoint union, tg.Graph.batch, as PyG batches graphs), or call the "
             "layer once per graph in a Python loop")

_LOCAL = threading.local()


def vmap_error(name: str) -> UnsupportedError:
    return UnsupportedError(
        f"{name}: is batched by torch.func.vmap where the Tiga call needs one value for "
        "every instance of the batch (it is read as a relation or while building one)",
        hint=VMAP_HINT)


@contextlib.contextmanager
def staging_types():
    """While a call is staged: a tensor batched by vmap reads as zeros of its per-instance
    shape (staging reads types only; the values come through the node's operands)."""
    old = getattr(_LOCAL, "placeholders", False)
    _LOCAL.placeholders = True
    try:
        yield
    finally:
        _LOCAL.placeholders = old


def plain(t: torch.Tensor, name: str) -> torch.Tensor:
    """The value under torch.func's grad / jvp wrappers (what the Tiga kernels read); a
    tensor batched by vmap raises (dropping its batch wrapper would change its meaning),
    except while a call is staged (`staging_types`), where it reads as zeros of its
    per-instance shape."""
    shape, dtype = tuple(t.shape), t.dtype
    while _F.is_functorch_wrapped_tensor(t):
        if _F.is_batchedtensor(t):
            if getattr(_LOCAL, "placeholders", False):
                with torch._C._DisableFuncTorch():
                    return torch.zeros((), dtype=dtype).expand(shape)
            raise vmap_error(name)
        t = _F.get_unwrapped(t)
    return t


def transform_depth(t) -> tuple:
    """(whether some vmap level batches `t`, how many grad / jvp levels wrap it)."""
    batched, depth = False, 0
    while isinstance(t, torch.Tensor) and _F.is_functorch_wrapped_tensor(t):
        if _F.is_batchedtensor(t):
            batched = True
        else:
            depth += 1
        t = _F.get_unwrapped(t)
    return batched, depth


def has_tangent(t) -> bool:
    """Whether `t` carries a forward-mode tangent at the current dual level."""
    return (isinstance(t, torch.Tensor) and fwAD._current_level >= 0 and
            fwAD.unpack_dual(t).tangent is not None)


def needs_program_node(tensors) -> bool:
    """Whether a call on these operands must run as a `_ProgramFunction` node: an operand
    batched by vmap (at any level), a forward-mode tangent, or two or more nested
    torch.func levels (hessian, grad of grad: operands may each sit at one of them). Plain
    eager autograd and one torch.func.grad / vjp level run as `_PropagateFunction` (its
    backward reuses the forward's residuals)."""
    if len(_F.get_interpreter_stack() or ()) > 1:
        return True
    for t in tensors:
        if isinstance(t, torch.Tensor) and (transform_depth(t)[0] or has_tangent(t)):
            return True
    return False


def backward_differentiated(inputs, cts) -> bool:
    """Whether a backward computed from these saved inputs and cotangents may itself be
    differentiated: grad mode is on and one of them requires grad as a plain tensor (eager
    create_graph=True), or under a live torch.func level other than the one the node was
    recorded at (its inputs' level: torch.func.grad / vjp differentiate there once, with
    create_graph on by convention), e.g. grad over a vjp function's cotangent."""
    if not torch.is_grad_enabled():
        return False
    live = {i.level() for i in (_F.get_interpreter_stack() or ())}
    own = {_F.maybe_get_level(t) for t in inputs
           if isinstance(t, torch.Tensor) and _F.is_functorch_wrapped_tensor(t)}
    for t in list(inputs) + list(cts):
        if not isinstance(t, torch.Tensor) or not t.requires_grad:
            continue
        if not _F.is_functorch_wrapped_tensor(t) or transform_depth(t)[1] > 1:
            return True
        level = _F.maybe_get_level(t)
        if level not in own and level in live:
            return True
    return False
