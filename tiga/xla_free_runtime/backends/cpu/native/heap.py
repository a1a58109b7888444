"""runtime/native: glibc malloc's adaptive thresholds pinned where its own heuristic ends up.

glibc serves a block above M_MMAP_THRESHOLD (128 KiB at start) with a fresh mmap and unmaps
it on free; freeing such a block raises the threshold to its size (at most 32 MiB) and the
heap-trim threshold to twice that. A call allocates its outputs and intermediates afresh
(propagate results, hoisted entity rows: a few MiB each), so whether those come back from the
heap or are faulted in page by page on every call depended on which blocks the process had
happened to free before. Measured on the EdgeNN forward (36k points, width 32): the same
program ran at 3.5 ms in some processes and 9-10 ms in others, the slow ones trimming and
regrowing the heap each call (brk) with ~1700 fresh 4 KiB page faults per call; the stored-CSR
forward at N = 32768 lost ~10% the same way.

The first call therefore sets both thresholds to the values glibc converges to on its own
after freeing one large block (mmap 32 MiB, trim 64 MiB), which ends the dependence on history.
Freed memory up to 64 MiB stays mapped for reuse, as in that converged state. Left alone:
other C libraries, a user's own MALLOC_*_ / GLIBC_TUNABLES malloc settings, and
TIGA_PIN_MALLOC=0.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20      # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def wanted(environ=os.environ) -> str | None:
    """Why the thresholds are left alone, or None when they are to be pinned."""
    if environ.get("TIGA_PIN_MALLOC", "").strip().lower() in ("0", "false", "no", "off"):
        return "TIGA_PIN_MALLOC=0"
    for name in USER_SETTINGS:
        if name in environ:
            return f"{name} is set"
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    return None


def pin() -> str:
    """Pin the thresholds (once per process is enough; repeating is harmless); says what it
    did."""
    why = wanted()
    if why is not None:
        return f"left alone: {why}"
    if not sys.platform.startswith("linux"):
        return "left alone: not Linux"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version   # noqa: B018 - glibc only (musl has no such thresholds)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "left alone: not glibc"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return "pinned" if ok else "left alone: mallopt refused"


@functools.cache    # the process-wide outcome of pin() (a setting, not a per-call value)
def pin_once() -> str:
    return pin()
