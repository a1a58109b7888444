"""Helpers the workload modules share: thread setup of each library, CSR inputs and the
sparse-sum peers every stored relation (random CSR, hex mesh) is measured against."""
from __future__ import annotations

import warnings

import numpy as np

SEED = 0


def torch_threads(threads: int):
    """torch with its intra-op pool at `threads` (and its beta-sparse warnings silenced)."""
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    return torch


def random_csr(n: int, degree: int, features: int, seed: int = SEED) -> dict:
    """Destination-major CSR: each of n destinations reads `degree` distinct sources drawn
    uniformly, sorted in the row (distinct, so torch's sparse-CSR backward, which merges
    duplicates, stays well defined). float32 weights and features, int64 indices."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, n, size=(n, degree)), axis=1)
    while True:  # redraw rows holding a repeated source until every row is duplicate-free
        bad = np.nonzero((np.diff(cols, axis=1) == 0).any(axis=1))[0]
        if bad.size == 0:
            break
        cols[bad] = np.sort(rng.integers(0, n, size=(bad.size, degree)), axis=1)
    row_ptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
    return {"n": n, "row_ptr": row_ptr, "col": cols.reshape(-1).astype(np.int64),
            "w": rng.standard_normal(n * degree, dtype=np.float32),
            "x": rng.standard_normal((n, features), dtype=np.float32)}


def dst_of(row_ptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(row_ptr) - 1, dtype=np.int64), np.diff(row_ptr))


# ---------------------------------------------------------------- oracles (float64)
def csr_forward64(d: dict) -> list:
    import scipy.sparse as sp

    a = sp.csr_matrix((weights(d).astype(np.float64), d["col"], d["row_ptr"]),
                      shape=(d["n"], d["n"]))
    return [a @ d["x"].astype(np.float64)]


def weights(d: dict) -> np.ndarray:
    """The edge weights; an unweighted relation (d["w"] None) is a matrix of ones."""
    return d["w"] if d.get("w") is not None else np.ones(len(d["col"]), np.float32)


def csr_grads64(d: dict) -> list:
    """Gradients of sum(y) for y = A(w) x: dx[s, :] = sum of w over edges reading s,
    dw_e = sum_f x[col_e, f]."""
    x64 = d["x"].astype(np.float64)
    gx = np.bincount(d["col"], weights=d["w"].astype(np.float64), minlength=d["n"])
    return [np.repeat(gx[:, None], x64.shape[1], axis=1), x64.sum(1)[d["col"]]]


# ---------------------------------------------------------------- peers of y = A(w) x
def peer_scipy(d: dict, threads: int):
    import scipy.sparse as sp

    a = sp.csr_matrix((weights(d), d["col"], d["row_ptr"]), shape=(d["n"], d["n"]))
    x = d["x"]
    return lambda i: a @ x


def _autograd_step(x, w, f):
    """Gradient of f(x, w).sum() w.r.t. x and w, as a torch user writes a training step."""
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step(i):
        xr.grad = wr.grad = None
        f(xr, wr).sum().backward()
        return xr.grad, wr.grad
    return step


def peer_torch_sparse_csr(grad: bool):
    """torch.sparse.mm on a sparse CSR tensor (the layout torch's CPU SpMM is fastest on)."""
    def factory(d: dict, threads: int):
        torch = torch_threads(threads)
        n = d["n"]
        rp, col = torch.from_numpy(d["row_ptr"]), torch.from_numpy(d["col"])
        x, w = torch.from_numpy(d["x"]), torch.from_numpy(weights(d))
        matrix = lambda vals: torch.sparse_csr_tensor(rp, col, vals, (n, n))
        if not grad:
            a = matrix(w)
            return lambda i: torch.sparse.mm(a, x)
        return _autograd_step(x, w, lambda xx, ww: torch.sparse.mm(matrix(ww), xx))
    return factory


def peer_torch_index_add(grad: bool):
    """Gather the source rows, scale, index_add_ into the destinations."""
    def factory(d: dict, threads: int):
        torch = torch_threads(threads)
        n = d["n"]
        col, dst = torch.from_numpy(d["col"]), torch.from_numpy(dst_of(d["row_ptr"]))
        x, w = torch.from_numpy(d["x"]), torch.from_numpy(weights(d))
        weighted = d.get("w") is not None

        def f(xx, ww):
            msg = xx.index_select(0, col)
            msg = msg * ww.unsqueeze(1) if weighted else msg
            return torch.zeros(n, xx.shape[1], dtype=xx.dtype).index_add_(0, dst, msg)
        return (lambda i: f(x, w)) if not grad else _autograd_step(x, w, f)
    return factory


def peer_pyg(grad: bool):
    """A PyG MessagePassing layer (sum aggregation) over edge_index sorted by destination."""
    def factory(d: dict, threads: int):
        torch = torch_threads(threads)
        from torch_geometric.nn import MessagePassing

        class WeightedSum(MessagePassing):
            def __init__(self):
                super().__init__(aggr="sum")

            def forward(self, x, edge_index, w):
                return self.propagate(edge_index, x=x, w=w)

            def message(self, x_j, w):
                return x_j if w is None else x_j * w.unsqueeze(-1)

        ei = torch.stack([torch.from_numpy(d["col"]), torch.from_numpy(dst_of(d["row_ptr"]))])
        w = None if d.get("w") is None else torch.from_numpy(d["w"])
        layer, x = WeightedSum(), torch.from_numpy(d["x"])
        f = lambda xx, ww: layer(xx, ei, ww)
        return (lambda i: f(x, w)) if not grad else _autograd_step(x, w, f)
    return factory


def peer_tiga(grad: bool):
    """tg.MessagePassing over tg.Graph.from_csr; gradients by tg.grad (numpy in, numpy out)."""
    def factory(d: dict, threads: int):
        import tiga as tg

        class WeightedSum(tg.MessagePassing):
            reducer = tg.sum()

            def edge(self, src, dst, edge):
                return src.x * edge.w

        g = tg.Graph.from_csr(d["row_ptr"], d["col"], num_src=d["n"])
        m, x, w = WeightedSum(), d["x"], d["w"]
        call = lambda xx, ww: m(graph=g, src={"x": xx}, dst={}, edge={"w": ww})
        if w is None:   # unweighted: the plain neighbour sum
            return lambda i: tg.propagate(g, lambda s, t, e: s.x, tg.sum(), src={"x": x})
        if not grad:
            return lambda i: call(x, w)
        step = tg.grad(lambda xx, ww: call(xx, ww).sum(), argnums=(0, 1))
        return lambda i: step(x, w)
    return factory
