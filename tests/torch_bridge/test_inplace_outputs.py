"""torch autograd through a Tiga call whose VJP reads the forward's output (online_softmax)
takes that output instead of recomputing it, and saves it for backward: changing it in place
raises torch's error. Outputs the VJP does not read (sum) may change in place."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.reports.runs import COUNTERS

torch = pytest.importorskip("torch")


class Sum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return self.reducer(src.x)


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((dst.q * src.k).sum(-1), src.k)


def test_sum_output_may_change_in_place():
    graph = tg.Graph.triangular(7)
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    y = Sum()(graph=graph, src={"x": x})
    y.relu_()
    (g,) = torch.autograd.grad(y.sum(), x)
    # y_i = relu(sum_{j <= i} x_j): dy/dx_j = number of rows i >= j with a positive sum
    s = np.cumsum(x.detach().numpy(), axis=0)
    want = np.cumsum(((s > 0) * 1.0)[::-1], axis=0)[::-1]
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12)


def test_output_read_by_the_vjp_raises_when_changed_in_place():
    graph = tg.Graph.triangular(7)
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    y = Attention()(graph=graph, src={"k": x}, dst={"q": x})
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y.sum(), x)


def test_output_read_by_the_vjp_is_not_recomputed():
    graph = tg.Graph.triangular(70)
    x = torch.randn(70, 2, 16, requires_grad=True)
    before = COUNTERS["native_calls"]
    y = Attention()(graph=graph, src={"k": x}, dst={"q": x})
    assert COUNTERS["native_calls"] == before + 1
    (g,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert COUNTERS["native_calls"] == before + 1   # no forward in backward
    assert torch.isfinite(g).all()
