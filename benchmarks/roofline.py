"""benchmarks: a roofline for every workload (issue 43) -- how far Tiga and the fastest peer
are from what this machine can do at best.

    python benchmarks/roofline.py                 # every workload, writes results/roofline-*.json
    python benchmarks/roofline.py --quick         # smallest sizes, 1 warm-up, 2 timed calls
    python benchmarks/roofline.py --workloads stored_csr hex_mesh --out /tmp/r.json
    python benchmarks/roofline.py --report a.json b.json   # RESULTS.md "Roofline" + plot

One run measures, in this order and in the same process tree (the machine probes run
before and after the workloads; each rate is the better of the two, so a busy moment on a
shared machine does not lower the floor):

1. **The machine** (`probe_machine`), in a child process per thread count:
   - stream bandwidth, 1 thread and all threads: numpy copy and triad (`a = b + s c`) on
     float32 arrays of 64 MiB each (>> the 32 MiB L3), and a native triad and copy (C, gcc
     -O3 -march=native, ctypes; threads = Python threads on disjoint slices, ctypes drops
     the GIL). STREAM convention: copy moves 8 B/element, triad 12 B/element (no
     write-allocate counted). The floor uses the best all-thread figure.
   - random-gather rate (native): out_i = sum of 16 rows idx[16 i .. 16 i + 15] of a table
     of W float32 (W = 4, 16, 32: the 16-, 64- and 128-byte rows the workloads gather),
     int32 indices drawn uniformly, the table resident in L1 (16 KiB), L2 (256 KiB), L3
     (8 MiB) or DRAM (256 MiB). Rate = gathered bytes / s, indices and outputs streamed
     alongside; two accumulators alternate; from L3 and DRAM the best of no software
     prefetch and a prefetch (prefetcht0) of the rows 16 or 32 gathers ahead.
   - sgemm: numpy float32 (N x N) @ (N x N), N = 2048, 1 and all threads
     (OPENBLAS/OMP/MKL_NUM_THREADS set before numpy is imported): 2 N^3 flop / s.
2. **The workloads**, exactly as `benchmarks/run.py` runs them: the definitions in
   `benchmarks/workloads/` (same inputs, same float64 checks), each (workload, size,
   implementation) in a fresh `worker.py` process with `measure.child_env` (equal threads,
   torch on THP_MEM_ALLOC_ENABLE=1). Peers: by default Tiga and the peers that were fastest
   in `RESULTS.md` for that workload (`FAST_PEERS`); `--all-peers` runs every peer.
3. **The floor** of each (workload, size) from the bytes the kernel must move and the flops
   it must do; Tiga's and the fastest peer's median time divided by it.

Floor = max(streamed bytes / stream bandwidth, gathered bytes / gather rate of the tier
the gathered table lives in (row width nearest the workload's), flops / flop rate), at the
best rates of this run (over 1 and all threads): a kernel that overlaps perfectly, touches
every compulsory byte once, and reuses cached rows for free where the access pattern is
local. The byte/flop model per workload (E edges, N rows, F features; indices counted at 4
bytes -- int32 addresses every size here, and a stored relation can keep them so once;
outputs written once, as streaming stores allow; float32 everywhere):

- `stored_csr.fwd` (N rows, 32 sources each, F = 32, weighted): stream row_ptr 4 N, col 4 E,
  w 4 E, x 4 N F (first touch), y 4 N F; gather E rows of 4 F bytes from x, x resident in
  L2 if 4 N F <= 1 MiB (a core's L2), L3 if <= 16 MiB, else DRAM; 2 E F flops (add rate
  is never the bound here).
- `stored_csr.step` (gradients of sum(y) w.r.t. x and w): the forward above, plus backward:
  dw_e = sum_f x[col_e, f] gathers the E rows again; dx[s] = sum of w over edges reading s is
  a scalar scatter (4 E bytes of w streamed, dx 4 N F written). Stream = forward + 4 E (col) +
  4 E (w) + 4 E (dw) + 4 N F (dx); gather = 2 E rows.
- `hex_mesh.csr` (L^3 rows, up to 26 neighbours, F = 16, unweighted): stream row_ptr, col
  4 nnz, x 64 N, y 64 N; the gathered rows are lattice neighbours, 18 of a row's 26 read
  by the row before it too (the working set of consecutive rows is a few KiB): nnz rows of
  64 B at the L1 gather rate.
- `hex_mesh.stencil` (same sum, implicit neighbours): stream x 64 N and y 64 N only (no
  indices, no gathers: the 26-neighbour sum of a box is separable, 3 passes of 3-point sums
  less the centre, 7 adds per value, reading rows already in L1/L2 -- never the bound).
- `radius.fwd` (3-D points, cutoff giving 32 neighbours, relation rebuilt every call): stream
  positions 12 N + x 4 N read, a cell sort that writes and re-reads them (2 x 16 N), y 4 N;
  candidate evaluations = the directed pairs within the cutoff (counted from the snapshot,
  about 32 N; no cell walk can examine fewer) as 16-byte rows (position + x) at the L2
  gather rate, 10 flops each.
- `knn.fwd` (k = 16): as radius with 16 N candidate evaluations (the k nearest themselves)
  plus log2(k) = 4 compare-exchanges each (counted as flops).
  Both geometric floors are optimistic: a cell walk with cells of the cutoff examines
  27 cells x about 7.6 points = about 200 candidates to find the 32 in range (6x the floor's
  count); they are the bound of an ideal search, not of a cell walk.
- `edge_nn.fwd` (35,947 torus points, radius 0.013, E directed pairs, width w): the first
  layer is hoisted to the nodes (W1 [p_j - p_i; x_j] = A_j - B_i), 2 N (3 + w) 64 flops; per
  edge 32 adds + 32 ReLU + the 32 -> 3 layer (192 flops); stream src/dst 8 E, pos 12 N,
  x 4 N w, y 12 N; gather E rows of 128 B (the hoisted hidden rows, 4.6 MB: L3). Flops at the
  sgemm rate.
- `edge_nn.step`: forward + backward; backward = 2 x the forward flops (input and weight
  gradients of both layers), its gather another E rows of 128 B (the hidden-row gradient
  scattered to the sources); streams doubled.
- `attention.fwd` (H = 16 heads of D = 64, causal, N): 2 matmuls over the N^2/2 visible
  pairs: 2 N^2 D H flops (exp and the online-softmax rescale not counted), at the sgemm
  rate; streams q, k, v, out (4 x 4 N H D) -- far below the flop time.
- `attention.step`: forward + backward without recomputation: 3 x the forward flops
  (dV = P^T c, dP = c V^T, dQ = dS K, dK = dS^T Q: 4 matmuls after the forward's 2).
- `paging.fwd` (10M edges, N = E / 16, F = 32, offsets -8..8 mod N): the in-memory floor --
  stream row_ptr 4 N, col 4 E, x 128 N, y 128 N; the gathers are within +-8 rows (L1): E
  rows of 128 B at the L1 gather rate. The paged run reads the same bytes from the page cache
  (the store is not dropped from it), so its floor is the same.

Sizes: every size the workload defines, and L = 96 for the hex mesh (the issue's target
size; the worker accepts any size). `feature-space kNN` and the first-call latencies are
not rooflined (not a kernel's throughput). Timings hold /tmp/tiga-bench.lock only if run
under `flock` by the caller.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
import measure as M  # noqa: E402

MIB = 1 << 20
ROOFLINE_BEGIN, ROOFLINE_END = "<!-- roofline:begin -->", "<!-- roofline:end -->"

# peers that were fastest (or close) for the workload in RESULTS.md; --all-peers runs all
FAST_PEERS = {
    "stored_csr.fwd": ("torch.sparse", "scipy"),
    "stored_csr.step": ("pyg",),
    "hex_mesh.csr": ("torch.sparse", "scipy"),
    "hex_mesh.stencil": ("torch conv3d",),
    "radius.fwd": ("ckdtree",),
    "knn.fwd": ("ckdtree", "faiss"),
    "edge_nn.fwd": ("pyg", "torch.compile"),
    "edge_nn.step": ("torch.compile", "pyg"),
    "attention.fwd": ("sdpa",),
    "attention.step": ("sdpa",),
    "paging.fwd": ("tiga in-memory",),
}
TIGA_PEER = {"paging.fwd": "tiga paged"}
EXTRA_SIZES = {"hex_mesh.csr": (96,), "hex_mesh.stencil": (96,)}


# ---------------------------------------------------------------- machine probes
NATIVE_C = r"""
#include <stdint.h>
#include <stddef.h>
void triad(float *restrict a, const float *restrict b, const float *restrict c, float s,
           long n) { for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i]; }
