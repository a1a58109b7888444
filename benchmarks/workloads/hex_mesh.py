"""Hex mesh: 16-feature neighbour sum over a structured 3-D hexahedral mesh (the report's
distributed-execution workload on one CPU), stated as a stored CSR and as an implicit stencil."""
from __future__ import annotations

import itertools

import numpy as np

from . import Peer, Workload
from . import _common as C

FEATURES = 16
SIDES = (32, 64)
OFFSETS = tuple(o for o in itertools.product((-1, 0, 1), repeat=3) if o != (0, 0, 0))
TEXT = ("Nonperiodic L x L x L lattice, x-major numbering; a node reads the (up to) 26 nodes "
        "it shares a trilinear hexahedral element with (no self edge). y_i = sum of x_j over "
        f"them, {FEATURES} float32 features. Size = L; N = L^3 nodes.")


def mesh_csr(side: int) -> tuple:
    """Destination-major CSR of the 26-neighbourhood, sources ascending in each row."""
    idx = np.arange(side ** 3, dtype=np.int64).reshape(side, side, side)
    srcs, dsts = [], []
    for off in OFFSETS:
        dst_sl = tuple(slice(max(0, -o), side - max(0, o)) for o in off)
        src_sl = tuple(slice(max(0, o), side - max(0, -o)) for o in off)
        dsts.append(idx[dst_sl].reshape(-1))
        srcs.append(idx[src_sl].reshape(-1))
    src, dst = np.concatenate(srcs), np.concatenate(dsts)
    order = np.lexsort((src, dst))
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=side ** 3))])
    return row_ptr.astype(np.int64), src[order]


def setup(side: int) -> dict:
    row_ptr, col = mesh_csr(side)
    x = np.random.default_rng(C.SEED).standard_normal((side ** 3, FEATURES), dtype=np.float32)
    return {"n": side ** 3, "side": side, "row_ptr": row_ptr, "col": col, "w": None, "x": x}


def expected(d: dict, i: int) -> list:
    """Shifted-slice sums in float64 (independent of the CSR every CSR peer reads)."""
    s = d["side"]
    x = d["x"].astype(np.float64).reshape(s, s, s, -1)
    y = np.zeros_like(x)
    for off in OFFSETS:
        dst_sl = tuple(slice(max(0, -o), s - max(0, o)) for o in off)
        src_sl = tuple(slice(max(0, o), s - max(0, -o)) for o in off)
        y[dst_sl] += x[src_sl]
    return [y.reshape(s ** 3, -1)]


def peer_numpy_slices(d: dict, threads: int):
    """26 shifted-slice adds into a preallocated output: how numpy users write a stencil."""
    s = d["side"]
    x = d["x"].reshape(s, s, s, -1)
    pairs = [(tuple(slice(max(0, -o), s - max(0, o)) for o in off),
              tuple(slice(max(0, o), s - max(0, -o)) for o in off)) for off in OFFSETS]

    def call(i):
        y = np.zeros_like(x)
        for dst_sl, src_sl in pairs:
            y[dst_sl] += x[src_sl]
        return y.reshape(s ** 3, -1)
    return call


def peer_torch_conv3d(d: dict, threads: int):
    """Depthwise conv3d with a 3x3x3 kernel of ones (centre 0), zero padding = nonperiodic
    boundary; channels-last input is converted once outside the timer."""
    torch = C.torch_threads(threads)
    s, f = d["side"], FEATURES
    x = torch.from_numpy(d["x"]).reshape(s, s, s, f).permute(3, 0, 1, 2)[None].contiguous()
    k = torch.ones(f, 1, 3, 3, 3)
    k[:, :, 1, 1, 1] = 0

    def call(i):
        with torch.no_grad():
            y = torch.nn.functional.conv3d(x, k, padding=1, groups=f)
        return y[0].permute(1, 2, 3, 0).reshape(s ** 3, f)
    return call


def peer_tiga_stencil(d: dict, threads: int):
    import tiga as tg

    s = d["side"]
    g = tg.Graph.stencil((s, s, s), OFFSETS)
    x = d["x"]
    return lambda i: tg.propagate(g, lambda src, dst, e: src.x, tg.sum(), src={"x": x})


_CSR_PEERS = {
    "scipy": Peer(C.peer_scipy, ("scipy",), note="scipy.sparse.csr_matrix of ones @ x"),
    "torch.sparse": Peer(C.peer_torch_sparse_csr(False), ("torch",),
                         note="sparse CSR tensor of ones, torch.sparse.mm"),
    "torch index_add": Peer(C.peer_torch_index_add(False), ("torch",),
                            note="index_select, index_add_"),
    "pyg": Peer(C.peer_pyg(False), ("torch_geometric",),
                note="MessagePassing(aggr='sum'), edge_index sorted by destination"),
    "tiga": Peer(C.peer_tiga(False), tiga=True, note="tg.propagate over Graph.from_csr"),
}
_STENCIL_PEERS = {
    "numpy slices": Peer(peer_numpy_slices, note="26 shifted-slice adds"),
    "torch conv3d": Peer(peer_torch_conv3d, ("torch",),
                         note="depthwise conv3d, 3x3x3 ones kernel, centre 0"),
    "tiga": Peer(peer_tiga_stencil, tiga=True, note="tg.propagate over Graph.stencil"),
}
WORKLOADS = [
    Workload("hex_mesh.csr", "Hex mesh neighbour sum, stored CSR", TEXT, SIDES, setup, expected,
             _CSR_PEERS, size_label="L"),
    Workload("hex_mesh.stencil", "Hex mesh neighbour sum, implicit stencil", TEXT, SIDES,
             setup, expected, _STENCIL_PEERS, size_label="L"),
]
