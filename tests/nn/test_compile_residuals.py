"""A compiled tg.nn layer's backward differentiates the forward's own autograd graph
(tiga::layer_saved keeps it under a token) instead of recomputing the layer's region: one
region run per layer and step, with gradients equal to the eager layer's; the kept graph
leaves when the backward takes it, or when the forward's outputs die without a backward;
a second backward (retain_graph) recomputes and gets the same gradients."""
from __future__ import annotations

import gc

import pytest

import tiga as tg

from ._pyg import torch

opaque = pytest.importorskip("tiga.torch_bridge.layers.opaque")
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 3], [1, 2, 2, 0, 3, 1, 4, 5, 0]])


def _counting(monkeypatch) -> dict:
    """Counts of region runs and of recomputing backwards."""
    counts = {"runs": 0, "recomputed": 0}
    run, vjp = opaque._Region.run, opaque._vjp_op

    def counted_run(self, tensors):
        counts["runs"] += 1
        return run(self, tensors)

    def counted_vjp(*args):
        counts["recomputed"] += 1
        return vjp(*args)
    monkeypatch.setattr(opaque._Region, "run", counted_run)
    monkeypatch.setattr(opaque, "_vjp_op", counted_vjp)
    return counts


@pytest.mark.parametrize("make", [lambda: tg.nn.GCNConv(5, 4),
                                  lambda: tg.nn.GATConv(5, 3, heads=2)])
def test_backward_reads_the_forwards_residuals(make, monkeypatch):
    conv = make().double()
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    counts = _counting(monkeypatch)
    for seed in (1, 2):
        x = torch.randn(7, 5, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed), requires_grad=True)
        cot = torch.randn(7, conv(x, EDGE_INDEX).size(1), dtype=torch.float64)
        want = torch.autograd.grad((conv(x, EDGE_INDEX) * cot).sum(), [x, conv.lin.weight])
        before = dict(counts)
        got = torch.autograd.grad((compiled(x, EDGE_INDEX) * cot).sum(), [x, conv.lin.weight])
        assert counts["runs"] - before["runs"] == 1 and counts["recomputed"] == 0
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert not opaque._SAVED


def test_kept_graphs_leave(monkeypatch):
    """No backward: the entry leaves with the outputs; retain_graph: the second backward
    recomputes (its entry was taken) and agrees with the first."""
    conv = tg.nn.GCNConv(5, 4).double()
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    out = compiled(x, EDGE_INDEX)
    assert len(opaque._SAVED) == 1
    del out
    gc.collect()
    assert not opaque._SAVED
    counts = _counting(monkeypatch)
    total = compiled(x, EDGE_INDEX).square().sum()
    first = torch.autograd.grad(total, x, retain_graph=True)[0]
    second = torch.autograd.grad(total, x)[0]
    assert counts["recomputed"] == 1
    torch.testing.assert_close(first, second, rtol=1e-12, atol=1e-12)
