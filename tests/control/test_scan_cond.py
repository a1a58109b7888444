"""tg.scan, tg.fori_loop, tg.cond and tg.switch against independent oracles: a Python loop
(or branch) of the body in numpy, float64 central differences for every VJP and JVP, vmap
against a Python loop over instances; eager, jitted and the reference interpreter agree; a
propagate inside a loop or branch body compiles (strict mode), also over a paged store."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.core.primitive import impl_rules
from tiga.core.prims.control import cond_p, repeat_p

m = tg.math


# ---- oracles ---------------------------------------------------------------------------------


def fd_grad(loss, x, eps=1e-6):
    """Central differences of a float-valued loss (float64)."""
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        p, q = x.copy(), x.copy()
        p[idx] += eps
        q[idx] -= eps
        g[idx] = (loss(p) - loss(q)) / (2 * eps)
    return g


def np_scan(body, carry, xs, reverse=False):
    ys = [None] * len(xs)
    for i in (range(len(xs) - 1, -1, -1) if reverse else range(len(xs))):
        carry, ys[i] = body(carry, xs[i])
    return carry, np.stack(ys)


def _step(c, x):       # one body, written once for tg and once for numpy
    h = m.tanh(c * 0.8 + x)
    return h, h * h


def _np_step(c, x):
    h = np.tanh(c * 0.8 + x)
    return h, h * h


def _refuse(monkeypatch, *prims):
    """The loop/branch primitives' reference impl rules fail the test if anything runs them
    (the executor must step them itself, so the bodies' propagates compile)."""
    def refuse(*a, **k):
        raise AssertionError("a control-flow primitive ran on its reference impl rule")
    for p in prims:
        monkeypatch.setitem(impl_rules, p, refuse)


# ---- scan ------------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_a_python_loop_eager_jitted_and_reference(reverse):
    rng = np.random.default_rng(0)
    c0, xs = rng.standard_normal(3), rng.standard_normal((6, 3))
    want_c, want_ys = np_scan(_np_step, c0, xs, reverse)

    def f(c, xs):
        return tg.scan(_step, c, xs, reverse=reverse)

    program = tg.make_program(f)(c0, xs)
    assert "repeat[" in str(program)
    for got_c, got_ys in (f(c0, xs), tg.jit(f)(c0, xs), tg.eval_program(program, c0, xs)):
        np.testing.assert_allclose(np.asarray(got_c), want_c, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(got_ys), want_ys, rtol=1e-12, atol=1e-12)


def test_scan_pytrees_length_only_and_no_outputs():
    xs = {"a": np.arange(4.0), "b": np.ones((4, 2))}

    def body(state, x):
        s, n = state
        return (s + x["a"] * x["b"], n + 1), {"s": s, "twice": x["a"] * 2.0}

    (s, n), ys = tg.scan(body, (np.zeros(2), np.int64(0)), xs)
    np.testing.assert_allclose(np.asarray(s), [6.0, 6.0])
    assert int(np.asarray(n)) == 4
    np.testing.assert_allclose(np.asarray(ys["twice"]), [0, 2, 4, 6])
    np.testing.assert_allclose(np.asarray(ys["s"])[:, 0], [0, 0, 1, 3])
    c, none = tg.scan(lambda c, _: (c * 2.0, None), np.float64(1.0), length=5)
    assert none is None and float(np.asarray(c)) == 32.0


def test_scan_gradients_match_central_differences():
    rng = np.random.default_rng(1)
    c0, xs, w = rng.standard_normal(3), rng.standard_normal((5, 3)), rng.standard_normal(3)

    def loss(c0, xs):
        c, ys = tg.scan(_step, c0, xs)
        return m.sum(ys * w) + m.sum(c * c)

    def np_loss(c0, xs):
        c, ys = np_scan(_np_step, c0, xs)
        return float(np.sum(ys * w) + np.sum(c * c))

    gc, gx = tg.grad(loss, argnums=(0, 1))(c0, xs)
    np.testing.assert_allclose(np.asarray(gc), fd_grad(lambda v: np_loss(v, xs), c0),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(gx), fd_grad(lambda v: np_loss(c0, v), xs),
                               rtol=1e-6, atol=1e-8)


def test_scan_jvp_matches_central_differences():
    rng = np.random.default_rng(2)
    c0, xs, t = rng.standard_normal(3), rng.standard_normal((4, 3)), rng.standard_normal(3)
    _, (tc, tys) = tg.jvp(lambda c: tg.scan(_step, c, xs), (c0,), (t,))
    eps = 1e-6
    (cp, yp), (cm, ym) = (np_scan(_np_step, c0 + eps * t, xs), np_scan(_np_step, c0 - eps * t, xs))
    np.testing.assert_allclose(np.asarray(tc), (cp - cm) / (2 * eps), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(tys), (yp - ym) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_vmap_of_scan_is_a_python_loop_over_instances():
    rng = np.random.default_rng(3)
    c0s, xs = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    got_c, got_ys = tg.vmap(lambda c: tg.scan(_step, c, xs))(c0s)
    for i in range(4):
        want_c, want_ys = np_scan(_np_step, c0s[i], xs)
        np.testing.assert_allclose(np.asarray(got_c)[i], want_c, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(got_ys)[i], want_ys, rtol=1e-12, atol=1e-12)


def test_fori_loop_is_a_python_for_loop_and_differentiable():
    def f(x):
        return tg.fori_loop(2, 6, lambda i, s: s * 0.5 + m.convert(i, "float64") * m.sin(s), x)

    def np_f(x):
        for i in range(2, 6):
            x = x * 0.5 + i * np.sin(x)
        return x

    x = np.array([0.3, -1.1])
    np.testing.assert_allclose(np.asarray(f(x)), np_f(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tg.jit(f)(x)), np_f(x), rtol=1e-12)
    g = tg.grad(lambda x: m.sum(f(x)))(x)
    np.testing.assert_allclose(np.asarray(g), fd_grad(lambda v: float(np.sum(np_f(v))), x),
                               rtol=1e-6)
    assert float(np.asarray(tg.fori_loop(3, 1, lambda i, s: s + 1.0, np.float64(0.0)))) == 0.0


@settings(max_examples=8, deadline=None)
@given(n=st.integers(0, 7), reverse=st.booleans(), seed=st.integers(0, 99))
def test_scan_any_length_and_direction(n, reverse, seed):
    rng = np.random.default_rng(seed)
    c0, xs = rng.standard_normal(2), rng.standard_normal((n, 2))
    c, ys = tg.scan(_step, c0, xs, reverse=reverse)
    if n:
        want_c, want_ys = np_scan(_np_step, c0, xs, reverse)
        np.testing.assert_allclose(np.asarray(ys), want_ys, rtol=1e-12, atol=1e-12)
    else:
        want_c = c0
        assert np.asarray(ys).shape == (0, 2)
    np.testing.assert_allclose(np.asarray(c), want_c, rtol=1e-12, atol=1e-12)


def test_scan_errors_name_what_was_found():
    with pytest.raises(tg.ShapeError, match="scan: carried value 0 changes type"):
        tg.scan(lambda c, x: (m.sum(c), x), np.ones(3), np.ones((2, 3)))
    with pytest.raises(tg.ShapeError, match="length=3 but xs has 2 steps"):
        tg.scan(_step, np.ones(3), np.ones((2, 3)), length=3)
    with pytest.raises(tg.TigaError, match="pass xs or length"):
        tg.scan(_step, np.ones(3))
    with pytest.raises(tg.TigaError, match="must return a pair"):
        tg.jit(lambda c: tg.scan(lambda c, x: c, c, length=2))(np.ones(3))
    with pytest.raises(tg.TigaError, match="fori_loop: upper must be a Python int"):
        tg.fori_loop(0, 2.5, lambda i, s: s, np.ones(2))


# ---- cond and switch -------------------------------------------------------------------------


def _branchy(p, x):
    return tg.cond(p > 0.0, lambda a: m.sin(a) * 2.0, lambda a: a * a - 1.0, x)


@pytest.mark.parametrize("p", [1.0, -1.0])
def test_cond_takes_either_branch_eager_jitted_and_reference(p):
    x = np.array([0.2, -0.7, 1.5])
    want = np.sin(x) * 2.0 if p > 0 else x * x - 1.0
    program = tg.make_program(_branchy)(np.float64(p), x)
    assert "cond[branches=(" in str(program)
    for got in (_branchy(np.float64(p), x), tg.jit(_branchy)(np.float64(p), x),
                tg.eval_program(program, np.float64(p), x)[0]):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    g = tg.grad(lambda x: m.sum(_branchy(np.float64(p), x) ** 2))(x)
    np_f = (lambda v: np.sin(v) * 2.0) if p > 0 else (lambda v: v * v - 1.0)
    np.testing.assert_allclose(np.asarray(g), fd_grad(lambda v: float(np.sum(np_f(v) ** 2)), x),
                               rtol=1e-6, atol=1e-8)
    t = np.array([1.0, 0.5, -2.0])
    _, tout = tg.jvp(lambda x: _branchy(np.float64(p), x), (x,), (t,))
    np.testing.assert_allclose(np.asarray(tout), (np_f(x + 1e-6 * t) - np_f(x - 1e-6 * t))
                               / 2e-6, rtol=1e-6, atol=1e-8)


def test_only_the_taken_branch_runs():
    ran = []
    from tiga.xla_free_runtime import executor
    real = executor._call

    def spy(closed, args):
        ran.append(str(closed.program))
        return real(closed, args)

    import unittest.mock as mock
    with mock.patch.object(executor, "_call", spy):
        tg.jit(_branchy)(np.float64(1.0), np.ones(2))
    assert len(ran) == 1 and "sin" in ran[0]


def test_switch_clamps_the_index_and_closes_over_values():
    y = np.array([10.0, 20.0])
    branches = [lambda a: a + y, lambda a: a * y, lambda a: a - y]
    x = np.array([1.0, 2.0])
    for i, want in ((-3, x + y), (0, x + y), (1, x * y), (2, x - y), (9, x - y)):
        for got in (tg.switch(np.int64(i), branches, x),
                    tg.jit(lambda i, x: tg.switch(i, branches, x))(np.int64(i), x)):
            np.testing.assert_allclose(np.asarray(got), want)


def test_switch_gradient_flows_to_captured_values_through_the_taken_branch():
    x, y = np.array([0.5, -1.0]), np.array([2.0, 3.0])

    def loss(x, y):
        out = tg.switch(np.int32(1), [lambda a: a + y, lambda a: m.sin(a) * y * y], x)
        return m.sum(out)

    gx, gy = tg.grad(loss, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), np.cos(x) * y * y, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gy), np.sin(x) * 2 * y, rtol=1e-12)


