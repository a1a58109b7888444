"""core: numpy's OpenBLAS held to one thread around Tiga's own small entity-level products.

After a threaded call, OpenBLAS helper threads keep spinning for a long while (its
OPENBLAS_THREAD_TIMEOUT, about 2^28 cycles by default). Tiga runs its native kernel pool right
after such a product, so on a machine with few cores the spinning helpers take the cores the
kernel threads need: the EdgeNN step ran 1.5x slower with numpy's default two BLAS threads than
with one, with stalls to 100 ms. The tall-skinny (entities x features) products edge MLPs hoist
are memory-bound and gain nothing from a second BLAS thread below about 2^28 multiply-adds, so
those run on the caller's thread alone. The count is set through OpenBLAS's own API and restored
when the product returns, so the user's setting holds everywhere outside Tiga's calls (a numpy
product another Python thread runs at that same moment also gets one thread).
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

ONE_THREAD_BELOW = 1 << 28    # multiply-adds under which a second BLAS thread does not pay

_LOCK = threading.Lock()
_STATE: dict = {"found": None, "depth": 0, "saved": ()}
# numpy wheels bundle scipy-openblas (symbols prefixed, 64-bit ints suffixed "64_"); other
# builds link a plain libopenblas
_NAMES = [(f"{p}_get_num_threads{s}", f"{p}_set_num_threads{s}")
          for p in ("scipy_openblas", "openblas") for s in ("64_", "")]


def _libraries() -> list:
    """Every OpenBLAS the process has loaded (numpy's among them), as ctypes libraries; empty
    where that cannot be told (no /proc/self/maps) or none is loaded."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f
                     if line.count(" ") >= 5 and "openblas" in line.rsplit("/", 1)[-1].lower()}
    except (OSError, IndexError):
        return []
    libs = []
    for path in sorted(p for p in paths if os.path.isabs(p)):
        try:
            # RTLD_NOLOAD: only a library already mapped, never a second copy
            libs.append(ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY))
        except OSError:
            continue
    return libs


def _loaded_openblas() -> list:
    """[(get, set)] of the process-wide thread count of every loaded OpenBLAS."""
    found = []
    for lib in _libraries():
        for get_name, set_name in _NAMES:
            try:
                get, put = getattr(lib, get_name), getattr(lib, set_name)
            except AttributeError:
                continue
            get.restype, get.argtypes = ctypes.c_int, []
            put.restype, put.argtypes = None, [ctypes.c_int]
            found.append((get, put))
            break
    return found


def _openblas() -> list:
    found = _STATE["found"]
    if found is None:
        with _LOCK:
            if _STATE["found"] is None:
                _STATE["found"] = _loaded_openblas()
            found = _STATE["found"]
    return found


def thread_local_setter():
    """OpenBLAS's `openblas_set_num_threads_local(n) -> previous` (the count for the calling
    thread only), or None where no loaded OpenBLAS has it. For products Tiga runs on its own
    worker threads (attention tiles): a BLAS that also spawns threads per product
    oversubscribes the cores, its spinning workers slowing a tile product down tenfold."""
    if "local" not in _STATE:
        fn = None
        for lib in _libraries():
            fn = getattr(lib, "openblas_set_num_threads_local", None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                break
        _STATE["local"] = fn
    return _STATE["local"]


@contextmanager
def one_blas_thread(multiply_adds: int):
    """Run the body with OpenBLAS on one thread when the product is small enough that a
    second thread would not pay; nested and concurrent uses restore the count once, at the
    last exit."""
    fns = _openblas() if multiply_adds < ONE_THREAD_BELOW else ()
    if not fns:
        yield
        return
    with _LOCK:
        if _STATE["depth"] == 0:
            saved = tuple((put, get()) for get, put in fns)
            for put, n in saved:
                if n > 1:
                    put(1)
            _STATE["saved"] = saved
        _STATE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0:
                for put, n in _STATE["saved"]:
                    if n > 1:
                        put(n)
                _STATE["saved"] = ()


def _after_fork() -> None:
    """A fork taken while another thread held the count at one leaves the child no thread
    to restore it: the child starts over from the library's current setting."""
    global _LOCK
    _LOCK = threading.Lock()
    _STATE.update(depth=0, saved=())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
