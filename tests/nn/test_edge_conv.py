"""tg.nn.EdgeConv and tg.nn.DynamicEdgeConv against PyG's EdgeConv (state dict loaded,
float64): outputs and gradients on PyG's test graph, isolated nodes, self loops, duplicate
edges, no edges and bipartite inputs, with a network Tiga captures (it runs in the edge
function) and ones it does not (torch evaluates them per edge). DynamicEdgeConv is checked
against PyG's EdgeConv on a dense torch kNN (PyG's own needs pyg-lib's knn)."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import CASES, assert_same, case, loaded, pyg, randomized, torch

nn = torch.nn


def _mlp(f: int = 5, out: int = 3):
    return nn.Sequential(nn.Linear(2 * f, 8), nn.ReLU(), nn.Linear(8, out))


def _x(n: int, f: int = 5, seed: int = 1):
    return torch.randn(n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _edge_conv(net, aggr="max"):
    theirs = randomized(pyg.EdgeConv(net(), aggr=aggr))
    return loaded(tg.nn.EdgeConv(net(), aggr=aggr), theirs), theirs


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("aggr", ["max", "mean", "add"])
def test_edge_conv_matches_pyg(aggr, name):
    ei, n = case(name)
    ours, theirs = _edge_conv(_mlp, aggr)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))
    assert ours._network, "the Sequential MLP should run inside Tiga's edge function"


def test_a_network_tiga_cannot_capture_runs_in_torch():
    """BatchNorm (train mode: statistics over the E edge rows, as PyG) is not traceable."""
    ei, n = case("duplicates")

    def net():
        return nn.Sequential(nn.Linear(10, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))

    ours, theirs = _edge_conv(net, "mean")
    ours.train(), theirs.train()
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))
    assert ours._network is False


def test_dropout_in_training_falls_back_with_pyg_masks():
    ei, n = case("pyg")

    def net():
        return nn.Sequential(nn.Linear(10, 6), nn.Dropout(0.5), nn.Linear(6, 3))

    ours, theirs = _edge_conv(net)
    ours.train(), theirs.train()

    def call(m, v):
        torch.manual_seed(11)
        return m(v, ei)

    assert_same(ours, theirs, call, _x(n))
    ours.eval(), theirs.eval()
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))   # traced again in eval mode


def test_edge_conv_bipartite():
    ei = torch.tensor([[0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0]])
    ours, theirs = _edge_conv(_mlp)
    assert_same(ours, theirs, lambda m, a, b: m((a, b), ei), _x(6), _x(3, seed=2))


def _knn_edge_index(x_src, x_dst, k, b_src=None, b_dst=None):
    """PyG's knn(x_src, x_dst, k).flip(0) by brute force: the k nearest sources of every
    destination (itself included), other graphs of the batch excluded."""
    d = torch.cdist(x_dst, x_src)
    if b_src is not None:
        d = d.masked_fill(b_dst[:, None] != b_src[None, :], float("inf"))
    nbrs = d.topk(k, dim=1, largest=False).indices
    dst = torch.arange(len(x_dst)).repeat_interleave(k)
    return torch.stack([nbrs.flatten(), dst])


@pytest.mark.parametrize("aggr", ["max", "mean"])
def test_dynamic_edge_conv_matches_edge_conv_on_the_knn(aggr):
    x = _x(40, 5, seed=3)
    theirs = randomized(pyg.EdgeConv(_mlp(), aggr=aggr))
    ours = loaded(tg.nn.DynamicEdgeConv(_mlp(), k=6, aggr=aggr), theirs)
    ei = _knn_edge_index(x, x, 6)
    assert_same(ours, theirs, lambda m, v: m(v) if m is ours else m(v, ei), x)


def test_dynamic_edge_conv_batch_and_bipartite():
    x, batch = _x(30, 5, seed=4), torch.tensor([0] * 12 + [1] * 18)
    theirs = randomized(pyg.EdgeConv(_mlp()))
    ours = loaded(tg.nn.DynamicEdgeConv(_mlp(), k=4), theirs)
    ei = _knn_edge_index(x, x, 4, batch, batch)
    assert_same(ours, theirs, lambda m, v: m(v, batch) if m is ours else m(v, ei), x)
    q = _x(7, 5, seed=5)
    ei = _knn_edge_index(x, q, 4)
    assert_same(ours, theirs, lambda m, a, b: m((a, b)) if m is ours else m((a, b), ei), x, q)


def test_argument_errors_name_the_argument():
    with pytest.raises(tg.TigaError, match="EdgeConv: aggr is 'lstm'"):
        tg.nn.EdgeConv(_mlp(), aggr="lstm")
    with pytest.raises(tg.TigaError, match="DynamicEdgeConv: k is 0, expected a positive"):
        tg.nn.DynamicEdgeConv(_mlp(), k=0)
    conv = tg.nn.DynamicEdgeConv(_mlp(), k=2).double()
    with pytest.raises(tg.TigaError, match="batch has shape \\(3,\\), expected a sorted"):
        conv(_x(4), torch.tensor([0, 0, 1]))
    with pytest.raises(tg.TigaError, match="batch has shape \\(4,\\), expected a sorted"):
        conv(_x(4), torch.tensor([1, 0, 0, 1]))


def test_edge_conv_on_a_tg_knn_relation():
    """A tg.Graph.knn relation (5-D features) given to EdgeConv: PyG's EdgeConv on the same
    edges, max included (its neighbours are selected before the call)."""
    x = _x(30, 5, seed=6)
    ours, theirs = _edge_conv(_mlp)
    ei = _knn_edge_index(x, x, 5)
    assert_same(ours, theirs, lambda m, v: m(v, tg.Graph.knn(x, 5, loop=True)) if m is ours
                else m(v, ei), x)
