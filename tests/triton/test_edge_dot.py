"""A per-edge layer of an edge MLP (one the max reducer keeps per edge: hoist_linear moves
only a first layer, or a last one under sum) as one tl.dot of the edge tile times the
weight, in Triton's interpreter: widths that pad to 16 or more (not multiples of 16), the
row loop and the row-tiled body, float32 and float64, forward and gradients against the
reference interpreter; narrower weights keep the broadcast product."""
import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad


class MaxMLP(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge, w2):
        return tg.math.relu(src.x - dst.x) @ w2


def case(n, f, hidden, dtype, deg=3, seed=0):
    rng = np.random.default_rng(seed)
    rp = np.arange(n + 1) * deg
    rp[3:] -= deg                                           # row 2 has no edges
    g = tg.Graph.from_csr(rp, rng.integers(0, n, rp[-1]).astype(np.int32), num_src=n)
    return g, rng.standard_normal((n, f)).astype(dtype), \
        (rng.standard_normal((f, hidden)) / 3).astype(dtype)


def call(g, x, w2, ref=False):
    layer = MaxMLP()
    fn = layer.reference if ref else layer
    return fn(graph=g, src={"x": x}, dst={"x": x}, w2=w2)


@pytest.mark.parametrize("f,hidden,dtype,tol", [(20, 24, np.float32, 1e-5),
                                                (17, 16, np.float64, 1e-11),
                                                (32, 40, np.float32, 1e-5)])
def test_per_edge_layer_is_one_tile_dot(interpreter, f, hidden, dtype, tol):
    g, x, w2 = case(21, f, hidden, dtype)
    text = MaxMLP().ir("triton", graph=g, src={"x": x}, dst={"x": x}, w2=w2)
    assert "tl.dot(" in text
    np.testing.assert_allclose(np.asarray(call(g, x, w2)), np.asarray(call(g, x, w2, True)),
                               rtol=tol, atol=tol)
    got = tg.grad(lambda *a: call(g, *a).sum(), argnums=(0, 1))(x, w2)
    want = reference_grad(lambda *a: call(g, *a, ref=True).sum(), argnums=(0, 1))(x, w2)
    for a, b, name in zip(got, want, ("x", "w2")):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol,
                                   err_msg=name)


def test_narrow_weights_keep_the_broadcast_product(interpreter):
    g, x, w2 = case(9, 5, 6, np.float32)
    text = MaxMLP().ir("triton", graph=g, src={"x": x}, dst={"x": x}, w2=w2)
    assert "tl.dot(" not in text
    np.testing.assert_allclose(np.asarray(call(g, x, w2)), np.asarray(call(g, x, w2, True)),
                               rtol=1e-5, atol=1e-6)
