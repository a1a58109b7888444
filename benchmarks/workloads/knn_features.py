"""Feature-space kNN (DGCNN's EdgeConv relation): k = 20 nearest of N points in 64 dims, self
included, rebuilt every call. Inputs and sizes come from benchmarks/knn_features.py (the
stand-alone study of that workload); here every peer also folds its distances into
y_i = sum of the k smallest |x_j - x_i| (continuous across distance ties), so each call is
checked against a float64 oracle on a seeded sample of rows."""
from __future__ import annotations

import numpy as np

from . import Peer, Workload
from . import _common as C

try:   # the stand-alone script owns the inputs; without it this workload is not offered
    import knn_features as KF
except ImportError:
    KF = None

CHECK_ROWS = 256   # exact float64 kNN of every row would cost more than all the peers
TEXT = ("N points of a 64-cluster Gaussian mixture in 64 float32 dims "
        "(`benchmarks/knn_features.py`); every call selects the k = 20 nearest of each point "
        "(self included) and returns y_i = sum of their distances. Checked on "
        f"{CHECK_ROWS} seeded rows against float64 brute force.")


def setup(n: int) -> dict:
    rows = np.sort(np.random.default_rng(C.SEED).choice(n, min(n, CHECK_ROWS), replace=False))
    return {"x": KF.features(n), "rows": rows}


def expected(d: dict, i: int) -> tuple:
    x64 = d["x"].astype(np.float64)
    q = x64[d["rows"]]
    # expanded form in float64: its rounding (~1e-13 relative) is far below float32's
    dist = np.sqrt(np.maximum((q * q).sum(1)[:, None] + (x64 * x64).sum(1)[None]
                              - 2 * q @ x64.T, 0))
    y = np.zeros(len(x64))
    y[d["rows"]] = np.sort(dist, axis=1)[:, :KF.K].sum(1)
    mask = np.zeros(len(x64), bool)
    mask[d["rows"]] = True
    return [y], mask


def tiga(d: dict, threads: int):
    import tiga as tg

    x = d["x"]
    edge = lambda src, dst, e: e.distance
    return lambda i: tg.propagate(tg.Graph.knn(x, KF.K, loop=True), edge, tg.sum())


def faiss_flat(d: dict, threads: int):
    import faiss

    faiss.omp_set_num_threads(threads)
    x = d["x"]

    def call(i):
        index = faiss.IndexFlatL2(x.shape[1])
        index.add(x)
        d2 = index.search(x, KF.K)[0]
        return np.sqrt(np.maximum(d2, 0)).sum(1)
    return call


def torch_cdist(d: dict, threads: int):
    torch = C.torch_threads(threads)
    t = torch.from_numpy(d["x"])

    def call(i):
        out = torch.empty(len(t))
        for s in range(0, len(t), KF.QUERY_CHUNK):
            dist = torch.cdist(t[s:s + KF.QUERY_CHUNK], t)
            out[s:s + KF.QUERY_CHUNK] = dist.topk(KF.K, dim=1, largest=False).values.sum(1)
        return out
    return call


def sklearn_brute(d: dict, threads: int):
    from sklearn.neighbors import NearestNeighbors
    from threadpoolctl import threadpool_limits

    x = d["x"]

    def call(i):
        with threadpool_limits(threads):
            nn = NearestNeighbors(n_neighbors=KF.K, algorithm="brute", n_jobs=threads).fit(x)
            return nn.kneighbors(x)[0].sum(1)
    return call


WORKLOADS = [] if KF is None else [
    Workload("knn_features.fwd", "Feature-space kNN (64 dims, k = 20), rebuilt every call",
             TEXT, tuple(KF.SIZES), setup, expected, {
                 "faiss": Peer(faiss_flat, ("faiss",), note="IndexFlatL2 (exact)"),
                 "torch cdist+topk": Peer(torch_cdist, ("torch",),
                                          note=f"chunks of {KF.QUERY_CHUNK} queries"),
                 "sklearn": Peer(sklearn_brute, ("sklearn",),
                                 note="NearestNeighbors(algorithm='brute')"),
                 "tiga": Peer(tiga, tiga=True, note="tg.Graph.knn(x, 20, loop=True)")},
             # faiss's and torch's expanded-form float32 distances put ~sqrt(eps |x|^2),
             # about 0.005, on the self distance: up to ~1e-4 of the sum, by construction
             tol_scale=5.0, extra={"warmup": 1})]
