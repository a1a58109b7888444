"""Generated relations under triton-interpreter: radius walked through a cell directory built
on the launch device (exact distance test inside the propagate kernel) and kNN lists selected
by a Triton kernel (nearest first, ties by the smaller index), with edge.displacement /
edge.distance in the edge function. Oracles: the reference interpreter (forward) and
float64 central differences of the reference (gradients to positions and features)."""
import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.reports.runs import COUNTERS


class Geo(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return tg.math.exp(-edge.distance)[..., None] * src.x + \
            (edge.displacement * dst.h).sum(axis=-1, keepdims=True)


class Weighted(tg.MessagePassing):     # an edge field: numbered as the reference numbers
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x * edge.w + edge.distance[..., None]


def lattice_points(n, seed, dims=3):
    """Distinct points of a 5^dims lattice, jittered: near-equal distances, none zero."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(5)] * dims, indexing="ij"), -1).reshape(-1, dims)
    return grid[rng.choice(len(grid), n, replace=False)] / 4.0 + \
        rng.normal(0, 1e-3, (n, dims))


def relation(kind, pos, query=None):
    if kind == "knn":
        return tg.Graph.knn(pos, 5, query=query)
    return tg.Graph.radius(pos, 0.45, query=query)


def central_difference(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        a, b = x.copy(), x.copy()
        a[i] += eps
        b[i] -= eps
        g[i] = (f(a) - f(b)) / (2 * eps)
    return g


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_forward_and_grad_to_positions(interpreter, kind):
    n = 24   # (the radius cell walk in 2-D: 9 cells a row, quick in the interpreter)
    pos = lattice_points(n, 3, dims=2 if kind == "radius" else 3)
    rng = np.random.default_rng(4)
    x, ct = (rng.standard_normal((n, 3)) for _ in range(2))
    h = rng.standard_normal((n, pos.shape[1]))
    before = COUNTERS.copy()

    def loss(p, x, h, ref=False):
        ops = dict(graph=relation(kind, p), src={"x": x}, dst={"h": h})
        if ref:
            return float((np.asarray(Geo().reference(**ops)) * ct).sum())
        return (Geo()(**ops) * ct).sum()

    y = Geo()(graph=relation(kind, pos), src={"x": x}, dst={"h": h})
    want = Geo().reference(graph=relation(kind, pos), src={"x": x}, dst={"h": h})
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-12, atol=1e-12)
    stat = "radius_directories" if kind == "radius" else "knn_selects"
    assert COUNTERS[stat] > before[stat]
    got = tg.grad(loss, argnums=(0, 1, 2))(pos, x, h)
    args = [pos, x, h]
    for i, name in enumerate(("positions", "x", "h")):
        def f(v, i=i):
            a = list(args)
            a[i] = v
            return loss(*a, ref=True)
        np.testing.assert_allclose(np.asarray(got[i]), central_difference(f, args[i]),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind", ["radius", "knn"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_query_sets_edge_fields_and_ties(interpreter, kind, dtype):
    rng = np.random.default_rng(9)
    pos = (rng.integers(0, 4, (30, 2)) / 4.0).astype(dtype)      # duplicates and ties
    query = (rng.integers(0, 4, (11, 2)) / 4.0).astype(dtype)
    for q in (None, query):
        g = relation(kind, pos, q)
        x = rng.standard_normal((30, 2)).astype(dtype)
        ops = dict(graph=g, src={"x": x}, dst={"h": np.zeros((g.num_dst, 2), dtype)})
        got, want = Geo()(**ops), Geo().reference(**ops)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
        if kind == "knn":
            w = rng.uniform(0.5, 1.5, (g.num_edges, 1)).astype(dtype)
            ops = dict(graph=g, src={"x": x}, edge={"w": w})
            np.testing.assert_allclose(np.asarray(Weighted()(**ops)),
                                       np.asarray(Weighted().reference(**ops)), rtol=tol,
                                       atol=tol)


def test_explain_names_the_cell_walk(interpreter):
    g = relation("radius", lattice_points(20, 1))
    ones = np.ones((20, 3))
    text = str(Geo().explain(graph=g, src={"x": ones}, dst={"h": ones}))
    assert "route:      triton-interpreter" in text
    assert "cell directory" in text and "block_rows=" in text
