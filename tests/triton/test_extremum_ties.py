"""max/min gradients with ties in Triton's interpreter, strictly (no reference runs): the
cotangent of a row goes to its first extremal edge, the edge order read from the endpoints
on implicit relations (autodiff/rules/edge_order.py) and from the edge ids on stored ones.
Oracle: the reference interpreter running the whole program."""
import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad

RELATIONS = {
    "dense": lambda: tg.Graph.dense(6, 4),
    "cu_seqlens": lambda: tg.Graph.cu_seqlens([0, 3, 3, 7], causal=False),
    "stencil": lambda: tg.Graph.stencil((3, 4), [(0, 1), (1, -3), (-1, 2), (0, 0)]),
    "stencil-periodic": lambda: tg.Graph.stencil((3, 4), [(0, 1), (-1, 0), (2, 3)],
                                                 periodic=True),
    "csr": lambda: tg.Graph.from_coo(np.array([2, 0, 1, 3, 1, 0, 2, 0, 2, 2]),
                                     np.array([2, 0, 2, 4, 2, 4, 0, 2, 1, 1]),
                                     num_src=4, num_dst=5),
}


class Top(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return src.x + dst.y * 2.0 + edge.w


@pytest.mark.parametrize("kind, name", [("dense", "max"), ("cu_seqlens", "min"),
                                        ("stencil", "max"), ("stencil-periodic", "min"),
                                        ("csr", "max")])
def test_ties_match_the_reference(interpreter, kind, name):
    g = RELATIONS[kind]()
    layer = Top(getattr(tg, name)())
    rng = np.random.default_rng(len(kind))
    x = rng.integers(0, 3, (g.num_src, 2)).astype(np.float64)
    y = rng.integers(0, 2, (g.num_dst, 2)).astype(np.float64)
    w = rng.integers(0, 3, (g.num_edges, 2)).astype(np.float64)
    ct = rng.standard_normal((g.num_dst, 2))

    def loss(x, y, w, ref=False):
        fn = layer.reference if ref else layer
        return (fn(graph=g, src={"x": x}, dst={"y": y}, edge={"w": w}) * ct).sum()

    got = tg.grad(loss, argnums=(0, 1, 2))(x, y, w)
    if kind != "csr":
        assert g._csr is None     # walked from indices: the CSR was never built
    want = reference_grad(lambda *a: loss(*a, ref=True), argnums=(0, 1, 2))(x, y, w)
    for a, b in zip(got, want):
        # (a cotangent sent to another edge is off by O(1); sums may round differently)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
