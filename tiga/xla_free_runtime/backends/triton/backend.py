"""runtime/backends/triton: the triton backend object the backend table holds.

One object serves Triton's CUDA backend and its interpreter: both render the same source for
Kernel ops of target "triton"; which one a module runs under is fixed when the module is
imported (TRITON_INTERPRET, read by @triton.jit), so each artifact knows its backend name
(TritonModule.backend) and `launch` sets the environment from it.

plan: the route of one propagate over a relation held in memory (routes.plan asks the backend
of the call's target after a stored relation's pages); render: a `gf_kernel.launch` to Triton
source and its signature (lower/triton); compile: that
source into a module artifact of the one artifact cache; launch: the kernel functions named
in `KernelArgs.jobs`, each `(function, grid, argv, meta)`, in order on the current stream
(a launch returns once they are queued; on CUDA the results are read on the same stream).
"""
from __future__ import annotations

from ....core.config import env
from ....lower.backends import BACKENDS as RENDERERS
from ....lower.backends import selected_backend
from ....lower.triton import render_launch
from ...caches.executables import CACHE
from .compile import TritonArtifact, interpret
from .launch import backend_plan, page_kernel_plan


class Triton:
    """The triton backend: Triton kernels on torch tensors (CUDA, or CPU under the
    interpreter)."""

    target = "triton"
    artifact = TritonArtifact   # the artifact kind its compiler keeps in the one cache

    def plan(self, eqn, graph, *, compile: bool = True, held=None):
        """The route of `eqn` over `graph` (held in memory) on the selected Triton backend:
        its attention kernels or a TritonPlan rendering `held`, or a Fallback (an Unbound
        where `held` does not fit)."""
        return backend_plan(eqn, graph, compile=compile, held=held)

    def page_plan(self, backend: str, eqn, graph, held):
        """The TritonPlan of a paged run's page kernel over the page-local CSR `graph`."""
        return page_kernel_plan(backend, eqn, graph, held)

    def render(self, kernel_op, call=None, symbol: str = "kernel"):
        """The Triton source and signature of `kernel_op` (`call`: what the renderer reads
        beside the op: has_perm, relation)."""
        return render_launch(kernel_op, symbol=symbol, **(call or {}))

    def compile(self, key: str, render, backend: str | None = None):
        """The module artifact `key`: from the cache, else `render(symbol)` built; `backend`
        (default: the selected one) decides whether it is imported for the interpreter."""
        return CACHE.get(key, TritonArtifact(backend or selected_backend(), render))

    def launch(self, exe, op, args, stream=None) -> None:
        """Queue each `(function, grid, argv, meta)` of `args.jobs` (functions of `exe`'s
        module); `stream` is the current one (torch's)."""
        if env("TRITON_INTERPRET") == "1" and RENDERERS[exe.backend].interpreter:
            # (a warm interpreter call: the environment already says it, no context switch)
            for fn, grid, argv, meta in args.jobs:
                fn[grid](*argv, **meta)
            return
        with interpret(exe.backend):
            for fn, grid, argv, meta in args.jobs:
                fn[grid](*argv, **meta)


__all__ = ["Triton"]
