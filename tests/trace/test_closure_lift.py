"""Disk tensors a traced function closes over are lifted into inputs of its program (issue 28
item 4): tg.jit, tg.grad, tg.vjp and tg.value_and_grad take them as the program's first
inputs, so the runtime pages them as it pages an argument, instead of literals it reads
whole. Results are checked against numpy on the same arrays; the in-memory array closed over
stays a literal."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.core.program import Lit
from tiga.trace import call_cache

pytest.importorskip("zarr", minversion="3.1")

N, F = 300, 3


class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, w):
        return src.x * w


@pytest.fixture
def case(tmp_path):
    rng = np.random.default_rng(0)
    deg = rng.integers(0, 4, N)
    rp = np.concatenate([[0], np.cumsum(deg)])
    ci = rng.integers(0, N, rp[-1])
    xs = rng.random((N, F))
    with tg.scope(spill_dir=tmp_path):
        x = tg.asarray(xs).to("disk")
        yield tg.Graph.from_csr(rp, ci, num_src=N), x, xs, np.repeat(np.arange(N), deg), ci


def literals(program) -> list:
    return [a.value for e in program.eqns for a in e.inputs if isinstance(a, Lit)]


def test_jit_lifts_a_closed_over_disk_tensor(case):
    g, x, xs, dst, src = case
    layer = Scaled()
    lowered = tg.jit(lambda w: layer(graph=g, src={"x": x}, w=w)).lower(np.float64(2.0))
    binders = lowered.program.in_binders
    assert len(binders) == 2 and tuple(binders[0].type.shape) == (N, F)
    assert not any(v is x for v in literals(lowered.program))
    want = np.zeros((N, F))
    np.add.at(want, dst, 2.5 * xs[src])
    np.testing.assert_allclose(np.asarray(lowered.compile()(np.float64(2.5))), want,
                               rtol=1e-13, atol=0)
    got = tg.jit(lambda w: layer(graph=g, src={"x": x}, w=w))(np.float64(2.5))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=0)
    # an array in memory closed over stays a literal: nothing to page
    host = tg.jit(lambda w: layer(graph=g, src={"x": xs}, w=w)).lower(np.float64(2.0))
    assert len(host.program.in_binders) == 1


def test_grad_vjp_through_a_closed_over_disk_tensor(case):
    g, x, xs, dst, src = case
    layer = Scaled()

    def f(w, h):        # x from the closure, h an argument
        return tg.math.sum(layer(graph=g, src={"x": x}, w=w) * h)

    h = np.random.default_rng(1).random((N, F))
    dw, dh = tg.grad(f, argnums=(0, 1))(np.float64(1.5), h)
    msg = np.zeros((N, F))
    np.add.at(msg, dst, xs[src])
    np.testing.assert_allclose(float(np.asarray(dw)), (msg * h).sum(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(dh), 1.5 * msg, rtol=1e-13, atol=0)
    value, (dw2, _) = tg.value_and_grad(f, argnums=(0, 1))(np.float64(1.5), h)
    np.testing.assert_allclose(float(np.asarray(value)), 1.5 * (msg * h).sum(), rtol=1e-12)
    assert float(np.asarray(dw2)) == float(np.asarray(dw))
    y, back = tg.vjp(lambda w: layer(graph=g, src={"x": x}, w=w), np.float64(1.5))
    np.testing.assert_allclose(np.asarray(y), 1.5 * msg, rtol=1e-13, atol=0)
    (ct,) = back(h)
    np.testing.assert_allclose(float(np.asarray(ct)), (msg * h).sum(), rtol=1e-12)


def test_grad_trace_with_a_lifted_tensor_is_reused(case):
    g, x, xs, dst, src = case
    layer = Scaled()

    def f(w):
        return tg.math.sum(layer(graph=g, src={"x": x}, w=w))

    tg.grad(f)(np.float64(1.0))
    hits = call_cache.STATS["hits"]
    got = tg.grad(f)(np.float64(2.0))
    assert call_cache.STATS["hits"] == hits + 1
    np.testing.assert_allclose(float(np.asarray(got)), xs[src].sum(), rtol=1e-12)
