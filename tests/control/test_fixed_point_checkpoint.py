"""tg.checkpoint policies (same values and gradients as keeping every carry, fewer residual
bytes, measured on the gradient program) and tg.fixed_point (value and implicit gradient
against a dense linear solve, forward mode, vmap, a PageRank over a CSR relation compiled
under strict mode)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.autodiff.remat import residual_bytes
from tiga.core.primitive import impl_rules
from tiga.core.prims.control import repeat_p, while_loop_p

m = tg.math

POLICIES = ["all", "sqrt", "none", ("every", 1), ("every", 2), ("every", 3)]


def _step(c, x):
    h = m.tanh(c * 0.9 + x)
    return h, h * c


# ---- checkpoint ------------------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(n=st.integers(0, 9), policy=st.sampled_from(POLICIES), reverse=st.booleans(),
       seed=st.integers(0, 99))
def test_checkpointed_scan_has_the_plain_values_and_gradients(n, policy, reverse, seed):
    rng = np.random.default_rng(seed)
    c0, xs, w = rng.standard_normal(2), rng.standard_normal((n, 2)), rng.standard_normal(2)

    def loss(c0, xs):
        c, ys = tg.scan(_step, c0, xs, reverse=reverse)
        return m.sum(c * w) + m.sum(ys * ys)

    want = tg.value_and_grad(loss, argnums=(0, 1))(c0, xs)
    got = tg.value_and_grad(tg.checkpoint(loss, policy), argnums=(0, 1))(c0, xs)
    np.testing.assert_allclose(float(np.asarray(got[0])), float(np.asarray(want[0])),
                               rtol=1e-12)
    for g, w_ in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=1e-10, atol=1e-12)


def test_checkpointed_repeat_and_fori_loop_gradients():
    x = np.array([0.1, 0.4, -0.3])

    def loss(x):
        h = tg.repeat(7, lambda h: m.sin(h) * 1.1, x)
        return m.sum(tg.fori_loop(0, 5, lambda i, s: s * 0.9 + m.cos(s), h))

    want = np.asarray(tg.grad(loss)(x))
    for policy in ("sqrt", "none", ("every", 3)):
        np.testing.assert_allclose(np.asarray(tg.grad(tg.checkpoint(loss, policy))(x)), want,
                                   rtol=1e-12)


def test_sqrt_policy_keeps_a_sixteenth_of_the_residual_bytes_at_1024_steps():
    xs = np.zeros((1024, 8))

    def loss(c):
        return m.sum(tg.scan(_step, c, xs)[1])

    kept = {}
    for policy in ("all", "sqrt", ("every", 8), "none"):
        program = tg.make_program(tg.grad(tg.checkpoint(loss, policy)))(np.ones(8))
        kept[str(policy)] = residual_bytes(program)
    assert kept["all"] == 1024 * 8 * 8                    # one float64 carry per step
    assert kept["sqrt"] <= kept["all"] // 16              # 32 chunk carries + 32 inside one
    assert kept["('every', 8)"] == (128 + 8) * 64
    assert kept["none"] < kept["sqrt"]                    # O(log n) carries


def test_explain_reports_the_carries_each_policy_keeps():
    xs = np.zeros((256, 4))

    def loss(c):
        return m.sum(tg.scan(_step, c, xs)[1])

    def kept(policy):
        ex = tg.jit(tg.grad(tg.checkpoint(loss, policy))).lower(np.ones(4)).compile().explain()
        (what,) = [x for x in ex.materialized if x[0].startswith("loop carries")]
        assert "loop carries kept for the backward pass" in str(ex)
        return what[1]

    assert kept("all") == 256 * 4 * 8
    assert kept("sqrt") == (16 + 16) * 4 * 8


def test_checkpoint_policy_errors():
    for bad in ("some", ("every", 0), ("every", 2.0), 3):
        with pytest.raises(tg.TigaError, match="checkpoint: policy must be"):
            tg.checkpoint(lambda x: x, bad)


# ---- fixed_point -----------------------------------------------------------------------------


def _contraction(seed, n=5):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    return 0.5 * a / np.linalg.norm(a, 2), rng.standard_normal(n), rng.standard_normal(n)


def _solve(a, b):
    return tg.fixed_point(lambda x: m.matmul(a, x) + b, np.zeros(b.shape[-1]), tol=1e-13,
                          max_iterations=400)


def test_fixed_point_value_and_gradient_match_a_dense_linear_solve():
    a, b, c = _contraction(0)
    eye = np.eye(len(b))
    x_star = np.linalg.solve(eye - a, b)
    for got in (_solve(a, b), tg.jit(_solve)(a, b)):
        np.testing.assert_allclose(np.asarray(got), x_star, rtol=1e-10, atol=1e-12)
    ga, gb = tg.grad(lambda a, b: m.sum(_solve(a, b) * c), argnums=(0, 1))(a, b)
    w = np.linalg.solve((eye - a).T, c)          # adjoint of x* = (I - A)^-1 b
    np.testing.assert_allclose(np.asarray(gb), w, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(np.asarray(ga), np.outer(w, x_star), rtol=1e-9, atol=1e-11)


def test_fixed_point_forward_mode_and_vmap():
    a, b, t = _contraction(1)
    eye = np.eye(len(b))
    _, tx = tg.jvp(lambda b: _solve(a, b), (b,), (t,))
    np.testing.assert_allclose(np.asarray(tx), np.linalg.solve(eye - a, t), rtol=1e-9,
                               atol=1e-11)
    bs = np.stack([b, t, b - t])
    got = tg.vmap(lambda b: _solve(a, b))(bs)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(got)[i], np.linalg.solve(eye - a, bs[i]),
                                   rtol=1e-10, atol=1e-12)


def test_fixed_point_of_a_pytree_state():
    def f(s):
        x, y = s
        return (0.5 * m.cos(y), 0.25 * m.sin(x) + 0.1)

    x, y = tg.fixed_point(f, (np.float64(0.0), np.float64(0.0)), tol=1e-14,
                          max_iterations=200)
    np.testing.assert_allclose(float(np.asarray(x)), 0.5 * np.cos(float(np.asarray(y))),
                               rtol=1e-13)
    np.testing.assert_allclose(float(np.asarray(y)), 0.25 * np.sin(float(np.asarray(x))) + 0.1,
                               rtol=1e-13)


def _pagerank_problem(n=25, e=90, seed=3):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    out_deg = np.maximum(np.bincount(src, minlength=n), 1).astype(np.float64)
    p = np.zeros((n, n))
    for s, d in zip(src, dst):
        p[d, s] += 1.0 / out_deg[s]
    return g, out_deg[:, None], p


def test_pagerank_sensitivity_compiles_and_matches_a_dense_solve(monkeypatch):
    g, out_deg, p = _pagerank_problem()
    n, d = p.shape[0], 0.85
    v = np.full((n, 1), 1.0 / n)
    c = np.random.default_rng(4).standard_normal((n, 1))

    def pagerank(v):
        def step(r):
            spread = tg.propagate(g, lambda s, dd, e: s.r, tg.sum(), src={"r": r / out_deg})
            return d * spread + (1 - d) * v
        return tg.fixed_point(step, v, tol=1e-13, max_iterations=500)

    monkeypatch.setattr(tg.config, "strict", True)

    def refuse(*a, **k):
        raise AssertionError("a loop ran on its reference impl rule")
    monkeypatch.setitem(impl_rules, while_loop_p, refuse)
    monkeypatch.setitem(impl_rules, repeat_p, refuse)
    r = pagerank(v)
    g_v = tg.grad(lambda v: m.sum(pagerank(v) * c))(v)
    monkeypatch.undo()
    lhs = np.eye(n) - d * p
    np.testing.assert_allclose(np.asarray(r), np.linalg.solve(lhs, (1 - d) * v), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(g_v), (1 - d) * np.linalg.solve(lhs.T, c),
                               rtol=1e-8, atol=1e-10)


def test_fixed_point_errors_and_the_while_loop_gradient_error():
    with pytest.raises(tg.TigaError, match="fixed_point: tol must be a non-negative float"):
        tg.fixed_point(lambda x: x, np.ones(2), tol=-1.0, max_iterations=3)
    with pytest.raises(tg.TigaError, match="max_iterations must be a positive int"):
        tg.fixed_point(lambda x: x, np.ones(2), tol=1e-6, max_iterations=0)
    with pytest.raises(tg.ShapeError, match="fixed_point: step must return the structure"):
        tg.fixed_point(lambda x: m.sum(x), np.ones(2), tol=1e-6, max_iterations=3)
    with pytest.raises(tg.UnsupportedError, match="tg.fixed_point"):
        tg.grad(lambda x: m.sum(tg.while_loop(lambda s: m.sum(s) < 9.0, lambda s: s * 2.0,
                                              x, 10)))(np.ones(2))
