"""Benchmark: exact kNN in feature space (k = 20, 64 dims, as DGCNN) against faiss and others.

    .venv/bin/python benchmarks/knn_features.py --quick          # N = 4096 only
    .venv/bin/python benchmarks/knn_features.py                  # N = 4096, 16384, 65536
    .venv/bin/python benchmarks/knn_features.py --sizes 16384 --out /tmp/knn.json

Peers: faiss IndexFlatL2 (pip faiss-cpu), torch.cdist + topk (chunked over queries so the
distance block stays bounded), scikit-learn NearestNeighbors(algorithm="brute"). Every peer
runs in its own fresh process with the same thread count (--threads, default 2) for every
library (OpenMP, BLAS, torch, Tiga's pool). Each searches the N points against themselves
(self included, as DGCNN). Tiga's time is one propagate over `tg.Graph.knn(x, 20, loop=True)`
(relation built, kNN selected by the knn-tiled-scan walk, one trivial value folded per
edge). The median of --repeat timed calls (after one warm-up) is reported, as JSON.

Checks, outside the timer: every peer's neighbour sets equal Tiga's up to distance ties
(where a row's sets differ, the float64 distances of both sets, sorted, agree to float32
rounding). Data: a 64-cluster Gaussian mixture in float32 (features are clustered).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

K, DIMS = 20, 64
SIZES = (4096, 16384, 65536)
PEERS = ("tiga", "faiss", "torch", "sklearn")
QUERY_CHUNK = 1024       # torch: queries per cdist block (1024 x 65536 floats = 256 MiB)


def features(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, DIMS)).astype(np.float32) * 2.0
    labels = rng.integers(0, 64, n)
    return (centres[labels] + rng.standard_normal((n, DIMS)).astype(np.float32))


def _time(fn, repeat: int) -> tuple:
    out = fn()      # warm-up (compiles, allocates)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return times, out


def run_tiga(x, threads, repeat):
    import tiga as tg

    class Fold(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.v

    v = np.zeros((len(x), 1), np.float32)
    graphs = []

    def call():
        g = tg.Graph.knn(x, K, loop=True)
        Fold()(graph=g, src={"v": v})
        graphs.append(g)
        return g

    times, g = _time(call, repeat)
    # the ids the timed call selected (kept on the relation for its VJP; a public
    # resolve_csr() would redo the selection in the numpy reference)
    ids = np.asarray(g.params["_knn_cols"]).reshape(len(x), K)
    explain = str(Fold().explain(graph=tg.Graph.knn(x, K, loop=True), src={"v": v}))
    walk = "knn-tiled-scan" if "knn-tiled-scan" in explain else "other"
    return times, ids, {"walk": walk}


def run_faiss(x, threads, repeat):
    import faiss

    faiss.omp_set_num_threads(threads)

    def call():
        index = faiss.IndexFlatL2(DIMS)
        index.add(x)
        return index.search(x, K)[1]

    times, ids = _time(call, repeat)
    return times, ids, {"version": faiss.__version__}


def run_torch(x, threads, repeat):
    import torch

    torch.set_num_threads(threads)
    t = torch.from_numpy(x)

    def call():
        out = []
        for s in range(0, len(t), QUERY_CHUNK):
            d = torch.cdist(t[s:s + QUERY_CHUNK], t)
            out.append(d.topk(K, dim=1, largest=False).indices)
        return torch.cat(out).numpy()

    times, ids = _time(call, repeat)
    return times, ids, {"version": torch.__version__}


def run_sklearn(x, threads, repeat):
    import sklearn
    from sklearn.neighbors import NearestNeighbors
    from threadpoolctl import threadpool_limits

    def call():
        with threadpool_limits(threads):
            nn = NearestNeighbors(n_neighbors=K, algorithm="brute", n_jobs=threads).fit(x)
            return nn.kneighbors(x, return_distance=False)

    times, ids = _time(call, repeat)
    return times, ids, {"version": sklearn.__version__}


def worker(peer: str, n: int, threads: int, repeat: int, ids_path: str) -> None:
    x = features(n)
    try:
        times, ids, info = globals()[f"run_{peer}"](x, threads, repeat)
    except ImportError as exc:
        print(json.dumps({"peer": peer, "n": n, "skipped": f"not installed ({exc})"}))
        return
    np.save(ids_path, np.asarray(ids, np.int64))
    print(json.dumps({"peer": peer, "n": n, "median_s": statistics.median(times),
                      "times_s": times, **info}))


def same_up_to_ties(x: np.ndarray, ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Rows whose neighbour sets differ, and whether every such difference is a tie."""
    diff = [i for i in range(len(x)) if set(ours[i].tolist()) != set(theirs[i].tolist())]
    x64 = x.astype(np.float64)
    ties = 0
    for i in diff:
        a = np.sort(np.linalg.norm(x64[ours[i]] - x64[i], axis=1))
        b = np.sort(np.linalg.norm(x64[theirs[i]] - x64[i], axis=1))
        ties += bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))
    return {"rows_differing": len(diff), "all_ties": ties == len(diff)}


def env_for(threads: int) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "TIGA_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = str(threads)
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 4096 only")
    p.add_argument("--sizes", nargs="+", type=int, default=None)
    p.add_argument("--peers", nargs="+", default=list(PEERS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--worker", nargs=2, metavar=("PEER", "N"), help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker[0], int(a.worker[1]), a.threads, a.repeat, a.ids)
        return 0
    sizes = a.sizes or ((SIZES[0],) if a.quick else SIZES)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            ids = {}
            for peer in ["tiga"] + [q for q in a.peers if q != "tiga"]:
                path = os.path.join(tmp, f"{peer}-{n}.npy")
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", peer, str(n),
                       "--threads", str(a.threads), "--repeat", str(a.repeat), "--ids", path]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env_for(a.threads))
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode or not lines:
                    results.append({"peer": peer, "n": n, "failed": proc.stderr[-2000:]})
                    continue
                row = json.loads(lines[-1])
                if os.path.exists(path):
                    ids[peer] = np.load(path)
                    if peer != "tiga" and "tiga" in ids:
                        row["check"] = same_up_to_ties(features(n), ids["tiga"], ids[peer])
                results.append(row)
                print(json.dumps(row), file=sys.stderr)
            tiga = next((r for r in results if r["peer"] == "tiga" and r["n"] == n
                         and "median_s" in r), None)
            for r in results:
                if tiga and r["n"] == n and "median_s" in r and r["peer"] != "tiga":
                    r["tiga_speedup"] = r["median_s"] / tiga["median_s"]
    report = {"benchmark": "knn_features", "k": K, "dims": DIMS, "threads": a.threads,
              "repeat": a.repeat, "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    bad = [r for r in results if not r.get("check", {"all_ties": True})["all_ties"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
