"""Every propagate forced onto the fallback route (the executor's eval_program with rule
overrides, no kernel) gives the reference interpreter's values and gradients: the mixed
route must never answer differently from the oracle, whatever the planner decides."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime.backends import Fallback

REDUCERS = ("sum", "mean", "max", "min", "prod")


class Layer(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.h


@pytest.mark.parametrize("reducer", REDUCERS)
def test_forced_fallback_matches_reference(monkeypatch, reducer):
    rng = np.random.default_rng(REDUCERS.index(reducer))
    n, e = 7, 20
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    x, w = rng.normal(size=(n, 3)), rng.normal(size=(e, 1))
    layer = Layer(getattr(tg, reducer)())

    def loss(x, w):
        return (layer(graph=g, src={"x": x}, dst={"h": x}, edge={"w": w}) ** 2).sum()

    want = reference_grad(loss, argnums=(0, 1))(x, w)
    planned = []

    def fallback(eqn, graph, **kw):
        planned.append(eqn)
        return Fallback("forced")

    monkeypatch.setattr(executor, "plan", fallback)
    got = tg.grad(loss, argnums=(0, 1))(x, w)
    assert planned, "the executor never asked the patched planner"
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
