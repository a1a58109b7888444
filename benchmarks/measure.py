"""benchmarks: what a worker measures (time, peak memory, correctness) and what the parent
records about the machine and the code. Imported by both sides; nothing heavy at import time.
"""
from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from importlib import metadata

import numpy as np

# Relative error (max |got - ref| / max |ref|) a result may have against the float64 oracle.
DEFAULT_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
VERSIONED = ("numpy", "scipy", "torch", "torch_geometric", "faiss-cpu", "scikit-learn",
             "llvmlite", "matplotlib", "tiga")
CHECK_CHUNK = 1 << 16   # elements compared at a time: the check must not move the memory peak


# ---------------------------------------------------------------- memory (/proc)
def status_kib(field: str) -> int | None:
    """A field of /proc/self/status in KiB (VmHWM, VmRSS), None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _trim_heap() -> None:
    """Hand freed heap pages back to the kernel (glibc malloc_trim), so memory a call reuses
    from an earlier free (the oracle's temporaries, the previous call's output) counts as the
    call's own instead of hiding in the resident size the peak is measured from."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak resident memory of this process above the level at `start()`: the kernel's
    high-water mark (VmHWM) is reset through /proc/self/clear_refs, so the figure covers what
    ran after start() only. Without the reset (not Linux, or not permitted) it is the
    whole-process VmHWM minus VmRSS at start, which over-reports if an earlier peak was higher;
    `method` says which. The heap is trimmed first (see _trim_heap)."""

    def start(self) -> None:
        gc.collect()
        _trim_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM reset at start, minus VmRSS at start"
        except OSError:
            self.method = "whole-process VmHWM minus VmRSS at start (no reset available)"
        self.base_kib = status_kib("VmRSS") or 0

    def stop(self) -> int:
        return max(0, (status_kib("VmHWM") or 0) - self.base_kib) * 1024


# ---------------------------------------------------------------- correctness
def host_arrays(out) -> list:
    """A call's outputs as numpy arrays (torch tensors without a copy)."""
    items = out if isinstance(out, (tuple, list)) else [out]
    res = []
    for t in items:
        if hasattr(t, "detach"):
            t = t.detach()
            t = (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
        res.append(np.asarray(t))
    return res


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|, in chunks so no output-sized float64 temporary is made;
    NaN anywhere gives inf."""
    if got.size != ref.size:
        return float("inf")
    g, r = got.reshape(-1), ref.reshape(-1)
    worst = scale = 0.0
    for s in range(0, g.size, CHECK_CHUNK):
        gs, rs = g[s:s + CHECK_CHUNK].astype(np.float64), r[s:s + CHECK_CHUNK]
        d = np.abs(gs - rs)
        if np.isnan(d).any():
            return float("inf")
        worst = max(worst, float(d.max(initial=0.0)))
        scale = max(scale, float(np.abs(rs).max(initial=0.0)))
    return worst / max(scale, 1e-30)


def check(out, expected, dtype: str, tol_scale: float = 1.0) -> tuple[bool, float]:
    """(passed, worst relative error) of one call's outputs against the oracle, with the
    tolerance of the workload's `dtype` (a peer returning float64 from float32 inputs is held
    to the float32 tolerance: its inputs carry no more).
    `expected` is a list of float64 arrays, or (that list, a boolean mask of the rows to
    compare) where a discrete choice (a near-tied k-th neighbour) makes some rows ambiguous."""
    got = host_arrays(out)
    if isinstance(expected, tuple):
        expected, rows = expected
        got = [g[rows] for g in got]
        expected = [r[rows] for r in expected]
    if len(got) != len(expected):
        return False, float("inf")
    err = max(rel_error(g, r) for g, r in zip(got, expected))
    return err <= DEFAULT_TOL[dtype] * tol_scale, err


# ---------------------------------------------------------------- timing
def timed_calls(fn: Callable[[int], object], verify: Callable[[object, int], None],
                warmup: int, repeat: int, budget_s: float, start: int = 1) -> dict:
    """`warmup` untimed calls, then up to `repeat` timed ones (at least 3, or `repeat` if
    fewer: stops once the timed calls have used `budget_s`). Every output goes to `verify`
    outside the timer."""
    i = start
    for _ in range(warmup):
        verify(fn(i), i)
        i += 1
    gc.collect()
    times: list = []
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(i)
        dt = time.perf_counter() - t0
        verify(out, i)
        del out
        times.append(dt * 1e3)
        spent += dt
        i += 1
        if len(times) >= 3 and spent > budget_s:
            break
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "reps": len(times), "warmup": warmup, "times_ms": times}


# ---------------------------------------------------------------- environment
def child_env(threads: int, pythonpath: str, cache_dir: str) -> dict:
    """Environment of a worker: every thread pool capped at `threads`; torch's CPU allocator
    on transparent huge pages (THP_MEM_ALLOC_ENABLE), as numpy's large allocations already
    are; Tiga from `pythonpath` with its own disk cache; no test-suite verification flags."""
    env = {k: v for k, v in os.environ.items() if k not in ("TIGA_CHECK", "PYTHONPATH")}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "TIGA_NUM_THREADS"):
        env[var] = str(threads)
    env.update(THP_MEM_ALLOC_ENABLE="1", PYTHONPATH=pythonpath, TIGA_CACHE_DIR=cache_dir,
               PYTHONHASHSEED="0")
    return env


# ---------------------------------------------------------------- machine and code
def version(dist: str) -> str | None:
    for name in (dist, dist.replace("_", "-"), dist.replace("-", "_")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def machine_info(threads: int) -> dict:
    """CPU model and cores (/proc/cpuinfo), RAM (/proc/meminfo), versions from package
    metadata (nothing heavy is imported into the parent)."""
    model, cores = None, set()
    phys = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = (s.strip() for s in line.partition(":"))
                if key == "model name" and model is None:
                    model = val
                elif key == "physical id":
                    phys = val
                elif key == "core id":
                    cores.add((phys, val))
    except OSError:
        pass
    mem_kib = None
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu_model": model or platform.processor(), "logical_cpus": os.cpu_count(),
            "physical_cores": len(cores) or None, "threads_used": threads,
            "memory_GiB": round(mem_kib / 2**20, 1) if mem_kib else None,
            "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
            "platform": platform.platform(), "python": platform.python_version(),
            "versions": {d: version(d) for d in VERSIONED}}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def git(root: str, *args: str) -> str:
    res = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    return res.stdout.strip()


def code_state(root: str) -> dict:
    """Which Tiga the working tree holds: HEAD, its short form, and whether tiga/ is dirty."""
    head = git(root, "rev-parse", "HEAD") or None
    return {"git_head": head, "short": git(root, "rev-parse", "--short", "HEAD") or "nogit",
            "tiga_dirty_files": len(git(root, "status", "--porcelain", "--", "tiga")
                                    .splitlines())}
