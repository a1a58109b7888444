"""benchmarks: shared harness: fresh-process runs, timing, peak memory, machine description.

Every configuration runs in its own interpreter (`python <script> --child <json>`), so caches,
thread pools and allocator state of one peer never leak into another's numbers. The child
prints one line `@@BENCH-RESULT <json>` on stdout; the parent parses it, enforces a timeout
and records "timeout" or "error" instead of hanging. Never imported by the test suite.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
import tracemalloc
from importlib import metadata

import numpy as np

RESULT_TAG = "@@BENCH-RESULT "
VERSIONED = ("numpy", "scipy", "torch", "llvmlite", "torch_geometric", "tiga", "tqdm")


# ---------------------------------------------------------------- workload
def make_csr(n: int, degree: int, features: int, seed: int):
    """Deterministic destination-major CSR: each of the n destinations reads exactly `degree`
    distinct sources drawn uniformly from n, sorted within the row (canonical CSR, and distinct
    so that torch's sparse-CSR backward, which merges duplicates, stays well defined).
    Returns (row_ptr int64, col_idx int64, w float32 (E,), x float32 (n, features))."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, n, size=(n, degree)), axis=1)
    while True:  # redraw rows with a repeated source until all rows are duplicate-free
        bad = np.nonzero((np.diff(cols, axis=1) == 0).any(axis=1))[0]
        if bad.size == 0:
            break
        cols[bad] = np.sort(rng.integers(0, n, size=(bad.size, degree)), axis=1)
    row_ptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    col = cols.reshape(-1).astype(np.int64)
    w = rng.standard_normal(n * degree, dtype=np.float32)
    x = rng.standard_normal((n, features), dtype=np.float32)
    return row_ptr, col, w, x


def thread_env(threads: int) -> dict:
    """Environment for a child: every thread pool we know of capped at `threads`."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "TIGA_NUM_THREADS"):
        env[var] = str(threads)
    return env


# ---------------------------------------------------------------- memory
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak resident memory above the level at `start()`. On Linux the high-water mark is reset
    through /proc/self/clear_refs ("5"), so the figure covers only what runs after start();
    elsewhere it falls back to the ru_maxrss delta, which under-reports when an earlier peak
    was higher. `method` says which one was used."""

    def start(self) -> None:
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM after clear_refs reset, minus VmRSS at reset (whole process)"
            self.base_kib = _status_kib("VmRSS")
        except OSError:
            self.method = ("ru_maxrss delta (whole process; under-reports if an earlier peak "
                           "was higher)")
            self.base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._hwm = self.method.startswith("VmHWM") and self.base_kib is not None

    def stop(self) -> int:
        peak = _status_kib("VmHWM") if self._hwm else None
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(0, peak - self.base_kib) * 1024


def traced_peak_bytes(fn) -> int:
    """Peak of allocations tracemalloc sees during one call: Python objects and numpy buffers
    (numpy reports to tracemalloc); torch's and LLVM's native allocators are invisible to it."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------- timing
def time_calls(fn, warmup: int, repeat: int, budget_s: float) -> dict:
    """Warm-ups, then up to `repeat` timed calls; stops early (after at least 3) once the timed
    calls have used `budget_s`, so a slow route still finishes inside the parent's timeout."""
    for _ in range(warmup):
        fn()
    gc.collect()
    times = []
    t_start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 3 and time.perf_counter() - t_start > budget_s:
            break
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "reps": len(times), "warmup": warmup, "times_ms": times}


def measure_bandwidth(mib: int = 256, reps: int = 7) -> dict:
    """np.copyto of a `mib` MiB float32 array. GB/s counts bytes read plus bytes written
    (2 x size), the traffic a streaming kernel pays; copy_GBps counts the array size once."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    t = statistics.median(ts)
    return {"array_MiB": mib, "median_s": t, "read_write_GBps": 2 * a.nbytes / t / 1e9,
            "copy_GBps": a.nbytes / t / 1e9}


def measure_sgemm(n: int = 2048, reps: int = 5) -> dict:
    """float32 n^3 matmul through numpy's BLAS; GFLOP/s = 2 n^3 / median time."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    t = statistics.median(ts)
    return {"n": n, "median_s": t, "GFLOPs": 2 * n**3 / t / 1e9}


