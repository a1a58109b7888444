"""Eager tg.repeat / tg.while_loop (outside any trace) run their bodies on the compiled path,
as tg.jit does: never the reference impl rule of the loop, and strict mode refuses a body that
would fall back. Values are checked against the reference interpreter."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.core.primitive import impl_rules
from tiga.core.prims.control import repeat_p, while_loop_p
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime.backends import Fallback


class Mean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) + 0.5 * dst.x


def _problem(seed=0, n=40, e=160, f=4):
    rng = np.random.default_rng(seed)
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    return g, rng.standard_normal((n, f))


def _refuse_loop_impls(monkeypatch):
    """The loops' reference impl rules fail the test if anything runs them."""
    def refuse(*a, **k):
        raise AssertionError("an eager loop ran on the reference impl rule")
    monkeypatch.setitem(impl_rules, repeat_p, refuse)
    monkeypatch.setitem(impl_rules, while_loop_p, refuse)


def _oracle_steps(layer, g, x, n):
    for _ in range(n):
        x = np.asarray(layer.reference(graph=g, src={"x": x}, dst={"x": x}))
    return x


def test_eager_repeat_runs_compiled_and_matches_reference(monkeypatch):
    g, x = _problem()
    layer = Mean()
    want = _oracle_steps(layer, g, x, 4)
    _refuse_loop_impls(monkeypatch)

    def step(h):
        return layer(graph=g, src={"x": h}, dst={"x": h})

    for _ in range(2):     # the second call reuses the first's trace
        got = tg.repeat(4, step, x)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_eager_while_loop_runs_compiled_and_matches_reference(monkeypatch):
    g, x = _problem(seed=1)
    layer = Mean()
    _refuse_loop_impls(monkeypatch)

    def body(state):
        i, h = state
        return i + 1, layer(graph=g, src={"x": h}, dst={"x": h})

    i, got = tg.while_loop(lambda s: s[0] < 3, body, (np.int64(0), x), max_iterations=10)
    assert int(np.asarray(i)) == 3
    np.testing.assert_allclose(np.asarray(got), _oracle_steps(layer, g, x, 3), rtol=1e-12,
                               atol=1e-12)


def test_eager_repeat_sees_a_changed_global_value():
    g, x = _problem(seed=2)
    layer = Mean()
    scale = {"v": 1.0}

    def step(h):
        return scale["v"] * layer(graph=g, src={"x": h}, dst={"x": h})

    first = np.asarray(tg.repeat(2, step, x))
    scale["v"] = 0.5
    second = np.asarray(tg.repeat(2, step, x))
    want = x
    for _ in range(2):
        want = 0.5 * np.asarray(layer.reference(graph=g, src={"x": want}, dst={"x": want}))
    np.testing.assert_allclose(second, want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(first, second)


@pytest.mark.parametrize("loop", ["repeat", "while_loop"])
def test_strict_mode_refuses_a_fallback_inside_an_eager_body(monkeypatch, loop):
    g, x = _problem(seed=3)
    layer = Mean()
    monkeypatch.setattr(executor, "plan", lambda eqn, graph, **kw: Fallback("forced"))
    monkeypatch.setattr(tg.config, "strict", True)

    def step(h):
        return layer(graph=g, src={"x": h}, dst={"x": h})

    with pytest.raises(tg.UnsupportedError, match="strict mode"):
        if loop == "repeat":
            tg.repeat(2, step, x)
        else:
            tg.while_loop(lambda h: True, step, x, max_iterations=2)


def test_plain_grad_drops_the_discarded_forward():
    """tg.grad runs the gradient program alone: a linear propagate's forward walk is gone."""
    g, x = _problem(seed=4)
    launched = []
    real = executor.run_propagate

    def counting(route, eqn, *a):
        launched.append(eqn.params["reduce_by"])
        return real(route, eqn, *a)

    def loss(h):
        return tg.math.sum(tg.propagate(g, lambda s, d, e: s.h, tg.sum(), src={"h": h}))

    import unittest.mock as mock
    with mock.patch.object(executor, "run_propagate", counting):
        got = tg.grad(loss)(x)
    assert launched == ["src"], launched          # the transposed walk only
    want = np.bincount(np.asarray(g.resolve_csr()[1]), minlength=x.shape[0])
    np.testing.assert_allclose(np.asarray(got), np.repeat(want[:, None], x.shape[1], 1))
    value, again = tg.value_and_grad(loss)(x)
    np.testing.assert_allclose(np.asarray(again), np.asarray(got))
    np.testing.assert_allclose(float(np.asarray(value)),
                               float(np.asarray(loss(x))), rtol=1e-12)


def test_while_loop_bound_is_a_runtime_value():
    """A new bound runs the same trace: eagerly for any int, under tg.jit for an argument."""
    from tiga.trace import call_cache
    g, x = _problem(seed=6)
    layer = Mean()

    def body(state):
        i, h = state
        return i + 1, layer(graph=g, src={"x": h}, dst={"x": h})

    def cond(state):
        return state[0] < 100

    misses = None
    for bound in (2, 5, np.int64(3), 0):
        i, got = tg.while_loop(cond, body, (np.int64(0), x), bound)
        assert int(np.asarray(i)) == int(bound)
        np.testing.assert_allclose(np.asarray(got), _oracle_steps(layer, g, x, int(bound)),
                                   rtol=1e-12, atol=1e-12)
        if misses is None:
            misses = call_cache.STATS["misses"]
    assert call_cache.STATS["misses"] == misses       # one trace for every bound
    f = tg.jit(lambda h, k: tg.while_loop(cond, body, (np.int64(0), h), k))
    for bound in (1, 4):
        i, got = f(x, np.int64(bound))
        assert int(np.asarray(i)) == bound
    assert f.cache_info()["misses"] == 1
    with pytest.raises(tg.TigaError, match="max_iterations must be >= 0"):
        tg.while_loop(cond, body, (np.int64(0), x), np.int64(-2))
    with pytest.raises(tg.TigaError, match="non-negative int"):
        tg.while_loop(cond, body, (np.int64(0), x), np.float64(2.0))
