"""The cell-tiled radius body (lower/triton/cell_tiles.py) under triton-interpreter: a
program's rows are consecutive in cell order (one point set) or in query order (a query
set) and walk their neighbour cells as [rows, candidates] tiles. Against the reference
interpreter: sum, mean, max and online_softmax, 1-3 coordinates, with and without loops, a
query set, isolated points (rows without neighbours), duplicate points, and the gradients
(the VJP's walk by source of one point set is cell-tiled too)."""
import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad


def layer(reducer):
    class Radius(tg.MessagePassing):
        def edge(self, src, dst, edge):
            m = src.x * 2.0 - dst.h
            if reducer == "online_softmax":
                return self.reducer((src.x * dst.h).sum(axis=-1), m)
            return m
    Radius.reducer = getattr(tg, reducer)()
    return Radius()


def points(n, dims, seed):
    rng = np.random.default_rng(seed)
    pos = rng.random((n, dims))
    pos[-3:] = 5.0 + np.arange(3)[:, None]        # isolated: rows without neighbours
    pos[1] = pos[0]                               # a duplicate point
    return pos, rng


CASES = [("sum", 3, False, None), ("mean", 2, True, None), ("max", 1, False, None),
         ("online_softmax", 2, False, None), ("sum", 2, False, 40)]


@pytest.mark.parametrize("reducer,dims,loop,queries", CASES)
def test_cell_tiles_match_the_reference(interpreter, reducer, dims, loop, queries):
    pos, rng = points(120, dims, seed=dims)
    query = None if queries is None else rng.random((queries, dims))
    g = tg.Graph.radius(pos, 0.25, query=query, loop=loop)
    x = rng.normal(size=(120, 6))
    h = rng.normal(size=(120 if query is None else queries, 6))
    kw = dict(graph=g, src={"x": x}, dst={"h": h})
    text = layer(reducer).ir("triton", **kw)
    assert "row_order" in text and "BLOCK_R * BLOCK_N" in text
    np.testing.assert_allclose(np.asarray(layer(reducer)(**kw)),
                               np.asarray(layer(reducer).reference(**kw)),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reducer", ["sum", "mean"])
def test_cell_tiles_gradients(interpreter, reducer):
    pos, rng = points(90, 2, seed=9)
    g = tg.Graph.radius(pos, 0.3)
    x, h = rng.normal(size=(90, 5)), rng.normal(size=(90, 5))
    m = layer(reducer)

    def loss(x, h, ref=False):
        fn = m.reference if ref else m
        return (fn(graph=g, src={"x": x}, dst={"h": h}) ** 2).sum()

    got = tg.grad(loss, argnums=(0, 1))(x, h)
    want = reference_grad(lambda a, b: loss(a, b, True), argnums=(0, 1))(x, h)
    for a, b, name in zip(got, want, "xh"):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10,
                                   err_msg=f"d{name}")


@pytest.mark.parametrize("dims,k,queries,loop,dtype", [(3, 8, None, False, np.float64),
                                                       (2, 5, 70, False, np.float32),
                                                       (1, 4, None, True, np.float64)])
def test_knn_tiles_equal_the_reference_lists(interpreter, dims, k, queries, loop, dtype):
    """knn_tiles (a program per 16 rows in cell order) over a few hundred points with an
    outlier cluster and duplicates: each row's list is the reference's exact one."""
    from tiga.core import graph_generated as geo
    from tiga.xla_free_runtime.backends.triton import generated as triton_generated

    pos, rng = points(260, dims, seed=dims + k)
    pos[:4] = pos[4]                              # ties by index
    pos, query = pos.astype(dtype), None
    if queries:
        query = (rng.random((queries, dims)) * 1.2 - 0.1).astype(dtype)
    g = tg.Graph.knn(pos, k, query=query, loop=loop)
    walk = triton_generated.generated_walk(g, ("csr",), "cpu")
    _, want = geo.knn_csr(pos, query, k, loop)
    np.testing.assert_array_equal(walk["col_idx"].numpy()[:len(want)], want)
