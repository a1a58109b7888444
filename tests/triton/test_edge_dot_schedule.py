"""The Triton schedule of an edge MLP whose per-edge layer is a tl.dot (select_kernel_schedule
sizes row tiles by what the tile holds per edge: the weight of a tl.dot is held once per
program, so a 32 x 32 layer no longer counts 1024 elements per edge and the walk takes the
row-tiled body). In Triton's interpreter against the reference interpreter, forward and
tg.grad; an input too wide for two rows per tile keeps the row loop, still with tl.dot."""
import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad

TILED = "BLOCK_R * BLOCK_N"


class MaxMLP(tg.MessagePassing):
    """A per-edge layer the max reducer keeps per edge (hoist_linear moves none of it)."""

    reducer = tg.max()

    def edge(self, src, dst, edge, w):
        return tg.math.tanh(src.x - dst.x) @ w


def case(n, f, hidden, dtype, seed):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 6, n)
    deg[1] = 0                                              # an empty row
    rp = np.concatenate([[0], np.cumsum(deg)])
    g = tg.Graph.from_csr(rp, rng.integers(0, n, rp[-1]).astype(np.int32), num_src=n)
    return g, rng.standard_normal((n, f)).astype(dtype), \
        (rng.standard_normal((f, hidden)) / np.sqrt(f)).astype(dtype)


def call(g, x, w, ref=False):
    layer = MaxMLP()
    return (layer.reference if ref else layer)(graph=g, src={"x": x}, dst={"x": x}, w=w)


def check(g, x, w, tol):
    np.testing.assert_allclose(np.asarray(call(g, x, w)), np.asarray(call(g, x, w, True)),
                               rtol=tol, atol=tol)
    got = tg.grad(lambda *a: call(g, *a).sum(), argnums=(0, 1))(x, w)
    want = reference_grad(lambda *a: call(g, *a, ref=True).sum(), argnums=(0, 1))(x, w)
    for a, b, name in zip(got, want, ("x", "w")):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol,
                                   err_msg=name)


@pytest.mark.parametrize("f,hidden,dtype,tol", [(32, 32, np.float32, 2e-5),
                                                (20, 24, np.float64, 1e-11),
                                                (17, 40, np.float32, 2e-5)])
def test_tl_dot_layer_takes_row_tiles(interpreter, f, hidden, dtype, tol):
    g, x, w = case(37, f, hidden, dtype, seed=f + hidden)
    text = MaxMLP().ir("triton", graph=g, src={"x": x}, dst={"x": x}, w=w)
    assert TILED in text and "tl.dot(" in text
    check(g, x, w, tol)


def test_wide_input_keeps_the_row_loop_with_tl_dot(interpreter):
    """256 inputs per edge: one row per 4096-element tile, so the row loop (16 lanes)."""
    g, x, w = case(19, 256, 16, np.float32, seed=3)
    text = MaxMLP().ir("triton", graph=g, src={"x": x}, dst={"x": x}, w=w)
    assert TILED not in text and "tl.dot(" in text
    check(g, x, w, 1e-4)


def test_narrow_weight_still_counts_per_edge(interpreter):
    """An 8 x 12 weight is a broadcast product (tl.dot needs 16 on both sides): its 8 x 16
    padded elements count per edge, the tile is sized as before, and the values agree."""
    g, x, w = case(21, 8, 12, np.float32, seed=4)
    text = MaxMLP().ir("triton", graph=g, src={"x": x}, dst={"x": x}, w=w)
    assert "tl.dot(" not in text
    check(g, x, w, 2e-5)
