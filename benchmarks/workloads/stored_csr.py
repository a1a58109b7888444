"""Stored CSR: y[i] = sum_e w_e * x[col_e] over a random destination-major CSR relation."""
from __future__ import annotations

from . import Peer, Workload
from . import _common as C

DEGREE, FEATURES = 32, 32
SIZES = (8192, 32768, 131072)
TEXT = (f"Each of N destinations reads {DEGREE} distinct sources drawn uniformly (seed 0, "
        f"sorted in the row), {FEATURES} float32 features, float32 edge weights, int64 "
        "indices. `step`: gradients of `y.sum()` w.r.t. `x` and `w` (torch autograd, "
        "`tg.grad`).")


def setup(n: int) -> dict:
    return C.random_csr(n, DEGREE, FEATURES)


def _peers(grad: bool) -> dict:
    torch = ("torch",)
    peers = {} if grad else {"scipy": Peer(C.peer_scipy, ("scipy",),
                                           note="scipy.sparse.csr_matrix @ x")}
    peers.update({
        "torch.sparse": Peer(C.peer_torch_sparse_csr(grad), torch,
                             note="sparse CSR tensor, torch.sparse.mm"),
        "torch index_add": Peer(C.peer_torch_index_add(grad), torch,
                                note="index_select, scale, index_add_"),
        "pyg": Peer(C.peer_pyg(grad), ("torch_geometric",),
                    note="MessagePassing(aggr='sum'), edge_index sorted by destination"),
        "tiga": Peer(C.peer_tiga(grad), tiga=True, note="tg.MessagePassing, Graph.from_csr"),
    })
    return peers


WORKLOADS = [
    Workload("stored_csr.fwd", "Stored CSR weighted sum, forward", TEXT, SIZES, setup,
             lambda d, i: C.csr_forward64(d), _peers(False)),
    Workload("stored_csr.step", "Stored CSR weighted sum, forward + backward", TEXT, SIZES,
             setup, lambda d, i: C.csr_grads64(d), _peers(True), tol_scale=2.0),
]
