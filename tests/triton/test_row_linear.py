"""Entity-level linear layers as tl.dot tiles (lower/triton/linear.py, in Triton's
interpreter): the products hoist_linear moves out of an edge MLP, `Z = X W`, and their VJP's
`dZ W^T` and `X^T dZ`, against numpy's matmul: float32 tightly, float64 to rounding,
float16 loosely; widths that are not multiples of 16 (padded, masked), a tiny contracted
axis, zero rows, NaN and inf where numpy puts them. Then an EdgeNN layer (EdgeConv's message
summed, whose first Linear is hoisted) on an ordinary triton-interpreter call: forward and
gradients against the reference interpreter, its products run as tile_matmul (one per field
and role: the hoisted x_dst (W_a - W_b) is one product); on cpu-llvm the rule declines and
the same layer gives the same values (numpy's products)."""
import numpy as np
import pytest

import tiga as tg
from tiga.core.prims.linalg import dot_general_p
from tiga.core.types import TensorType
from tiga.testing import reference_grad
from tiga.trace import math as m
from tiga.trace.staging import trace_flat
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime.backends.triton import linear
from tiga.xla_free_runtime.reports.runs import COUNTERS

FORMS = {(1, 0): lambda x, y: x @ y, (1, 1): lambda x, y: x @ y.T,
         (0, 0): lambda x, y: x.T @ y, (0, 1): lambda x, y: x.T @ y.T}


def operands(form, m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k) if form[0] == 1 else (k, m)).astype(dtype)
    y = rng.standard_normal((k, n) if form[1] == 0 else (n, k)).astype(dtype)
    return x, y


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("m,k,n", [(37, 5, 7), (50, 33, 20), (16, 64, 16)])
def test_float32_products_match_numpy(form, m, k, n):
    x, y = operands(form, m, k, n, np.float32, seed=m + k)
    got = linear.matmul(x, y, form, "float32", "triton-interpreter")
    want = FORMS[form](x.astype(np.float64), y.astype(np.float64))
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", [(1, 0), (0, 1)])
def test_several_programs_on_both_axes(form):
    """300 x 70: three row programs (128 rows in the interpreter) and two column programs,
    the last of each partly masked."""
    x, y = operands(form, 300, 40, 70, np.float32, seed=9)
    got = linear.matmul(x, y, form, "float32", "triton-interpreter")
    want = FORMS[form](x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-2)])
def test_float64_and_float16(dtype, tol):
    x, y = operands((1, 0), 40, 24, 9, dtype, seed=3)
    got = linear.matmul(x, y, (1, 0), dtype.__name__, "triton-interpreter")
    want = x.astype(np.float64) @ y.astype(np.float64)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_zero_rows_and_zero_depth():
    x, y = np.zeros((0, 8), np.float32), np.ones((8, 5), np.float32)
    assert linear.matmul(x, y, (1, 0), "float32", "triton-interpreter").shape == (0, 5)
    x, y = np.zeros((6, 0), np.float32), np.ones((0, 5), np.float32)
    np.testing.assert_array_equal(linear.matmul(x, y, (1, 0), "float32",
                                                "triton-interpreter"), np.zeros((6, 5)))


def test_nan_and_inf_land_where_numpy_puts_them():
    x, y = operands((1, 0), 20, 12, 10, np.float32, seed=5)
    x[3, 4], x[7, 0], y[2, 6] = np.inf, np.nan, -np.inf
    y[4, 1] = 0.0                              # inf * 0: NaN at (3, 1) only
    got = linear.matmul(x, y, (1, 0), "float32", "triton-interpreter")
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64) @ y.astype(np.float64)
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got), test(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


class EdgeNN(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, w1):
        return tg.math.relu(tg.math.concatenate([dst.x, src.x - dst.x], axis=-1) @ w1)


@pytest.fixture
def tile_products(interpreter):
    """The launches tile_matmul made since the test began (the rule is the executor's own
    override: an ordinary call runs it)."""
    assert executor.OVERRIDES[dot_general_p] is linear.dot_rule
    before = COUNTERS["tile_matmuls"]
    return lambda: COUNTERS["tile_matmuls"] - before


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-10)])
def test_edgenn_forward_and_gradients(tile_products, dtype, tol):
    rng = np.random.default_rng(11)
    n, deg, f, hidden = 30, 4, 12, 20
    rp = np.arange(n + 1) * deg
    rp[5:] -= deg                                     # row 4 has no edges
    g = tg.Graph.from_csr(rp, rng.integers(0, n, rp[-1]).astype(np.int32), num_src=n)
    x = rng.standard_normal((n, f)).astype(dtype)
    w1 = (rng.standard_normal((2 * f, hidden)) / 4).astype(dtype)
    layer = EdgeNN()

    def call(x, w1, ref=False):
        fn = layer.reference if ref else layer
        return fn(graph=g, src={"x": x}, dst={"x": x}, w1=w1)

    np.testing.assert_allclose(np.asarray(call(x, w1)), np.asarray(call(x, w1, True)),
                               rtol=tol, atol=tol)
    assert tile_products() >= 2                       # Z_src and Z_dst
    got = tg.grad(lambda *a: call(*a).sum(), argnums=(0, 1))(x, w1)
    want = reference_grad(lambda *a: call(*a, ref=True).sum(), argnums=(0, 1))(x, w1)
    for a, b, name in zip(got, want, ("x", "w1")):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol,
                                   err_msg=name)
    assert tile_products() >= 5                       # and the VJP's dZ W^T, X^T dZ


def test_cpu_llvm_declines_and_agrees(tile_products):
    """The same layer on cpu-llvm: no tile_matmul launch, the interpreter's values."""
    rng = np.random.default_rng(12)
    n, f, hidden = 25, 10, 18
    g = tg.Graph.from_csr(np.arange(n + 1) * 3, rng.integers(0, n, 3 * n).astype(np.int32),
                          num_src=n)
    x = rng.standard_normal((n, f))
    w1 = rng.standard_normal((2 * f, hidden)) / 4
    layer = EdgeNN()
    kw = dict(graph=g, src={"x": x}, dst={"x": x}, w1=w1)
    tri = np.asarray(layer(**kw))
    launched = tile_products()
    assert launched == 2                               # one product per (field, role)
    assert "dot_general runs as the Triton backend's tile_matmul" in layer.explain(**kw).reason
    tg.config.backend = "cpu-llvm"
    assert "cpu-llvm" in layer.explain(**kw).route
    assert "tile_matmul" not in layer.explain(**kw).reason
    np.testing.assert_allclose(np.asarray(layer(**kw)), tri, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tri, np.asarray(layer.reference(**kw)), rtol=1e-12, atol=1e-12)
    assert tile_products() == launched


def test_rule_declines_what_it_does_not_run(interpreter):
    x, v = np.ones((4, 3), np.float32), np.ones(4, np.float32)
    eqn = _dot_eqn(v, x)                              # a vector: the impl rule runs it
    assert linear.dot_rule(eqn, [v, x]) is None
    old = tg.config._backend
    tg.config.backend = "cpu-llvm"
    try:
        eqn = _dot_eqn(x, x.T)
        assert linear.dot_rule(eqn, [x, x.T]) is None
    finally:
        tg.config.backend = old


def _dot_eqn(x, y):
    """The dot_general equation of x . y (contracting x's last axis with y's first)."""
    types = [TensorType(a.shape, tg.float32) for a in (x, y)]
    prog, _, _ = trace_flat(lambda a, b: m.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ()))),
                            types)
    return next(e for e in prog.eqns if e.primitive is dot_general_p)
