"""Dynamic radius and kNN relations (issue 4): Tiga's fused generated traversal vs peers.

Every call rebuilds the relation from changed coordinates (two snapshots alternate), then
aggregates: radius: y_i = sum_{j != i, |p_j - p_i| <= r} x_j * (r - |p_j - p_i|) over uniform
3-D float32 points with a cutoff giving a nominal degree of 32; kNN (k = 16, no self):
y_i = sum over the k nearest j of x_j * |p_j - p_i|.

Peers: scipy cKDTree (query_pairs + bincount; query), torch chunked all-pairs (cdist;
radius up to 32768 points, kNN cdist + topk up to 32768), faiss IndexFlatL2 (when
installed; up to 32768), PyG radius/knn (only if torch_cluster imports: it does not build
here, recorded as skipped). Each configuration runs in a fresh process (_harness.py).

Usage: python benchmarks/radius_knn.py [--quick] [--threads 2] [--rounds 1]
       [--peers tiga ...] [--sizes 8192 32768 ...]
--tasks radius_grad (opt-in): jit(grad) of sum(y^2) wrt (positions, x) over the radius
workload (self loops in, weight r^2 - |d|^2), the symmetric relation (source cotangents by
the fused walk, roles swapped) against the same relation stated with query=p (asymmetric:
transposed CSR); the error is x's gradient against 2 W W x by cKDTree.
The summary prints Tiga's ns/point per size and its largest/smallest ratio over
N = 8192 ... 131072 (flat = linear scaling), for radius and kNN.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEGREE, K, SEED = 32, 16, 0
RADIUS_SIZES = (8192, 32768, 131072)
KNN_SIZES = (1024, 4096, 8192, 16384, 32768, 65536, 131072)
FLAT_RANGE = (8192, 131072)      # per-point time judged over these sizes
ALL_PAIRS_MAX = 32768
PEERS = {"radius": ("tiga", "ckdtree", "torch_allpairs", "pyg"),
         "knn": ("tiga", "ckdtree", "torch_cdist_topk", "faiss_flat", "pyg"),
         # gradient of sum(y^2) wrt (positions, x) of the radius workload (opt-in task):
         # symmetric relation (source cotangents by the fused walk, roles swapped) vs the
         # same relation stated with query=p (asymmetric: transposed CSR)
         "radius_grad": ("tiga", "tiga_transposed_csr")}


def cutoff_for(n: int) -> float:
    """Unit cube, n points: a ball of this radius holds DEGREE points on average."""
    return float((3.0 * DEGREE / (4.0 * np.pi * n)) ** (1.0 / 3.0))


def snapshots(n: int):
    rng = np.random.default_rng(SEED)
    pos = [rng.random((n, 3), dtype=np.float32) for _ in range(2)]
    return pos, rng.random(n, dtype=np.float32)


# ---------------------------------------------------------------- oracles (float64)
def oracle(task: str, pos, x, r):
    from scipy.spatial import cKDTree

    p = pos.astype(np.float64)
    t = cKDTree(p)
    if task == "radius":
        pairs = t.query_pairs(r * (1 + 1e-6), output_type="ndarray")
        d = np.sqrt(((p[pairs[:, 0]] - p[pairs[:, 1]]) ** 2).sum(1))
        keep = d <= r
        pairs, w = pairs[keep], (r - d[keep])
        n = len(p)
        return (np.bincount(pairs[:, 0], w * x[pairs[:, 1]], minlength=n)
                + np.bincount(pairs[:, 1], w * x[pairs[:, 0]], minlength=n))
    if task == "radius_grad":      # d/dx sum((W x)^2) = 2 W^T W x, W symmetric
        pairs = t.query_pairs(r * (1 + 1e-6), output_type="ndarray")
        d2 = ((p[pairs[:, 0]] - p[pairs[:, 1]]) ** 2).sum(1)
        keep = np.sqrt(d2) <= r
        pairs, w = pairs[keep], r * r - d2[keep]

        def apply(v):   # self loops included (weight r^2)
            return (np.bincount(pairs[:, 0], w * v[pairs[:, 1]], minlength=len(p))
                    + np.bincount(pairs[:, 1], w * v[pairs[:, 0]], minlength=len(p))
                    + r * r * v)
        return 2.0 * apply(apply(x))
    d, idx = t.query(p, k=K + 1)
    return (x[idx[:, 1:]] * d[:, 1:]).sum(1)


# ---------------------------------------------------------------- peers
def peer_tiga(task, pos, x, r, threads):
    import tiga as tg

    if task == "radius_grad":
        return _tiga_grad(tg, x, r, symmetric=True)
    if task == "radius":
        def edge(src, dst, e):
            return src.x * (r - e.distance)

        def call(p):
            return tg.propagate(tg.Graph.radius(p, r), edge, tg.sum(), src={"x": x})
    else:
        def edge(src, dst, e):
            return src.x * e.distance

        def call(p):
            return tg.propagate(tg.Graph.knn(p, K), edge, tg.sum(), src={"x": x})
    return call


def _tiga_grad(tg, x, r, symmetric: bool):
    def loss(p, x):
        # the same relation both ways (self loops included: query=p has them); a smooth
        # weight, since the distance has no derivative at the self loops
        g = (tg.Graph.radius(p, r, loop=True) if symmetric
             else tg.Graph.radius(p, r, query=p * 1.0))

        def edge(src, dst, e):
            return src.x * (r * r - tg.math.sum(tg.math.square(e.displacement), axis=-1))

        return tg.math.sum(tg.math.square(tg.propagate(g, edge, tg.sum(), src={"x": x})))

    grad = tg.jit(tg.grad(loss, argnums=(0, 1)))
    return lambda p: grad(p, x)[1]


def peer_tiga_transposed_csr(task, pos, x, r, threads):
    import tiga as tg

    return _tiga_grad(tg, x, r, symmetric=False) if task == "radius_grad" else None


def peer_ckdtree(task, pos, x, r, threads):
    from scipy.spatial import cKDTree

    n = len(x)
    if task == "radius":
        def call(p):
            pairs = cKDTree(p).query_pairs(r, output_type="ndarray")
            d = np.sqrt(((p[pairs[:, 0]] - p[pairs[:, 1]]) ** 2).sum(1))
            w = r - d
            return (np.bincount(pairs[:, 0], w * x[pairs[:, 1]], minlength=n)
                    + np.bincount(pairs[:, 1], w * x[pairs[:, 0]], minlength=n))
    else:
        def call(p):
            d, idx = cKDTree(p).query(p, k=K + 1, workers=threads)
            return (x[idx[:, 1:]] * d[:, 1:]).sum(1)
    return call


def _torch(threads):
    import torch

    torch.set_num_threads(threads)
    return torch


def peer_torch_allpairs(task, pos, x, r, threads):
    if task != "radius" or len(x) > ALL_PAIRS_MAX:
        return None
    torch = _torch(threads)
    xt = torch.from_numpy(x)
    n = len(x)
    chunk = max(1, (1 << 24) // n)

    def call(p):
        pt = torch.from_numpy(p)
        out = torch.empty(n)
        for s in range(0, n, chunk):
            d = torch.cdist(pt[s:s + chunk], pt)
            w = torch.where(d <= r, r - d, torch.zeros(()))
            w[torch.arange(w.shape[0]), torch.arange(s, s + w.shape[0])] = 0
            out[s:s + chunk] = w @ xt
        return out
    return call


def peer_torch_cdist_topk(task, pos, x, r, threads):
    if task != "knn" or len(x) > ALL_PAIRS_MAX:
        return None
    torch = _torch(threads)
    xt = torch.from_numpy(x)
    n = len(x)
    chunk = max(1, (1 << 24) // n)

    def call(p):
        pt = torch.from_numpy(p)
        out = torch.empty(n)
        for s in range(0, n, chunk):
            d = torch.cdist(pt[s:s + chunk], pt)
            d[torch.arange(d.shape[0]), torch.arange(s, s + d.shape[0])] = float("inf")
            vals, idx = torch.topk(d, K, dim=1, largest=False)
            out[s:s + chunk] = (xt[idx] * vals).sum(1)
        return out
    return call


def peer_faiss_flat(task, pos, x, r, threads):
    if task != "knn" or len(x) > ALL_PAIRS_MAX:
        return None
    import faiss

    faiss.omp_set_num_threads(threads)

    def call(p):
        index = faiss.IndexFlatL2(3)
        index.add(p)
        d2, idx = index.search(p, K + 1)
        # squared L2 from faiss; self is at rank 0 except for exact duplicates
        return (x[idx[:, 1:]] * np.sqrt(np.maximum(d2[:, 1:], 0))).sum(1)
    return call


def peer_pyg(task, pos, x, r, threads):
    import torch_cluster  # noqa: F401  (raises here: recorded as skipped)
    return None


PEER_FNS = {"tiga": peer_tiga, "ckdtree": peer_ckdtree, "torch_allpairs": peer_torch_allpairs,
            "torch_cdist_topk": peer_torch_cdist_topk, "faiss_flat": peer_faiss_flat,
            "pyg": peer_pyg, "tiga_transposed_csr": peer_tiga_transposed_csr}


def child_run(spec: dict) -> dict:
    task, peer, n, threads = spec["task"], spec["peer"], spec["n"], spec["threads"]
    pos, x = snapshots(n)
    r = cutoff_for(n)
    try:
        make = PEER_FNS[peer](task, pos, x, r, threads)
    except ImportError as e:
        return {"status": "skipped", "reason": f"{peer} does not import here: {e}"}
    if make is None:
        return {"status": "n/a", "reason": f"{peer}: not run for {task} at n={n}"}
    calls = [0]

    def fn():
        calls[0] += 1
        return make(pos[calls[0] % 2])    # new coordinates every call

    mem = H.PeakRSS()
    mem.start()
    t0 = time.perf_counter()
    first = fn()
    first_ms = (time.perf_counter() - t0) * 1e3
    first_peak = mem.stop()
    got = np.asarray(first.numpy() if hasattr(first, "numpy") else first, np.float64)
    want = oracle(task, pos[calls[0] % 2], x.astype(np.float64), r)
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    del first
    mem.start()
    timing = H.time_calls(fn, spec["warmup"], spec["repeat"], spec["budget_s"])
    peak = mem.stop()
    res = {**timing, "status": "ok", "rel_err": err, "first_call_ms": first_ms,
           "peak_rss_first_call_bytes": first_peak, "peak_rss_delta_bytes": peak,
           "peak_rss_method": mem.method, "loadavg_1min": os.getloadavg()[0],
           "numpy_traced_peak_bytes": H.traced_peak_bytes(fn)}
    if peer == "tiga":
        import tiga as tg
        from tiga.xla_free_runtime.cache import CACHE
        res["cache"] = CACHE.stats.as_dict()
        res["tiga_version"] = getattr(tg, "__version__", "dev")
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--tasks", nargs="*", default=["radius", "knn"])
    ap.add_argument("--peers", nargs="*", default=None,
                    help="only these peers (e.g. --peers tiga for a per-point sweep)")
    ap.add_argument("--sizes", nargs="*", type=int, default=None, help="override the sizes")
    ap.add_argument("--child", default=None)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def build_jobs(a) -> list:
    jobs = []
    for task in a.tasks:
        sizes = KNN_SIZES if task == "knn" else RADIUS_SIZES
        if a.sizes:
            sizes = tuple(a.sizes)
        elif a.quick:
            sizes = sizes[:1]
        for n in sizes:
            for peer in PEERS[task]:
                if a.peers is not None and peer not in a.peers:
                    continue
                spec = {"kind": "run", "task": task, "peer": peer, "n": n,
                        "threads": a.threads, "warmup": 1 if a.quick else 2,
                        "repeat": 3 if a.quick else 7, "budget_s": 5 if a.quick else 20}
                jobs.append((f"{task}/{peer}/{n}",
                             [sys.executable, os.path.abspath(__file__), "--child",
                              json.dumps(spec)]))
    return jobs


def _mib(b):
    return "-" if b is None else f"{b / 2 ** 20:.1f}"


def summary(results: list, machine: dict) -> str:
    by = {r["label"]: r for r in results}
    sizes_run = sorted({int(r["label"].rsplit("/", 1)[1]) for r in results})
    lines = [f"machine: {machine.get('cpu_model', '?')}, threads={machine.get('threads_used')}, "
             f"load at start {machine.get('loadavg_at_start')}"]
    for task in ("radius", "knn", "radius_grad"):
        sizes = sizes_run
        if not any(f"{task}/tiga/{n}" in by for n in sizes):
            continue
        lines.append(f"\n{task}: median ms (peak RSS delta MiB / numpy-traced peak MiB) "
                     "[rel err]; ratios = peer / tiga")
        for n in sizes:
            t = by.get(f"{task}/tiga/{n}")
            if t is None:
                continue
            cells = []
            for peer in PEERS[task]:
                r = by.get(f"{task}/{peer}/{n}")
                if r is None:
                    continue
                if r.get("status") != "ok":
                    cells.append(f"{peer}: {r.get('status')}")
                    continue
                ratio = ""
                if peer != "tiga" and t.get("status") == "ok":
                    ratio = (f" x{r['median_ms'] / t['median_ms']:.1f} time, "
                             f"x{_ratio(r['peak_rss_delta_bytes'], t['peak_rss_delta_bytes'])}"
                             " mem")
                cells.append(f"{peer}: {r['median_ms']:.1f} ({_mib(r['peak_rss_delta_bytes'])}/"
                             f"{_mib(r.get('numpy_traced_peak_bytes'))})"
                             f" [{r['rel_err']:.1e}]{ratio}")
            per_point = (f" | tiga {1e6 * t['median_ms'] / n:.0f} ns/point"
                         if t.get("status") == "ok" else "")
            lines.append(f"  n={n}: " + "; ".join(cells) + per_point)
        lines += _flatness(by, task, sizes)
    return "\n".join(lines)


def _flatness(by: dict, task: str, sizes) -> list:
    """Tiga's ns/point over FLAT_RANGE: linear scaling keeps it flat (ratio near 1)."""
    pts = [(n, 1e6 * by[f"{task}/tiga/{n}"]["median_ms"] / n) for n in sizes
           if FLAT_RANGE[0] <= n <= FLAT_RANGE[1]
           and by.get(f"{task}/tiga/{n}", {}).get("status") == "ok"]
    if len(pts) < 2:
        return []
    row = ", ".join(f"{n}: {v:.0f}" for n, v in pts)
    return [f"  tiga ns/point {row}; largest/smallest size ratio "
            f"{pts[-1][1] / pts[0][1]:.2f} (1.0 = linear)"]