def test_vmap_of_cond_with_a_batched_predicate_selects_per_instance():
    ps = np.array([1.0, -1.0, 2.0, -0.5])
    xs = np.random.default_rng(4).standard_normal((4, 3))
    got = tg.vmap(_branchy)(ps, xs)
    for i in range(4):
        want = np.sin(xs[i]) * 2.0 if ps[i] > 0 else xs[i] * xs[i] - 1.0
        np.testing.assert_allclose(np.asarray(got)[i], want, rtol=1e-12, atol=1e-12)
    shared = tg.vmap(lambda x: _branchy(np.float64(-1.0), x))(xs)   # index not batched
    np.testing.assert_allclose(np.asarray(shared), xs * xs - 1.0, rtol=1e-12)


def test_cond_errors_name_the_argument_and_what_was_found():
    x = np.ones(3)
    with pytest.raises(tg.ShapeError, match="cond: pred must be a scalar, found"):
        tg.cond(x > 0, lambda a: a, lambda a: a, x)
    with pytest.raises(tg.DTypeError, match="pred must be a bool .* found"):
        tg.cond(np.float64(1.0), lambda a: a, lambda a: a, x)
    with pytest.raises(tg.ShapeError, match="branch 1 returns .* but branch 0 returns"):
        tg.jit(lambda x: tg.cond(m.sum(x) > 0, lambda a: a, lambda a: m.sum(a), x))(x)
    with pytest.raises(tg.DTypeError, match="switch: index must be an integer scalar"):
        tg.switch(np.float32(0), [lambda a: a], x)
    with pytest.raises(tg.TigaError, match="branches must be a non-empty list"):
        tg.switch(0, [], x)


