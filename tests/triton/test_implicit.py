"""Implicit relations (dense, triangular, cu_seqlens, stencil) walked natively by the Triton
kernel (edges computed from indices, no resolved CSR), in Triton's interpreter, against the
reference interpreter: forward per reducer, edge fields (edge ids), and gradients."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.lower.abi import relation_descriptor
from tiga.testing import reference_grad


@st.composite
def relations(draw):
    kind = draw(st.sampled_from(["dense", "triangular", "cu_seqlens", "stencil"]))
    if kind == "dense":
        return tg.Graph.dense(draw(st.integers(1, 5)), draw(st.integers(0, 5)))
    if kind == "triangular":
        return tg.Graph.triangular(draw(st.integers(0, 6)))
    if kind == "cu_seqlens":   # empty sequences included
        lens = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
        return tg.Graph.cu_seqlens(np.concatenate([[0], np.cumsum(lens)]),
                                   causal=draw(st.booleans()))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    offsets = draw(st.lists(st.tuples(*[st.integers(-2, 2)] * len(shape)), min_size=1,
                            max_size=5))
    return tg.Graph.stencil(shape, offsets, periodic=draw(st.booleans()))


class Layer(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        if self.reducer.name == "online_softmax":
            return self.reducer((src.x * dst.h).sum(axis=-1) * edge.w, src.x - dst.h)
        return tg.math.tanh(src.x) * edge.w + dst.h


def operands(g, seed):
    rng = np.random.default_rng(seed)
    return dict(graph=g, src={"x": rng.normal(size=(g.num_src, 3))},
                dst={"h": rng.normal(size=(g.num_dst, 3))},
                edge={"w": rng.uniform(0.5, 1.5, size=(g.num_edges,))})


def test_walk_is_native_not_resolved():
    # the relation descriptor keeps the implicit walk; explain() says no CSR is built
    tri = tg.Graph.triangular(4)
    assert relation_descriptor(tri, "dst", target="triton") == ("triangular",)
    assert relation_descriptor(tri, "src", target="triton") == ("triangular_t",)  # natively
    g = tg.Graph.cu_seqlens([0, 2, 5], causal=False)
    assert relation_descriptor(g, "dst", target="triton") == ("cu_seqlens", False)
    ops = operands(g, 0)
    old = tg.config._backend
    tg.config.backend = "triton-interpreter"
    try:
        text = str(Layer(tg.sum()).explain(**ops))
    finally:
        tg.config.backend = old
    assert "cu_seqlens edges computed from indices (no CSR)" in text


@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "online_softmax"])
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(g=relations(), seed=st.integers(0, 2**16))
def test_forward_matches_reference(interpreter, reducer, g, seed):
    layer, ops = Layer(getattr(tg, reducer)()), operands(g, seed)
    got = np.asarray(layer(**ops))
    if relation_descriptor(g, "dst", target="triton") != ("csr",):
        assert g._csr is None    # walked from indices: the CSR was never built
    want = np.asarray(layer.reference(**ops))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-10, atol=1e-12)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(g=relations(), seed=st.integers(0, 2**16))
def test_grad_matches_reference(interpreter, g, seed):
    layer, ops = Layer(tg.sum()), operands(g, seed)
    x, h, w = ops["src"]["x"], ops["dst"]["h"], ops["edge"]["w"]
    weights = np.random.default_rng(seed + 1).normal(size=(g.num_dst, 3))

    def loss(x, h, w, ref=False):
        fn = layer.reference if ref else layer
        y = fn(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w})
        return (y.reshape((g.num_dst, 3)) * weights).sum()

    got = tg.grad(loss, argnums=(0, 1, 2))(x, h, w)
    want = reference_grad(lambda *a: loss(*a, ref=True), argnums=(0, 1, 2))(x, h, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10)