def _ratio(a, b):
    if not a or not b:
        return "-"
    return f"{a / b:.2f}"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child is not None:
        spec = json.loads(a.child)
        spec.pop("kind")
        H.child_report(child_run(spec))
        return 0
    env = H.thread_env(a.threads)
    machine = H.machine_info(a.threads)
    machine["code"] = H.code_state(os.path.dirname(RESULTS_DIR) + "/..")
    raw, interrupted = [], False
    for rnd in range(a.rounds):
        res, interrupted = H.run_all(build_jobs(a), a.timeout, env,
                                     desc=f"radius-knn {rnd + 1}/{a.rounds}")
        raw += [{**r, "round": rnd} for r in res]
        if interrupted:
            break
    results = H.best_of_rounds(raw)
    date = datetime.date.today().isoformat()
    path = a.out or os.path.join(RESULTS_DIR,
                                 f"radius_knn-{date}{'-quick' if a.quick else ''}.json")
    H.write_json(path, {"workload": {"degree": DEGREE, "k": K, "seed": SEED,
                                     "dtype": "float32", "dims": 3},
                        "settings": {k: v for k, v in vars(a).items() if k != "child"},
                        "machine": machine, "interrupted": interrupted, "results": results})
    print(summary(results, machine))
    print(f"\nresults: {path}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