void copy(float *restrict a, const float *restrict b, long n) {
    for (long i = 0; i < n; i++) a[i] = b[i]; }
typedef float v4 __attribute__((vector_size(16)));
typedef float v16 __attribute__((vector_size(64)));
#define GATHER(W, V, L) \
void gather##W(const float *restrict t, const int32_t *restrict idx, long rows, \
               float *restrict out, int pf) { \
    for (long i = 0; i < rows; i++) { \
        V acc[2][W / L] = {{0}}; const int32_t *ix = idx + 16 * i; \
        for (int j = 0; j < 16; j++) { const float *r = t + (long)ix[j] * W; \
            if (pf) { const char *ahead = (const char *)(t + (long)ix[j + pf] * W); \
                for (int c = 0; c < 4 * W; c += 64) __builtin_prefetch(ahead + c, 0, 3); } \
            for (int f = 0; f < W / L; f++) { V v; __builtin_memcpy(&v, r + L * f, sizeof v); \
                acc[j & 1][f] += v; } } \
        for (int f = 0; f < W / L; f++) acc[0][f] += acc[1][f]; \
        __builtin_memcpy(out + i * W, acc[0], sizeof acc[0]); } }
GATHER(4, v4, 4)
GATHER(16, v16, 16)
GATHER(32, v16, 16)
"""


def _native():
    """The C probes compiled once into a temp .so (None without a C compiler)."""
    d = tempfile.mkdtemp(prefix="tiga-roofline-")
    src, lib = os.path.join(d, "probe.c"), os.path.join(d, "probe.so")
    with open(src, "w") as f:
        f.write(NATIVE_C)
    for cc in ("cc", "gcc", "clang"):
        try:
            r = subprocess.run([cc, "-O3", "-march=native", "-shared", "-fPIC", src, "-o", lib],
                               capture_output=True, text=True)
        except OSError:
            continue
        if r.returncode == 0:
            return ctypes.CDLL(lib)
    return None


def _best(fn, reps: int) -> float:
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _parallel(threads: int, work) -> float:
    """Seconds for `threads` Python threads running work(k) at once (best of 5)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        def once():
            list(ex.map(work, range(threads)))
        once()
        return _best(once, 5)