# ---------------------------------------------------------------- machine
def _version(dist: str) -> str | None:
    for name in (dist, dist.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _caches() -> dict:
    """Cache sizes of CPU 0 by level (sysfs), e.g. {"L1d": "48K", "L2": "2048K", "L3": ...}."""
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            vals = {}
            for key in ("type", "level", "size"):
                with open(os.path.join(base, idx, key)) as f:
                    vals[key] = f.read().strip()
        except OSError:
            continue
        kind = {"Data": "d", "Instruction": "i"}.get(vals["type"], "")
        out[f"L{vals['level']}{kind}"] = vals["size"]
    return out


def machine_info(threads: int) -> dict:
    """CPU model, core counts, memory and library versions (from package metadata, so nothing
    heavy is imported into the parent)."""
    model, cores = None, set()
    phys = core = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "model name" and model is None:
                    model = val
                elif key == "physical id":
                    phys = val
                elif key == "core id":
                    core = val
                elif not key and phys is not None:
                    cores.add((phys, core))
    except OSError:
        pass
    mem_kib = None
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu_model": model or platform.processor(), "logical_cpus": os.cpu_count(),
            "physical_cores": len(cores) or None,
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "threads_used": threads, "caches": _caches(),
            "memory_GiB": round(mem_kib / 2**20, 1) if mem_kib else None,
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "platform": platform.platform(), "python": platform.python_version(),
            "versions": {d: _version(d) for d in VERSIONED}}


def code_state(root: str) -> dict:
    """Which Tiga was measured: git HEAD, whether tiga/ has uncommitted changes, and a hash of
    the package sources (a dirty tree is common while benchmarking work in progress)."""
    import hashlib

    root = os.path.abspath(root)
    digest = hashlib.sha256()
    for dirpath, dirnames, files in sorted(os.walk(os.path.join(root, "tiga"))):
        dirnames.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(dirpath, name), "rb") as f:
                digest.update(name.encode() + f.read())
    git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True,
                                       text=True).stdout.strip()
    return {"git_head": git("rev-parse", "HEAD") or None,
            "tiga_dirty_files": len(git("status", "--porcelain", "--", "tiga").splitlines()),
            "tiga_sources_sha256": digest.hexdigest()[:16]}


# ---------------------------------------------------------------- processes
def child_report(result: dict) -> None:
    """Called in the child: hand the result to the parent on one tagged stdout line."""
    sys.stdout.write(RESULT_TAG + json.dumps(result) + "\n")
    sys.stdout.flush()


def run_child(argv: list, env: dict, timeout: float) -> dict:
    """Run one child in its own session (so a terminal Ctrl-C reaches only the parent, which then
    kills the child's process group by id) and parse its tagged result line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return {"status": "timeout", "timeout_s": timeout}
    except BaseException:  # KeyboardInterrupt included: never leave the child running
        _kill_group(proc)
        raise
    wall = time.perf_counter() - t0
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
            res.setdefault("status", "ok")
            res["process_wall_s"] = wall
            return res
    return {"status": "error", "returncode": proc.returncode,
            "stderr_tail": (err or "")[-2000:], "stdout_tail": (out or "")[-500:]}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_all(jobs: list, timeout: float, env: dict, desc: str = "bench") -> tuple[list, bool]:
    """jobs: [(label, argv)]. Runs them one by one with a tqdm bar. Returns (results,
    interrupted); on Ctrl-C the running child is killed and the finished results are kept."""
    from tqdm import tqdm

    results = []
    bar = tqdm(jobs, desc=desc, unit="cfg", file=sys.stderr, dynamic_ncols=True)
    try:
        for label, argv in bar:
            bar.set_postfix_str(label)
            res = run_child(argv, env, timeout)
            res["label"] = label
            results.append(res)
    except KeyboardInterrupt:
        bar.close()
        sys.stderr.write("\ninterrupted: child stopped, keeping the finished results\n")
        return results, True
    bar.close()
    return results, False


def _round_key(r: dict):
    if "median_ms" in r:
        return r["median_ms"]
    if "fwd_first_ms" in r:
        return r["fwd_first_ms"]
    return r.get("bandwidth", {}).get("median_s")


def best_of_rounds(results: list) -> list:
    """Per label, the successful round with the lowest time (median, first call, or copy time):
    other work on a shared machine only ever adds time. Every round's figure stays in 'rounds'."""
    by_label: dict = {}
    for r in results:
        by_label.setdefault(r["label"], []).append(r)
    out = []
    for rs in by_label.values():
        ok = [r for r in rs if r.get("status") == "ok" and _round_key(r) is not None]
        pick = dict(min(ok, key=_round_key) if ok else rs[-1])
        pick["rounds"] = [_round_key(r) if r in ok else r.get("status") for r in rs]
        out.append(pick)
    return out


# ---------------------------------------------------------------- output
def markdown_table(headers: list, rows: list) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(headers))) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
