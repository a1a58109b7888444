"""runtime/backends/cpu: the cpu-llvm backend object the backend table holds.

plan: the route of one propagate over a relation held in memory (routes.plan asks the
backend of the call's target after a stored relation's pages): tiled attention, a generated
relation's fused walk, else the generic fused kernel, each binding the Kernel op it is
handed (an Unbound, a Fallback, where that op does not fit the walk it binds);

render: a `gf_kernel.launch` to LLVM IR text and its signature (lower/llvm/render, through
lower's renderer table), render_fixed: a fixed kernel by its name (the page gather's remap);
compile: that text to an Executable through the one artifact cache (a linked shared library or
MCJIT object code, keyed by the printed op); launch: the Executable's native entry over the row
chunks of `KernelArgs` on the worker pool (ctypes calls release the GIL, so chunks run in
parallel).
"""
from __future__ import annotations

import weakref

from ....core.errors import UnsupportedError
from ....lower import CPU_LLVM_AVAILABLE
from ....lower.abi import KernelSignature
from ....lower.backends import BACKENDS as RENDERERS
from ...caches.equations import kept
from ...caches.executables import CACHE, Executable, LLVMArtifact
from ...calls.threads import num_threads, run_chunks, run_jobs
from . import attention, generated
from .propagate import generic_plan


class CpuLLVM:
    """The cpu-llvm backend: LLVM kernels on the host's native worker pool."""

    target = "cpu-llvm"
    artifact = LLVMArtifact     # the artifact kind its compiler keeps in the one cache

    def plan(self, eqn, graph, *, compile: bool = True, held=None):
        """The route of `eqn` over `graph` (held in memory): an attention or generated walk's
        plan, the generic kernel's Executable (its key when compile=False), or a Fallback
        (an Unbound when `held` does not fit the walk)."""
        if not compile or graph is None:
            return _route(eqn, graph, compile, held)
        # {id(graph): (weak graph, pool threads, Executable)}: the generic kernel a warm call
        # of this propagate over this relation runs, while the cache still holds it (the
        # walk is decided by the relation's kind and layout, both fixed at its construction)
        per_eqn = kept(eqn, "cpu_routes")
        threads = num_threads()
        found = per_eqn.get(id(graph))
        if (found is not None and found[0]() is graph and found[1] == threads
                and CACHE.current(found[2])):
            return found[2]
        route = _route(eqn, graph, True, held)
        # (a generated relation changes route once it is materialised: planned every call)
        if (isinstance(route, Executable)
                and getattr(graph, "kind", None) not in generated.GENERATED_KINDS):
            if len(per_eqn) > 64:
                per_eqn.clear()
            per_eqn[id(graph)] = (weakref.ref(graph), threads, route)
        return route

    def render(self, kernel_op, call=None, symbol: str = "kernel"):
        """The LLVM IR text and signature of `kernel_op` (`call`: the relation layout and
        other call data its printed text does not carry)."""
        return RENDERERS["cpu-llvm"].render(kernel_op, symbol, call)

    def render_fixed(self, op, symbol: str = "kernel") -> tuple:
        """(LLVM IR text, signature) of a fixed kernel by its name: the page gather's
        distinct-row remap, `page_distinct_i<bits>` (lower/llvm/page_distinct)."""
        from ....lower.llvm import page_distinct

        prefix, _, bits = op.name.rpartition("_i")
        if prefix != "page_distinct" or bits not in ("32", "64"):
            raise UnsupportedError(f"cpu-llvm renders no fixed kernel named {op.name!r}")
        signature = KernelSignature(
            target="cpu-llvm", symbol=symbol, walk="dst", reduce_by="dst", slots=(),
            roles=(), field_shapes=(), field_dtypes=(), out_shapes=(), out_dtypes=(),
            index_dtype=f"int{bits}", parallel="single")
        return page_distinct.emit(symbol, int(bits)), signature

    def compile(self, key: str, render):
        """The Executable of artifact `key`: from the cache, else `render(symbol) -> (text,
        signature)` compiled (and stored)."""
        return CACHE.get(key, render)

    def launch(self, exe, op, args, stream=None) -> None:
        """Run `exe` on `args` (backends.KernelArgs); `stream` is unused on the host (a launch
        runs to completion on the pool before it returns)."""
        if args.jobs is not None:
            run_jobs(exe.native, args.jobs, args.threads)
        elif args.chunks is None:
            exe.native(args.rows[0], args.rows[1], args.argv)
        else:
            run_chunks(exe.native, args.chunks, args.argv, args.threads)


def _route(eqn, graph, compile: bool, held):
    """Tiled attention or a generated relation's fused walk where one claims the equation,
    else the generic fused kernel."""
    if graph is not None and CPU_LLVM_AVAILABLE:
        for planner in (attention.plan_attention, generated.plan_generated):
            found = planner(eqn, graph, compile, held)
            if found is not None:
                return found
    return generic_plan(eqn, graph, compile=compile, held=held)


__all__ = ["CpuLLVM"]
