"""runtime/paging: a page's distinct-row remap in native code (issue 28 item 1).

A page reads each distinct source row once: paging.distinct.distinct() turns its column ids
into the sorted distinct ids and each id's position among them. `marked` does it with one
native kernel (lower/llvm/page_distinct: clear, mark, rank, remap; the cpu-llvm backend renders
it) over a scratch array each thread keeps from page to page, writing the positions where the
caller says (the page's own id buffer: in place); numpy's way makes about ten passes and as
many fresh temporaries (measured per page of 1M edges in benchmarks/PAGING_NOTES.md). The
kernel is compiled once per index width through an executable cache of its own (the propagate
kernels' statistics stay theirs) and kept on disk like them; where it cannot be built, `marked`
returns None and the caller keeps numpy's way.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ...core.errors import CompilationError
from ..backends import FixedKernel, KernelArgs, backend_for, launch
from ..caches.executables import full_key
from ..calls.threads import work_arrays

KEY = ("paging.page_distinct", 1)     # the kernel's own part of the cache key
KEEP_ENTRIES = 1 << 24                # larger scratch is made per call, not kept by a thread
_LOCK = threading.Lock()


def kernel_name(bits: int) -> str:
    """The name of the page gather kernel for ids of `bits` bits (the Task module lists it on
    the page tasks that run it)."""
    return f"page_distinct_i{bits}"


@functools.cache     # per id width: the Executable, or None (not buildable)
def kernel(bits: int):
    """The compiled page_distinct for ids of `bits` bits, built (or read from disk) once;
    None where it cannot be (no LLVM, a failed build): numpy's way then."""
    op = FixedKernel(kernel_name(bits))
    with _LOCK:     # (threads racing on a first page build it once: CACHE holds it after)
        try:
            backend = backend_for(op.target)       # (it renders its fixed kernels by name)
            exe = backend.compile(full_key(KEY + (bits,)),
                                  lambda symbol: backend.render_fixed(op, symbol))
            if exe.kernel is None:
                exe.kernel = op
            return exe
        except (ImportError, CompilationError, OSError):
            return None


def _scratch(span: int, dtype: np.dtype) -> np.ndarray:
    """`span` entries of this thread's mark array (kept between pages: no fresh pages to
    fault in per page), or a fresh one past KEEP_ENTRIES."""
    if span > KEEP_ENTRIES:
        return np.empty(span, dtype)
    have = work_arrays()
    held = have.get(("page-gather", "mark"))
    if held is None or held.dtype != dtype or len(held) < span:
        held = have["page-gather", "mark"] = np.empty(span + span // 8, dtype)
    return held[:span]


def marked(ids: np.ndarray, lo: int, span: int, index_dtype, out=None) -> tuple | None:
    """(sorted distinct ids as int64, each id's position among them in `index_dtype`) of
    `ids`, every one in [lo, lo + span), by the native kernel; positions go to `out` when
    given (`ids` itself: in place). None when the kernel cannot run here (ids not a
    contiguous array of the index dtype, int32 or int64; no kernel)."""
    dt = np.dtype(index_dtype)
    if (ids.dtype != dt or dt not in (np.dtype(np.int32), np.dtype(np.int64)) or
            not ids.flags.c_contiguous or (out is not None and (
                out.dtype != dt or len(out) < len(ids) or not out.flags.c_contiguous))):
        return None
    exe = kernel(dt.itemsize * 8)
    if exe is None:
        return None
    mark = _scratch(span, dt)
    uniq = np.empty(min(span, len(ids)), np.int64)   # (untouched pages cost nothing)
    inv = np.empty(len(ids), dt) if out is None else out[:len(ids)]
    count = np.zeros(1, np.int64)
    argv = (ctypes.c_void_p * 8)(ids.ctypes.data, len(ids), lo, span, mark.ctypes.data,
                                 uniq.ctypes.data, inv.ctypes.data, count.ctypes.data)
    launch(exe, exe.kernel, KernelArgs(argv))
    return uniq[:int(count[0])], inv


__all__ = ["marked", "kernel", "kernel_name"]
