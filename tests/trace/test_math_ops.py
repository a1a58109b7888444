"""tg.math activations (leaky_relu, elu, softplus, log_softmax, softmax) against
torch.nn.functional in float64, their gradients against torch and float64 finite
differences, and the same functions inside a compiled propagate edge function against the
reference interpreter (strict mode: a fallback to the interpreter would raise)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tiga as tg
from tiga.testing import reference_grad

torch = pytest.importorskip("torch")
F = torch.nn.functional
m = tg.math

# (tiga function, torch function): hyperparameters off their defaults where they have any
CASES = {
    "leaky_relu": (lambda x: m.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
    "leaky_relu_default": (m.leaky_relu, F.leaky_relu),
    "elu": (lambda x: m.elu(x, 1.5), lambda x: F.elu(x, 1.5)),
    "elu_default": (m.elu, F.elu),
    "softplus": (lambda x: m.softplus(x, 0.5, 3.0), lambda x: F.softplus(x, 0.5, 3.0)),
    "softplus_default": (m.softplus, F.softplus),
    "log_softmax": (m.log_softmax, lambda x: F.log_softmax(x, -1)),
    "log_softmax_axis0": (lambda x: m.log_softmax(x, axis=0), lambda x: F.log_softmax(x, 0)),
    "softmax": (m.softmax, lambda x: F.softmax(x, -1)),
    "softmax_dim0": (lambda x: m.softmax(x, dim=0), lambda x: F.softmax(x, 0)),
}
PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# kinks (0, the softplus threshold) and overflow-range values among ordinary ones
SPECIAL = st.sampled_from([0.0, 6.0, 20.0, 40.0, -40.0, 800.0, -800.0])
VALUES = st.one_of(SPECIAL, st.floats(-30, 30, allow_nan=False))
ARRAYS = hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
                    elements=VALUES)


@contextlib.contextmanager
def strict():
    saved = tg.config.strict
    tg.config.strict = True
    try:
        yield
    finally:
        tg.config.strict = saved


def _torch_value_and_grad(tf, x, weight):
    tx = torch.tensor(x, requires_grad=True)
    y = tf(tx)
    (y * torch.tensor(weight)).sum().backward()
    return y.detach().numpy(), tx.grad.numpy()


@pytest.mark.parametrize("name", sorted(CASES))
@PROPS
@given(x=ARRAYS)
def test_value_and_gradient_match_torch(name, x):
    f, tf = CASES[name]
    weight = np.cos(np.arange(x.size, dtype=np.float64)).reshape(x.shape) + 0.5
    want_y, want_g = _torch_value_and_grad(tf, x, weight)
    np.testing.assert_allclose(np.asarray(f(x)), want_y, rtol=1e-12, atol=1e-12)
    got_g = tg.grad(lambda a: m.sum(m.multiply(f(a), weight)))(x)
    np.testing.assert_allclose(np.asarray(got_g), want_g, rtol=1e-10, atol=1e-12)
    assert np.isfinite(np.asarray(got_g)).all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    f = CASES[name][0]
    rng = np.random.default_rng(1)
    # keep clear of the kinks, where a central difference straddles two branches
    x = rng.uniform(0.2, 4.0, size=(3, 5)) * rng.choice([-1.0, 1.0], size=(3, 5))
    weight = rng.normal(size=x.shape)

    def loss(a):
        return float(np.sum(np.asarray(f(a)) * weight))

    got = np.asarray(tg.grad(lambda a: m.sum(m.multiply(f(a), weight)))(x))
    eps, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        fd[idx] = (loss(x + d) - loss(x - d)) / (2 * eps)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-7)


def test_float32_keeps_its_dtype_and_integers_promote():
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    for name in ("leaky_relu", "elu", "softplus", "log_softmax", "softmax"):
        assert np.asarray(getattr(m, name)(x32)).dtype == np.float32
    xi = np.arange(-3, 4)
    np.testing.assert_allclose(np.asarray(m.elu(xi)), F.elu(torch.tensor(xi * 1.0)).numpy(),
                               rtol=1e-6)


def test_tensor_methods():
    x = np.random.default_rng(2).normal(size=(4, 3))
    t = tg.asarray(x)
    np.testing.assert_allclose(np.asarray(t.leaky_relu(0.3)), np.asarray(m.leaky_relu(x, 0.3)))
    np.testing.assert_allclose(np.asarray(t.elu()), np.asarray(m.elu(x)))
    np.testing.assert_allclose(np.asarray(t.softplus(2.0)), np.asarray(m.softplus(x, 2.0)))
    np.testing.assert_allclose(np.asarray(t.log_softmax(0)), np.asarray(m.log_softmax(x, 0)))
    np.testing.assert_allclose(np.asarray(t.softmax(dim=-1)), np.asarray(m.softmax(x)))


class Activations(tg.MessagePassing):
    """Every new function in one edge function; softmaxes over the feature axis of a row."""
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        h = src.x * edge.w - dst.x
        return (m.leaky_relu(h, 0.2) + m.elu(h, 1.5) + m.softplus(h, 2.0, 4.0)
                + m.log_softmax(h) * m.softmax(h * 0.5) + h.leaky_relu() * 0.1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inside_compiled_propagate_matches_reference(dtype):
    rng = np.random.default_rng(3)
    n, e = 9, 30
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    x = (rng.normal(size=(n, 5)) * 4).astype(dtype)
    w = rng.normal(size=(e, 1)).astype(dtype)
    call = dict(graph=g, src={"x": x}, dst={"x": x}, edge={"w": w})
    mp = Activations()
    with strict():
        got = np.asarray(mp(**call))
    assert "cpu-llvm" in str(mp.explain(**call))
    want = np.asarray(mp.reference(**call))
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_gradient_through_compiled_propagate_matches_reference():
    rng = np.random.default_rng(4)
    n, e = 7, 20
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    x, w = rng.normal(size=(n, 4)) * 3, rng.normal(size=(e, 1))
    cot = rng.normal(size=(n, 4))
    mp = Activations()

    def loss(run):
        return lambda x, w: m.sum(m.multiply(run(graph=g, src={"x": x}, dst={"x": x},
                                                 edge={"w": w}), cot))

    with strict():
        gx, gw = tg.grad(loss(mp), argnums=(0, 1))(x, w)
    rx, rw = reference_grad(loss(mp.reference), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(rw), rtol=1e-10, atol=1e-12)