def probe_rates(threads: int, quick: bool) -> dict:
    """Runs in a child whose BLAS pools are capped at `threads`: every rate, GB/s or GFLOP/s."""
    import numpy as np

    out: dict = {"threads": threads}
    n = (16 if quick else 64) * MIB // 4
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    tmp = np.empty(n, np.float32)
    sl = [slice(k * n // threads, (k + 1) * n // threads) for k in range(threads)]

    def np_copy(k):
        np.copyto(a[sl[k]], b[sl[k]])

    def np_triad(k):
        np.multiply(c[sl[k]], np.float32(3), out=tmp[sl[k]])
        np.add(b[sl[k]], tmp[sl[k]], out=a[sl[k]])
    out["numpy_copy_GBs"] = 8 * n / _parallel(threads, np_copy) / 1e9
    out["numpy_triad_GBs"] = 12 * n / _parallel(threads, np_triad) / 1e9
    lib = _native()
    if lib is not None:
        fp = ctypes.POINTER(ctypes.c_float)
        ptr = lambda arr, k=0: ctypes.cast(arr.ctypes.data + 4 * k, fp)
        bounds = [(s.start, s.stop - s.start) for s in sl]
        lib.triad.argtypes = [fp, fp, fp, ctypes.c_float, ctypes.c_long]
        lib.copy.argtypes = [fp, fp, ctypes.c_long]
        out["native_triad_GBs"] = 12 * n / _parallel(threads, lambda k: lib.triad(
            ptr(a, bounds[k][0]), ptr(b, bounds[k][0]), ptr(c, bounds[k][0]), 3.0,
            bounds[k][1])) / 1e9
        out["native_copy_GBs"] = 8 * n / _parallel(threads, lambda k: lib.copy(
            ptr(a, bounds[k][0]), ptr(b, bounds[k][0]), bounds[k][1])) / 1e9
        rng = np.random.default_rng(0)
        gathers = (1 << 20) if quick else (1 << 22)
        for tier, table_bytes in (("L1", 16 << 10), ("L2", 256 << 10), ("L3", 8 * MIB),
                                  ("DRAM", 256 * MIB)):
            if quick and tier == "DRAM":
                continue
            for w in (4, 16, 32):
                rows = table_bytes // (4 * w)
                table = rng.standard_normal((rows, w), dtype=np.float32)
                g = gathers if tier != "DRAM" else gathers // 4
                idx = np.zeros(g + 64, np.int32)      # (padded for the prefetch)
                idx[:g] = rng.integers(0, rows, g, dtype=np.int32)
                res = np.empty((g // 16, w), np.float32)
                fn = getattr(lib, f"gather{w}")
                per = g // 16 // threads
                ip = ctypes.POINTER(ctypes.c_int32)

                secs = math.inf
                for pf in (0, 16, 32):   # software prefetch distance (0: none); the best

                    def work(k, fn=fn, table=table, idx=idx, res=res, w=w, per=per, ip=ip,
                             pf=pf):
                        fn(ptr(table), ctypes.cast(idx.ctypes.data + 4 * 16 * per * k, ip),
                           per, ptr(res, per * w * k), ctypes.c_int(pf))
                    secs = min(secs, _parallel(threads, work))
                    if tier in ("L1", "L2"):
                        break
                out[f"gather_{tier}_{4 * w}B_GBs"] = per * threads * 16 * 4 * w / secs / 1e9
    m = 1024 if quick else 2048
    x = np.random.default_rng(1).standard_normal((m, m), dtype=np.float32)
    x @ x
    out["sgemm_GFLOPs"] = 2 * m ** 3 / _best(lambda: x @ x, 5) / 1e9
    return out


def probe_machine(threads: int, quick: bool) -> dict:
    """Rates at 1 thread and at `threads`, each in a fresh child (BLAS pools set first)."""
    res = {}
    for t in sorted({1, threads}):
        env = M.child_env(t, ROOT, tempfile.gettempdir())
        code = (f"import sys, json; sys.path.insert(0, {BENCH_DIR!r}); import roofline; "
                f"print('@@RATES ' + json.dumps(roofline.probe_rates({t}, {quick})))")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=600)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("@@RATES ")]
        if not line:
            raise SystemExit(f"machine probe failed: {r.stderr[-2000:]}")
        res[str(t)] = json.loads(line[-1][len("@@RATES "):])
    return res


# ---------------------------------------------------------------- floors
def best_rates(by_threads: dict) -> dict:
    """Each rate's best over the thread counts probed (a floor takes the machine at its best;
    on a shared machine the all-thread figure is sometimes the lower one)."""
    keys = {k for r in by_threads.values() for k in r if k != "threads"}
    return {k: max(r.get(k, 0.0) for r in by_threads.values()) for k in keys}


def stream_bw(rates: dict) -> float:
    keys = ("native_triad_GBs", "native_copy_GBs", "numpy_triad_GBs", "numpy_copy_GBs")
    return max(rates.get(k, 0.0) for k in keys) * 1e9


def gather_bw(rates: dict, tier: str, row_bytes: int) -> float:
    widths = sorted(int(k.split("_")[2][:-1]) for k in rates
                    if k.startswith(f"gather_{tier}_"))
    if not widths and tier == "L1":     # (a run from before the L1 probe)
        return gather_bw(rates, "L2", row_bytes)
    if not widths:   # no compiler: numpy copy as a (generous) stand-in
        return stream_bw(rates)
    w = min(widths, key=lambda v: abs(v - row_bytes))
    return rates[f"gather_{tier}_{w}B_GBs"] * 1e9


def hex_nnz(side: int) -> int:
    import itertools

    return sum(math.prod(side - abs(o) for o in off)
               for off in itertools.product((-1, 0, 1), repeat=3) if off != (0, 0, 0))


def _radius_pairs(n: int) -> int:
    from scipy.spatial import cKDTree
    from workloads import geometry

    d = geometry.setup(n)
    return 2 * len(cKDTree(d["pos"][0]).query_pairs(d["r"], output_type="ndarray"))


def _edge_nn_counts() -> tuple:
    from scipy.spatial import cKDTree
    from workloads import edge_nn

    pos = edge_nn.torus_points()
    return len(pos), 2 * len(cKDTree(pos).query_pairs(edge_nn.RADIUS, output_type="ndarray"))


def model(wl: str, size: int) -> dict:
    """Compulsory work of one call: streamed bytes, gathers [(rows, row bytes, tier)], flops,
    and which rate the flops run at ('sgemm' or 'add')."""
    if wl.startswith("stored_csr"):
        n, deg, f = size, 32, 32
        e = n * deg
        tier = "L2" if 4 * n * f <= MIB else "L3" if 4 * n * f <= 16 * MIB else "DRAM"
        stream = 4 * n + 8 * e + 8 * n * f
        gathers, flops = [(e, 4 * f, tier)], 2 * e * f
        if wl.endswith("step"):
            stream += 12 * e + 4 * n * f
            gathers, flops = [(2 * e, 4 * f, tier)], 3 * e * f
        return {"stream": stream, "gathers": gathers, "flops": flops, "flop_rate": "add"}
    if wl.startswith("hex_mesh"):
        n, f = size ** 3, 16
        nnz = hex_nnz(size)
        if wl.endswith("stencil"):   # no indices; a separable box sum needs 7 adds/value
            return {"stream": 8 * n * f, "gathers": [], "flops": 7 * n * f,
                    "flop_rate": "add"}
        return {"stream": 8 * n * f + 4 * n + 4 * nnz, "gathers": [(nnz, 4 * f, "L1")],
                "flops": nnz * f, "flop_rate": "add"}
    if wl == "radius.fwd":
        pairs = _radius_pairs(size)
        return {"stream": 16 * size + 32 * size + 4 * size, "gathers": [(pairs, 16, "L2")],
                "flops": 10 * pairs, "flop_rate": "add", "pairs": pairs}
    if wl == "knn.fwd":
        cand = 16 * size
        return {"stream": 16 * size + 32 * size + 4 * size, "gathers": [(cand, 16, "L2")],
                "flops": 14 * cand, "flop_rate": "add"}
    if wl.startswith("edge_nn"):
        n, e = _edge_nn_counts()
        w, h = size, 32
        flops = 2 * n * (3 + w) * h + e * (h + h + 2 * h * 3)
        stream = 8 * e + 12 * n + 4 * n * w + 12 * n
        gathers = [(e, 4 * h, "L3")]
        if wl.endswith("step"):
            flops, stream, gathers = 3 * flops, 2 * stream, [(2 * e, 4 * h, "L3")]
        return {"stream": stream, "gathers": gathers, "flops": flops, "flop_rate": "sgemm",
                "edges": e}
    if wl.startswith("attention"):
        heads, d = 16, 64
        flops = 2 * size * size * d * heads
        stream = 16 * size * heads * d
        if wl.endswith("step"):
            flops, stream = 3 * flops, 2 * stream
        return {"stream": stream, "gathers": [], "flops": flops, "flop_rate": "sgemm"}
    if wl == "paging.fwd":
        e, f = size, 32
        n = e // 16
        return {"stream": 4 * n + 4 * e + 8 * n * f, "gathers": [(e, 4 * f, "L1")],
                "flops": e * f, "flop_rate": "add"}
    raise KeyError(wl)


def floor_ms(m: dict, rates: dict) -> dict:
    """The floor and its three terms (ms) under the all-thread rates of this run."""
    t_stream = m["stream"] / stream_bw(rates)
    t_gather = sum(rows * b / gather_bw(rates, tier, b) for rows, b, tier in m["gathers"])
    if m["flop_rate"] == "sgemm":
        t_flop = m["flops"] / (rates["sgemm_GFLOPs"] * 1e9)
    else:   # adds: bounded by the gathers already (each gathered float is one add)
        t_flop = 0.0
    terms = {"stream_ms": t_stream * 1e3, "gather_ms": t_gather * 1e3, "flop_ms": t_flop * 1e3}
    bound = max(terms, key=terms.get)
    return {**terms, "floor_ms": terms[bound], "bound": bound[:-3]}


# ---------------------------------------------------------------- workloads
def configs(a, reg: dict) -> list:
    out = []
    for wl_name in FAST_PEERS:
        if wl_name not in reg or not (a.workloads is None or any(
                wl_name == w or wl_name.startswith(w + ".") for w in a.workloads)):
            continue
        wl = reg[wl_name]
        sizes = list(wl.quick()) if a.quick else list(wl.sizes) + list(
            EXTRA_SIZES.get(wl_name, ()))
        if a.sizes:
            sizes = [s for s in sizes if s in a.sizes]
        tiga = TIGA_PEER.get(wl_name, "tiga")
        peers = [p for p in wl.peers if a.all_peers or p == tiga or p in FAST_PEERS[wl_name]]
        import workloads as W

        for size in sizes:
            for p in peers:
                peer = wl.peers[p]
                if W.installed(peer) or (peer.max_size is not None and size > peer.max_size):
                    continue
                out.append({"workload": wl_name, "size": size, "peer": p,
                            "role": "tiga" if p == tiga else "peer"})
    return out


def jobs_of(cfgs: list, a) -> list:
    """(config, environment) per worker run: every config once a round (`--rounds`), and with
    `--compare REV` Tiga's configs also as of REV (role "compare", right after the tree's)."""
    import run as R

    cache = tempfile.mkdtemp(prefix="tiga-roofline-cache-")
    env = M.child_env(a.threads, ROOT, cache)
    old = None
    if a.compare:
        path, sha = R.add_worktree(a.compare)
        old = (f"tiga@{sha}", M.child_env(a.threads, path, os.path.join(cache, sha)))
    jobs = []
    for k in range(a.rounds):
        for cfg in cfgs:
            jobs.append(({**cfg, "round": k}, env))
            if old is not None and cfg["role"] == "tiga":
                jobs.append(({**cfg, "round": k, "role": "compare", "label": old[0]}, old[1]))
    return jobs


def run_configs(cfgs: list, a) -> list:
    import run as R

    jobs = jobs_of(cfgs, a)
    results = []
    for i, (cfg, env) in enumerate(jobs):
        if a.deadline and time.time() > a.deadline:
            print(f"--max-minutes reached: {len(jobs) - i} configurations not run",
                  file=sys.stderr, flush=True)
            break
        spec = {"workload": cfg["workload"], "size": cfg["size"], "peer": cfg["peer"],
                "threads": a.threads, "warmup": a.warmup, "repeat": a.repeat,
                "budget_s": a.budget}
        t = time.perf_counter()
        res = R.run_worker(spec, env, a.timeout)
        keep = {k: res[k] for k in ("status", "reason", "median_ms", "min_ms", "max_ms",
                                    "reps", "rel_err", "loadavg_1min") if k in res}
        results.append({**cfg, **keep})
        print(f"[{i + 1}/{len(jobs)}] {cfg['workload']}/{cfg['size']}/"
              f"{cfg.get('label', cfg['peer'])}: "
              f"{keep.get('median_ms', keep.get('status'))} ({time.perf_counter() - t:.0f} s)",
              file=sys.stderr, flush=True)
    return results


def rounds_table(run: dict) -> str:
    """Each (workload, size, implementation) over the rounds: the min and median of the
    per-process medians and minima (ms), with the floor ratio of the median."""
    rates = best_rates(run["rates"])
    groups: dict = {}
    for r in run["results"]:
        if r.get("status") == "ok":
            key = (r["workload"], r["size"], r.get("label", r["peer"]))
            groups.setdefault(key, []).append(r)
    lines = ["| workload | size | implementation | rounds | median of medians | min of medians "
             "| min of minima | median ÷ floor |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for (wl, size, label), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        meds = sorted(r["median_ms"] for r in rs)
        mid = meds[len(meds) // 2] if len(meds) % 2 else 0.5 * sum(meds[len(meds) // 2 - 1:
                                                                       len(meds) // 2 + 1])
        fl = floor_ms(run["models"][f"{wl}/{size}"], rates)["floor_ms"]
        lines.append(f"| {wl} | {size} | {label} | {len(rs)} | {_g(mid)} | {_g(meds[0])} | "
                     f"{_g(min(r.get('min_ms', r['median_ms']) for r in rs))} | "
                     f"{mid / fl:.2f} |")
    return "\n".join(lines)


def measure_run(a) -> dict:
    import workloads as W

    reg = W.registry()
    cfgs = configs(a, reg)
    t0 = time.time()
    print(f"probing the machine ({a.threads} threads)", file=sys.stderr, flush=True)
    machine = probe_machine(a.threads, a.quick)
    results = run_configs(cfgs, a)
    print("probing the machine again", file=sys.stderr, flush=True)
    again = probe_machine(a.threads, a.quick)     # the floor takes each rate's best probe
    machine = {t: {k: max(v, again[t].get(k, 0.0)) if k != "threads" else v
                   for k, v in r.items()} for t, r in machine.items()}
    models = {}
    for wl, size in sorted({(c["workload"], c["size"]) for c in cfgs}):
        models[f"{wl}/{size}"] = model(wl, size)
    return {"schema": 1, "date": datetime.date.today().isoformat(),
            "started": datetime.datetime.fromtimestamp(t0).isoformat(timespec="seconds"),
            "wall_s": round(time.time() - t0, 1), "code": M.code_state(ROOT),
            "machine_info": M.machine_info(a.threads), "threads": a.threads,
            "quick": a.quick, "rates": machine, "models": models, "results": results}


# ---------------------------------------------------------------- report
def rows_of(run: dict) -> list:
    """One row per (workload, size): Tiga, the fastest peer, the floor and the ratios."""
    rates = best_rates(run["rates"])
    out = []
    keys = sorted({(r["workload"], r["size"]) for r in run["results"]},
                  key=lambda k: (list(FAST_PEERS).index(k[0]), k[1]))
    for wl, size in keys:
        rs = [r for r in run["results"] if r["workload"] == wl and r["size"] == size and
              r.get("round", 0) == 0]
        fl = floor_ms(run["models"][f"{wl}/{size}"], rates)
        tiga = next((r for r in rs if r["role"] == "tiga"), None)
        peers = [r for r in rs if r["role"] == "peer" and r.get("status") == "ok"]
        best = min(peers, key=lambda r: r["median_ms"]) if peers else None
        ok = tiga is not None and tiga.get("status") == "ok"
        out.append({"workload": wl, "size": size, **fl,
                    "tiga_ms": tiga["median_ms"] if ok else None,
                    "tiga_status": tiga.get("status") if tiga else "not run",
                    "peer": best["peer"] if best else None,
                    "peer_ms": best["median_ms"] if best else None,
                    "tiga_x": tiga["median_ms"] / fl["floor_ms"] if ok else None,
                    "peer_x": best["median_ms"] / fl["floor_ms"] if best else None,
                    "started": run["started"], "commit": run["code"]["short"]})
    return out


def _g(v, fmt="{:.3g}") -> str:
    return "–" if v is None else fmt.format(v)


def rates_table(runs: list) -> str:
    lines = ["| run | threads | numpy copy | numpy triad | native copy | native triad | "
             "gather L2 64 B | gather L3 128 B | gather DRAM 128 B | sgemm GFLOP/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for t, r in run["rates"].items():
            lines.append("| " + " | ".join([
                f"{run['started']} `{run['code']['short']}`", t,
                *(_g(r.get(k)) for k in ("numpy_copy_GBs", "numpy_triad_GBs",
                                         "native_copy_GBs", "native_triad_GBs",
                                         "gather_L2_64B_GBs", "gather_L3_128B_GBs",
                                         "gather_DRAM_128B_GBs", "sgemm_GFLOPs"))]) + " |")
    return "\n".join(lines)


def roofline_table(rows: list) -> str:
    lines = ["| workload | size | floor ms | bound | Tiga ms | Tiga ÷ floor | fastest peer | "
             "peer ms | peer ÷ floor |", "|---|---|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append("| " + " | ".join([
            r["workload"], str(r["size"]), _g(r["floor_ms"]), r["bound"],
            _g(r["tiga_ms"]) if r["tiga_ms"] is not None else f"*{r['tiga_status']}*",
            _g(r["tiga_x"], "**{:.2f}**"), r["peer"] or "–", _g(r["peer_ms"]),
            _g(r["peer_x"], "{:.2f}")]) + " |")
    return "\n".join(lines)


def plot(rows: list, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['workload']}\n{r['size']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 4.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["tiga_x"] or 0 for r in rows], 0.4, label="Tiga")
    ax.bar([x + 0.2 for x in xs], [r["peer_x"] or 0 for r in rows], 0.4,
           label="fastest peer", color="#999999")
    ax.axhline(1.0, color="k", lw=1)
    ax.set_yscale("log")
    ax.set_ylabel("median time ÷ floor (1 = at the machine's floor)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.legend()
    ax.set_title("Roofline: time over the bytes/flops floor, 2 threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


READING = (
    "Reading it: a ratio near 1 is a kernel at this machine's floor. The radius and kNN "
    "floors are those of an ideal search (only the pairs in range, or the k nearest, are "
    "ever examined); a cell walk examines about 6x more candidates, so their ratios say "
    "how far a cell walk is from that ideal, not from a better cell walk. Attention and "
    "EdgeNN are bounded by the sgemm rate where the flop term is the floor's. A ratio below "
    "1 means the model's tier is pessimistic for that size (stored CSR at N = 32768: x is "
    "4 MiB, half of it fits the two cores' L2, which the L3 rate does not credit).")


def section(runs: list, dest: str = BENCH_DIR, note: str | None = None) -> str:
    rows = [row for run in runs for row in rows_of(run)]
    seen, uniq = set(), []
    for r in reversed(rows):          # the newest run that measured a (workload, size) wins
        if (r["workload"], r["size"]) not in seen:
            seen.add((r["workload"], r["size"]))
            uniq.append(r)
    uniq.sort(key=lambda r: (list(FAST_PEERS).index(r["workload"]), r["size"]))
    os.makedirs(os.path.join(dest, "plots"), exist_ok=True)
    drawn = plot(uniq, os.path.join(dest, "plots", "roofline.png"))
    names = ", ".join(f"`results/{os.path.basename(p)}`" for p in
                      (run["_path"] for run in runs))
    loads = sorted({round(run["machine_info"]["loadavg_at_start"][0], 2) for run in runs})
    text = [ROOFLINE_BEGIN,
            f"Generated by `benchmarks/roofline.py` from {names} (`--report` re-renders; the "
            "byte/flop model of every workload is in the script's docstring). Each run "
            "measures the machine's rates and then the workloads, each (workload, size, "
            "implementation) in a fresh process as `run.py` does (same inputs and float64 "
            f"checks, {runs[0]['threads']} threads everywhere, torch on "
            "THP_MEM_ALLOC_ENABLE=1); a row's ratios use the rates of its own run. Floor = "
            "max(streamed bytes / best stream bandwidth, gathered bytes / gather rate of the "
            "tier the table lives in, flops / sgemm rate where the work is matrix products). "
            "Peers: the ones fastest in the tables above, not all. "
            f"Load average at the start of the runs: {loads} (the machine's 2 cores were "
            "shared with other work during these runs; figures are medians).", "",
            "Machine rates (GB/s; STREAM convention, gathers count gathered bytes):", "",
            rates_table(runs), "", roofline_table(uniq), "", READING, ""]
    if note:
        text += [note, ""]
    if drawn:
        text += ["![Roofline](plots/roofline.png)", ""]
    text.append(ROOFLINE_END)
    return "\n".join(text)


def write_section(runs: list, dest: str = BENCH_DIR, note: str | None = None) -> str:
    """Replace the marked block of RESULTS.md's "## Roofline" section (or add the section
    before '## Method'); the rest of the file is left as it is on disk right now."""
    path = os.path.join(dest, "RESULTS.md")
    block = section(runs, dest, note)    # (the plot is drawn before the file is read)
    with open(path) as f:
        doc = f.read()
    if ROOFLINE_BEGIN in doc and ROOFLINE_END in doc:
        head, rest = doc.split(ROOFLINE_BEGIN, 1)
        doc = head + block + rest.split(ROOFLINE_END, 1)[1]
    else:   # (report.py keeps a "## " section it does not generate: the markers go inside)
        new = "## Roofline\n\n" + block + "\n"
        if "\n## Method" in doc:
            head, rest = doc.split("\n## Method", 1)
            doc = head.rstrip("\n") + "\n\n" + new + "\n## Method" + rest
        else:
            doc = doc.rstrip("\n") + "\n\n" + new
    with open(path, "w") as f:
        f.write(doc)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smallest sizes, small probes, 1 warm-up, 2 timed calls")
    p.add_argument("--workloads", nargs="+", default=None, help="names or families")
    p.add_argument("--sizes", nargs="+", type=int, default=None)
    p.add_argument("--all-peers", action="store_true", help="every peer, not the fast ones")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--budget", type=float, default=2.0)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="start no configuration after this many minutes (the run stays "
                        "under a shared lock's time slot; the rest is reported not run)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of every configuration (the table reports the first; the "
                        "rounds table all)")
    p.add_argument("--compare", default=None, metavar="REV",
                   help="also run Tiga as of git REV (a temporary worktree), right after "
                        "each of the tree's Tiga runs")
    p.add_argument("--out", default=None, help="JSON path (default results/roofline-*.json)")
    p.add_argument("--report", nargs="+", default=None, metavar="JSON",
                   help="only re-render RESULTS.md's Roofline section from these runs")
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    p.add_argument("--note", default=None, metavar="FILE",
                   help="with --report: markdown appended to the section (kernel changes "
                        "measured alongside, the machine's state)")
    a = p.parse_args(argv)
    if a.quick:
        a.warmup, a.repeat, a.budget = 1, 2, 1.0
    a.deadline = time.time() + 60 * a.max_minutes if a.max_minutes else None
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.report:
        runs = []
        for path in a.report:
            with open(path) as f:
                runs.append({**json.load(f), "_path": path})
        runs.sort(key=lambda r: r["started"])
        note = None
        if a.note:
            with open(a.note) as f:
                note = f.read().strip()
        print(write_section(runs, note=note))
        return 0
    run = measure_run(a)
    folder = tempfile.gettempdir() if a.quick else os.path.join(BENCH_DIR, "results")
    path = a.out or os.path.join(folder, f"roofline-{run['date']}-{run['code']['short']}"
                                 f"{'-quick' if a.quick else ''}-{int(time.time())}.json")
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
    run["_path"] = path
    print(json.dumps(run["rates"], indent=1))
    print(roofline_table(rows_of(run)))
    if a.rounds > 1 or a.compare:
        print("\n" + rounds_table(run))
    print(f"\nroofline: {path}")
    if not a.no_write and not a.quick:
        print(write_section([run]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
