"""runtime/native: the native worker pool: threads created once (pthread_create on a kernel
module's `_pool_worker`, emitted by lower/llvm/pool.py) wait in native code, so a parallel
call costs one ctypes call and no Python thread wake-up. One job runs at a time; a call that
finds the pool busy (another Python thread) returns False and the caller takes the
executor path (threads.run_jobs).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

import numpy as np

WORKER_SPIN = 20000    # pause iterations (~0.1-0.5 ms) an idle worker spins before sleeping
POOL_RUN_CTYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
_NATIVE: dict = {}
_NATIVE_LOCK = threading.Lock()


def _forget_native_pool() -> None:
    """After fork the child has none of the parent's pool threads."""
    global _NATIVE_LOCK
    _NATIVE.clear()
    _NATIVE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_native_pool)


def _pool_entries(fn):
    """(pool_run ctypes function, worker address, drive address) of a loaded kernel, or
    None when its object code has no pool protocol (another platform, an old entry)."""
    found = getattr(fn, "_tiga_pool", None)
    if found is not None:
        return found or None
    try:
        from .....lower.llvm import pool as protocol
        from . import jit
        if not protocol.supported():
            raise LookupError
        names = (fn.symbol + protocol.POOL_RUN_SUFFIX, fn.symbol + protocol.POOL_WORKER_SUFFIX,
                 fn.symbol + protocol.POOL_COPY_SUFFIX)
        if fn.library is not None:
            addrs = [ctypes.cast(fn.library[n], ctypes.c_void_p).value for n in names]
        else:
            with jit._LOCK:
                addrs = [jit._init()["engine"].get_function_address(n) for n in names]
        if not all(addrs):
            raise LookupError
        found = (POOL_RUN_CTYPE(addrs[0]), addrs[1],
                 ctypes.cast(fn.drive, ctypes.c_void_p).value, addrs[2])
    except (ImportError, LookupError, AttributeError, KeyError):
        found = False
    fn._tiga_pool = found
    return found or None


def _native_state(worker: int, owner, helpers: int):
    """The shared state block with at least `helpers` worker threads started, or None."""
    from .....lower.llvm import pool as protocol
    st = _NATIVE
    if not st:
        raw = np.zeros(protocol.STATE_WORDS + 8, dtype=np.int64)
        off = (-raw.ctypes.data % 64) // 8     # the futex words on their own cache lines
        state = raw[off:off + protocol.STATE_WORDS]
        state[protocol.SPIN] = WORKER_SPIN
        st.update(raw=raw, state=state, address=state.ctypes.data, workers=0, owners=[])
    while st["workers"] < helpers:
        if not _start_worker(worker, st["address"]):
            if st["workers"] == 0:
                return None
            break
        st["workers"] += 1
        st["owners"].append(owner)    # the module whose worker loop the thread runs
        if owner.library is None:
            _pin_engine()
    return st


@functools.cache    # once per process: one reference more is enough
def _pin_engine() -> None:
    """MCJIT code: the engine must outlive interpreter shutdown, since the workers keep
    running its code until the process exits (a shared library is never unloaded by
    ctypes). Its code is loaded, so the engine exists."""
    from . import jit
    with jit._LOCK:
        engine = jit._init()["engine"]
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))


def _start_worker(worker: int, state: int) -> bool:
    try:
        libc = ctypes.CDLL(None)
        create, detach = libc.pthread_create, libc.pthread_detach
    except (OSError, AttributeError):
        return False
    create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
    detach.argtypes = [ctypes.c_ulong]
    tid = ctypes.c_ulong()
    if create(ctypes.byref(tid), None, worker, state) != 0:
        return False
    detach(tid.value)
    return True


def run_on_pool(fn, argv, threads: int, bounds: np.ndarray) -> bool:
    """Run the chunks [bounds[2i], bounds[2i+1]) through the native pool; False when it
    cannot (then nothing ran)."""
    entries = _pool_entries(fn)
    if entries is None:
        return False
    run, worker, drive, _ = entries
    lock = _NATIVE_LOCK
    if not lock.acquire(blocking=False):
        return False
    try:
        st = _native_state(worker, fn, threads - 1)
        if st is None:
            return False
        run(st["address"], drive, bounds.ctypes.data, len(bounds) // 2, argv,
            min(threads, st["workers"] + 1) - 1)
        return True
    finally:
        lock.release()


def parallel_copy(fn, dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    """dst[...] = src (same dtype and shape, both C-contiguous): on the native pool of the
    kernel `fn` when it has one, else numpy."""
    entries = _pool_entries(fn) if threads > 1 else None
    if entries is not None and _NATIVE_LOCK.acquire(blocking=False):
        try:
            st = _native_state(entries[1], fn, threads - 1)
            if st is not None:
                k = threads * 4
                cuts = (np.arange(k + 1, dtype=np.int64) * src.nbytes // k) & ~np.int64(63)
                cuts[-1] = src.nbytes
                bounds = np.stack([cuts[:-1], cuts[1:]], axis=1).reshape(-1)
                argv = (ctypes.c_void_p * 2)(dst.ctypes.data, src.ctypes.data)
                entries[0](st["address"], entries[3], bounds.ctypes.data, k, argv,
                           min(threads, st["workers"] + 1) - 1)
                return
        finally:
            _NATIVE_LOCK.release()
    np.copyto(dst, src)