# ---- propagate inside loop and branch bodies -------------------------------------------------


class Mean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return m.tanh(src.x) + 0.5 * dst.x


def _graph(seed=0, n=30, e=120):
    rng = np.random.default_rng(seed)
    return tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n,
                             num_dst=n), rng.standard_normal((n, 3))


def _np_layer(layer, g, h):
    return np.asarray(layer.reference(graph=g, src={"x": h}, dst={"x": h}))


def test_propagates_in_scan_and_cond_bodies_compile_under_strict_mode(monkeypatch):
    g, x = _graph()
    layer = Mean()
    want_h, want = x, []
    for _ in range(3):
        want_h = _np_layer(layer, g, want_h)
        want.append(want_h.sum())

    def traj(h):
        def step(h, _):
            h = layer(graph=g, src={"x": h}, dst={"x": h})
            return h, m.sum(h)
        return tg.scan(step, h, length=3)

    def branch(p, h):
        return tg.cond(p > 0, lambda a: layer(graph=g, src={"x": a}, dst={"x": a}),
                       lambda a: a * 2.0, h)

    monkeypatch.setattr(tg.config, "strict", True)
    _refuse(monkeypatch, repeat_p, cond_p)
    for run in (traj, tg.jit(traj)):
        h, ys = run(x)
        np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(ys), want, rtol=1e-10)
    for run in (branch, tg.jit(branch)):
        np.testing.assert_allclose(np.asarray(run(np.float64(1.0), x)), _np_layer(layer, g, x),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(run(np.float64(-1.0), x)), 2.0 * x)
    gr = tg.grad(lambda h: m.sum(branch(np.float64(1.0), h) ** 2))(x)
    monkeypatch.undo()
    ref = fd_grad(lambda v: float(np.sum(_np_layer(layer, g, v) ** 2)), x)
    np.testing.assert_allclose(np.asarray(gr), ref, rtol=1e-6, atol=1e-8)


