"""runtime: the kernel thread pool and destination-row chunks balanced by edge count.

Kernels are called through ctypes, which releases the GIL, so a plain thread pool runs
row chunks in parallel. A kernel with a chunk loop (`<kernel>_drive`) is entered once per
thread: the caller and threads-1 pool workers claim chunks with an atomic counter inside
native code, so no chunk waits for the GIL; where the kernel module carries the native pool
protocol (emitted by lower/llvm/pool.py, run by native/pool.py) the helpers are native
threads waiting in native code, and a
parallel call is a single ctypes call. Other callables pull chunks from a shared Python
iterator. Each call waits only on its own helpers (and always for all of them, since they read
the caller's arrays), so several Python threads may launch kernels at once. TIGA_NUM_THREADS
(default: all cores) sets the pool size.
"""
from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...core.config import env, env_num_threads
from ...core.errors import TigaError
from ...lower.schedule import CHUNKS_PER_THREAD, PARALLEL_MIN_WORK
from ..backends.cpu.native.pool import run_on_pool

# (the chunking decisions are the launch schedule's: lower/schedule.py explains them)
SMALL_WORK = PARALLEL_MIN_WORK

_LOCK = threading.Lock()
_POOL: dict = {}


class _PerThread(threading.local):
    """What one thread keeps: the pool size of the call running on it and its work arrays."""

    # (a class default: getattr(local, name, None) on a missing attribute raises and catches
    # an AttributeError inside, ~0.7 us, and a warm call asks several times)
    n: int | None = None

    def __init__(self):     # (run once in each thread that uses it)
        self.arrays = {}


_THREAD = _PerThread()


def work_arrays() -> dict:
    """This thread's reusable work arrays, keyed by (owner, role) (attention's backward, the
    page gather's mark array, O_DIRECT staging): kept between calls, since fresh multi-MiB
    allocations come back from the OS untouched and their first-touch page faults measured a
    large part of those kernels' time. Their contents are never read across calls."""
    return _THREAD.arrays


def num_threads() -> int:
    """TIGA_NUM_THREADS (default: all cores), capped at 4 x the cores with a warning; the
    kernel schedule (lower/passes/select_kernel_schedule.py) reads the same value. Inside
    `pin_threads` the value read when the call started."""
    n = _THREAD.n
    if n is not None:
        return n
    return _parsed(env("TIGA_NUM_THREADS"))


# parsed once per value of TIGA_NUM_THREADS (the key; env_num_threads reads the same
# variable): a bad one raises every time (lru_cache keeps no exception), a capped one warns once
@functools.lru_cache(maxsize=64)
def _parsed(raw) -> int:
    return env_num_threads(TigaError)


def pin_threads() -> int | None:
    """Read the pool size once for a call on this thread (a warm call asks for it several
    times: kernel variant, schedule, staging); returns what `unpin_threads` restores."""
    before = _THREAD.n
    if before is None:
        _THREAD.n = num_threads()
    return before


def unpin_threads(before: int | None) -> None:
    """Undo the matching `pin_threads` (an outer call's pin stays)."""
    _THREAD.n = before


def pool(threads: int) -> ThreadPoolExecutor:
    """One shared executor per size (recreated when TIGA_NUM_THREADS changes)."""
    with _LOCK:
        if _POOL.get("size") != threads:
            old = _POOL.get("pool")
            _POOL.update(size=threads, pool=ThreadPoolExecutor(threads, "tiga-kernel"))
            if old is not None:
                old.shutdown(wait=False)
        return _POOL["pool"]


class RowChunks(list):
    """row_chunks' [(begin, end), ...] (never changed once made), with the int64 bounds
    array the native pool reads, made on its first parallel run (_bounds)."""

    bounds: np.ndarray | None = None


