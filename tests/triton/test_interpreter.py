"""Every reducer over small random CSR graphs, forward and gradient, rendered as Triton and run
in Triton's interpreter, against the reference interpreter (strict: nothing falls back); the
gradients against oracles independent of the route (_grad_oracle: the gradient program run
by the numpy reference interpreter, and float64 central differences)."""
import numpy as np
import pytest
from _grad_oracle import check_grad, directions_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg

REDUCERS = ["sum", "mean", "max", "min", "prod", "online_softmax"]
FEATURES = 3            # not a power of two: padded lanes are masked


@st.composite
def graphs(draw):
    """Empty rows, duplicate and self edges, a zero-edge graph, skewed degrees."""
    n_dst = draw(st.integers(0, 5))
    n_src = draw(st.integers(1, 5))
    degrees = draw(st.lists(st.integers(0, 7), min_size=n_dst, max_size=n_dst))
    cols = draw(st.lists(st.integers(0, n_src - 1), min_size=sum(degrees),
                         max_size=sum(degrees)))
    seed = draw(st.integers(0, 2**16))
    row_ptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    return tg.Graph.from_csr(row_ptr, np.asarray(cols, np.int64), num_src=n_src), seed


def layer_for(name: str):
    class Layer(tg.MessagePassing):
        reducer = getattr(tg, name)()

        def edge(self, src, dst, edge):
            if name == "online_softmax":
                score = (src.x * dst.h).sum(axis=-1) * edge.w
                return self.reducer(score, tg.math.tanh(src.x) + dst.h)
            return tg.math.tanh(src.x) * edge.w + dst.h * 0.5
    return Layer()


def fields(g, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(g.num_src, FEATURES))
    h = rng.normal(size=(g.num_dst, FEATURES))
    w = rng.uniform(0.5, 1.5, size=(g.num_edges,))
    return x, h, w


def call(layer, g, x, h, w, reference=False):
    fn = layer.reference if reference else layer
    return fn(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w})


@pytest.mark.parametrize("name", REDUCERS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=graphs())
def test_forward_matches_reference(interpreter, name, case):
    g, seed = case
    layer = layer_for(name)
    x, h, w = fields(g, seed)
    got = np.asarray(call(layer, g, x, h, w))
    want = np.asarray(call(layer, g, x, h, w, reference=True))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", REDUCERS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=graphs())
def test_grad_matches_reference(interpreter, name, case):
    g, seed = case
    layer = layer_for(name)
    x, h, w = fields(g, seed)
    weights = np.random.default_rng(seed + 1).normal(size=(g.num_dst, FEATURES))

    def loss(x, h, w):
        return (call(layer, g, x, h, w) * weights).sum()

    got = tg.grad(loss, argnums=(0, 1, 2))(x, h, w)
    check_grad(loss, (x, h, w), got, seed=seed, directions=directions_for(name))


def test_a_wrong_vjp_rule_fails_the_gradient_check(interpreter, monkeypatch):
    """The oracle can fail: a propagate VJP rule that scales its cotangents by 1.01 (a rule
    both routes share, so reference_grad agrees with it) is caught by central differences
    (on 58b7cff these tests compared the Triton route with itself)."""
    from tiga.autodiff.registry import vjp_rules
    from tiga.core.prims.graph import propagate_p

    rule = vjp_rules[propagate_p]

    def wrong(*a, **kw):
        return tuple(None if c is None else c * 1.01 for c in rule(*a, **kw))
    monkeypatch.setitem(vjp_rules, propagate_p, wrong)
    row_ptr = np.array([0, 2, 3, 3, 6])
    g = tg.Graph.from_csr(row_ptr, np.array([0, 1, 1, 2, 0, 2]), num_src=3)
    x, h, w = fields(g, 7)
    weights = np.random.default_rng(8).normal(size=(g.num_dst, FEATURES))
    layer = layer_for("sum")

    def loss(x, h, w):
        return (call(layer, g, x, h, w) * weights).sum()

    got = tg.grad(loss, argnums=(0, 1, 2))(x, h, w)
    with pytest.raises(AssertionError, match="central differences"):
        check_grad(loss, (x, h, w), got, seed=9)
