"""runtime/backends/cpu: the cpu-llvm backend object the backend table holds.

render: a `gf_kernel.launch` to LLVM IR text and its signature (lower/llvm/render, through
lower's renderer table); compile: that text to an Executable through the one artifact cache
(a linked shared library or MCJIT object code, keyed by the printed op); launch: the
Executable's native entry over the row chunks of `KernelArgs` on the worker pool (ctypes calls
release the GIL, so chunks run in parallel).
"""
from __future__ import annotations

from ....lower.backends import BACKENDS as RENDERERS
from ...cache import CACHE
from ...threads import run_chunks, run_jobs


class CpuLLVM:
    """The cpu-llvm backend: LLVM kernels on the host's native worker pool."""

    target = "cpu-llvm"

    def render(self, kernel_op, call=None, symbol: str = "kernel"):
        """The LLVM IR text and signature of `kernel_op` (`call`: the relation layout and
        other call data its printed text does not carry)."""
        return RENDERERS["cpu-llvm"].render(kernel_op, symbol, call)

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


__all__ = ["CpuLLVM"]