def row_chunks(row_ptr: np.ndarray, threads: int, partition: str = "edge-balanced",
               per_thread: int = CHUNKS_PER_THREAD) -> RowChunks:
    """[(begin, end), ...] covering every row: about `threads * per_thread` chunks of the
    same rows + edges ("edge-balanced") or the same rows ("row-balanced"); one chunk when
    the rows + edges are below SMALL_WORK or there is one thread."""
    n = len(row_ptr) - 1
    work = int(row_ptr[-1]) + n if n > 0 else 0
    if n <= 0:
        return RowChunks()
    if threads <= 1 or work < SMALL_WORK:
        return RowChunks([(0, n)])
    k = min(n, threads * per_thread)
    if partition == "row-balanced":
        cuts = (np.arange(1, k, dtype=np.int64) * n) // k
        bounds = [0] + [c for c in cuts.tolist() if 0 < c < n] + [n]
        return RowChunks((a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a)
    if partition != "edge-balanced":
        raise TigaError(f"row_chunks: partition must be 'edge-balanced' or 'row-balanced', "
                        f"found {partition!r}")
    cost = np.asarray(row_ptr[1:], dtype=np.int64) + np.arange(1, n + 1, dtype=np.int64)
    targets = (np.arange(1, k, dtype=np.int64) * work) // k
    # (sorted already: np.unique would import numpy.ma, ~15 ms on a first call)
    cuts = np.searchsorted(cost, targets, side="left") + 1
    bounds = [0]
    for c in cuts.tolist():
        if bounds[-1] < c < n:
            bounds.append(c)
    bounds.append(n)
    return RowChunks((a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a)


def run_chunks(fn, chunks: list, argv, threads: int) -> None:
    """Call fn(begin, end, argv) for every chunk; in parallel when there are several."""
    if (len(chunks) > 1 and threads > 1 and getattr(fn, "drive", None) is not None and
            run_on_pool(fn, argv, threads, _bounds(chunks))):
        return
    run_jobs(fn, [(a, b, argv) for a, b in chunks], threads)


def run_jobs(fn, jobs: list, threads: int) -> None:
    """Call fn(begin, end, argv) for every (begin, end, argv) job, on the pool when several."""
    if not jobs:
        return
    if len(jobs) == 1 or threads <= 1:
        for a, b, argv in jobs:
            fn(a, b, argv)
        return
    drive = getattr(fn, "drive", None)
    if drive is not None and all(j[2] is jobs[0][2] for j in jobs):
        bounds = np.array([(a, b) for a, b, _ in jobs], dtype=np.int64).reshape(-1)
        if not run_on_pool(fn, jobs[0][2], threads, bounds):
            _run_native_loop(drive, jobs, threads)
        return
    # The caller works too, and every thread pulls the next job from one shared iterator
    # (a list iterator's next() is atomic under the GIL): one pool task per helper thread
    # instead of one future per job, and faster threads take more chunks.
    pending = iter(jobs)

    def drain():
        for a, b, argv in pending:
            fn(a, b, argv)

    helpers = [pool(threads).submit(drain) for _ in range(min(threads, len(jobs)) - 1)]
    try:
        drain()
    finally:
        # never return (or raise) while a helper may still run a kernel on the caller's arrays
        errors = [f.exception() for f in helpers]
    for exc in errors:
        if exc is not None:
            raise exc


def _run_native_loop(drive, jobs: list, threads: int) -> None:
    """One native call per thread into the kernel's chunk loop (see kernel.emit_chunk_driver):
    chunks are claimed with an atomic counter, so no thread needs the GIL between chunks."""
    bounds = np.array([(a, b) for a, b, _ in jobs], dtype=np.int64)
    counter = np.zeros(1, dtype=np.int64)
    argv = jobs[0][2]
    args = (bounds.ctypes.data, len(jobs), counter.ctypes.data, argv)
    helpers = [pool(threads).submit(drive, *args) for _ in range(min(threads, len(jobs)) - 1)]
    try:
        drive(*args)
    finally:
        errors = [f.exception() for f in helpers]   # bounds/counter/argv outlive every call
    for exc in errors:
        if exc is not None:
            raise exc


def _bounds(chunks) -> np.ndarray:
    """The chunks' (begin, end) pairs as one int64 array for the native pool: kept on the
    chunk list row_chunks made (those are cached per relation and schedule)."""
    if type(chunks) is RowChunks:
        found = chunks.bounds
        if found is None:
            found = chunks.bounds = np.array(chunks, dtype=np.int64).reshape(-1)
        return found
    return np.array(chunks, dtype=np.int64).reshape(-1)