def test_explain_names_cond_and_its_branch_propagates():
    g, x = _graph(seed=1)
    layer = Mean()

    def branch(p, h):
        return tg.cond(p > 0, lambda a: layer(graph=g, src={"x": a}, dst={"x": a}),
                       lambda a: a, h)

    text = str(tg.jit(branch).lower(np.float64(1.0), x).compile().explain())
    assert "cond" in text


def test_scan_and_cond_over_a_paged_store(tmp_path):
    g, x = _graph(seed=2, n=40, e=160)
    rp, ci = g.resolve_csr()[:2]
    rp, ci = np.asarray(rp, np.int64), np.asarray(ci, np.int32)
    with tg.store.create(tmp_path / "s", num_src=40, num_dst=40, overwrite=True) as w:
        w.append_csr_chunk(rp, ci)
    paged = tg.Graph.open(tmp_path / "s")
    layer = Mean()

    def traj(graph, h):
        return tg.scan(lambda h, _: (layer(graph=graph, src={"x": h}, dst={"x": h}),) * 2,
                       h, length=2)

    def branch(graph, p, h):
        return tg.cond(p > 0, lambda a: layer(graph=graph, src={"x": a}, dst={"x": a}),
                       lambda a: -a, h)

    want_h, want_ys = traj(g, x)
    with tg.scope(page_rows=16):
        got_h, got_ys = traj(paged, x)
        got_b = branch(paged, np.float64(1.0), x)
    np.testing.assert_allclose(np.asarray(got_h), np.asarray(want_h), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got_ys), np.asarray(want_ys), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got_b), np.asarray(branch(g, np.float64(1.0), x)),
                               rtol=1e-12, atol=1e-12)


def test_cond_prints_its_branches():
    program = tg.make_program(lambda p, x: tg.cond(p, lambda a: a + 1.0, lambda a: a, x))(
        True, np.ones(2))
    assert str(program) == """{ lambda ; a:bool[] b:f64[2]. let
    c:i32[] = convert[new_dtype=tg.int32] a
    d:f64[2] = cond[branches=({ lambda ; e:f64[2]. let
      in (e,) },{ lambda ; f:f64[2]. let
        g:f64[2] = add f 1.0:f64[]
      in (g,) })] c b
  in (d,) }"""
    tg.check_program(program)


def test_vmap_of_switch_batched_and_shared_index_and_operand_free_branches():
    branches = [lambda x: x * 2.0, lambda x: np.full(3, 5.0), lambda x: x - 1.0]
    got = tg.vmap(lambda i, x: tg.switch(i, branches, x))(np.array([0, 1, 7]), np.ones((3, 3)))
    np.testing.assert_allclose(np.asarray(got), [[2.0] * 3, [5.0] * 3, [0.0] * 3])
    # a shared index whose branch ignores the batched operand still answers per instance
    shared = tg.vmap(lambda x: tg.switch(np.int32(1), branches, x))(np.ones((2, 3)))
    np.testing.assert_allclose(np.asarray(shared), np.full((2, 3), 5.0))
    a, b = np.ones(2), np.zeros(2)
    np.testing.assert_allclose(np.asarray(tg.cond(True, lambda: a, lambda: b)), a)
    np.testing.assert_allclose(
        np.asarray(tg.jit(lambda p: tg.cond(p, lambda: a, lambda: b))(False)), b)
