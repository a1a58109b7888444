"""tg.nn.EdgeConv / DynamicEdgeConv inside torch.compile (fullgraph, no graph break): with a
network Tiga captures (one opaque tiga::layer op: relation and edge network, the network's
Parameters differentiated by object) and with one torch evaluates (BatchNorm in training:
the messages stay in the compiled graph between the relation's edge_index, a data-dependent
edge count for the kNN, and Tiga's reduction). Outputs and gradients (input and every
parameter) equal to PyG's EdgeConv holding the same state dict, float64, and to the eager
layer; DynamicEdgeConv against PyG's EdgeConv on a dense torch kNN."""
from __future__ import annotations

import copy

import pytest

import tiga as tg

from ._pyg import assert_same, loaded, pyg, randomized, torch
from .test_compile_layers import layer_ops

counters = pytest.importorskip("torch._dynamo.utils").counters
nn = torch.nn
N, F = 9, 5
# a self loop, a duplicate edge, isolated node 6
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 3, 7], [1, 2, 2, 0, 3, 1, 4, 5, 0, 8]])
BATCH = torch.tensor([0] * 4 + [1] * 5)


def mlp():
    return nn.Sequential(nn.Linear(2 * F, 8), nn.ReLU(), nn.Linear(8, 4))


def batch_norm():
    return nn.Sequential(nn.Linear(2 * F, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))


def _knn(x, k, batch=None):
    """PyG's knn(x, x, k).flip(0), brute force: the k nearest rows (itself included)."""
    d = torch.cdist(x, x)
    if batch is not None:
        d = d.masked_fill(batch[:, None] != batch[None, :], float("inf"))
    nbrs = d.topk(k, dim=1, largest=False).indices
    return torch.stack([nbrs.flatten(), torch.arange(len(x)).repeat_interleave(k)])


def _x(seed):
    return torch.randn(N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def compiled_matches(net, relation, backend="aot_eager", aggr="max"):
    """Two steps (new x) of the compiled layer: PyG's outputs and gradients, the eager
    layer's outputs, one graph, no break; returns the number of tiga::layer ops."""
    theirs = randomized(pyg.EdgeConv(net(), aggr=aggr))
    dynamic = relation.startswith("knn")
    made = tg.nn.DynamicEdgeConv(net(), k=3, aggr=aggr) if dynamic else \
        tg.nn.EdgeConv(net(), aggr=aggr)
    ours = loaded(made, theirs)
    ours.train(), theirs.train()
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(ours, backend=recording, fullgraph=True)
    batch = BATCH if relation == "knn_batch" else None
    rel = tg.Graph.from_edge_index(EDGE_INDEX, num_nodes=N) if relation == "graph" else \
        EDGE_INDEX

    def call(model, v):
        if model is theirs:
            return model(v, _knn(v, 3, batch) if dynamic else EDGE_INDEX)
        if dynamic:
            return (compiled if model is ours else model)(v, batch)
        return (compiled if model is ours else model)(v, rel)
    for seed in (1, 2):
        got = assert_same(ours, theirs, call, _x(seed))[0]
        eager = call(copy.deepcopy(ours), _x(seed))
        torch.testing.assert_close(got, eager.detach(), rtol=1e-12, atol=1e-12)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1 and len(graphs) == 1
    return layer_ops(graphs[0])


@pytest.mark.parametrize("relation", ["edge_index", "graph", "knn"])
def test_a_captured_network_is_one_op(relation):
    assert compiled_matches(mlp, relation) == 1


@pytest.mark.parametrize("relation", ["edge_index", "graph", "knn_batch"])
def test_a_torch_network_stays_in_the_graph(relation):
    """BatchNorm in training (statistics over the edge rows, as PyG's): the relation's
    edge_index (none needed for an edge_index given), torch's messages, Tiga's reduction."""
    want = 1 if relation == "edge_index" else 2
    assert compiled_matches(batch_norm, relation, aggr="mean") == want


@pytest.mark.parametrize("relation", ["graph", "knn"])
def test_known_edge_counts_need_no_fullgraph(relation):
    """Without fullgraph (torch's default breaks at data-dependent sizes) a torch network
    is one graph where the relation's edge count is known: a constant tg.Graph's, or the
    kNN's without a batch vector (k per row)."""
    conv = (tg.nn.DynamicEdgeConv(batch_norm(), k=3) if relation == "knn" else
            tg.nn.EdgeConv(batch_norm())).double().train()
    graph = tg.Graph.from_edge_index(EDGE_INDEX, num_nodes=N)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(conv, backend="aot_eager")
    x = _x(1)
    got = compiled(x) if relation == "knn" else compiled(x, graph)
    want = conv(x) if relation == "knn" else conv(x, graph)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1


def test_inductor():
    assert compiled_matches(mlp, "knn", backend="inductor", aggr="mean") == 1


def test_a_copy_is_a_layer_of_its_own():
    """Compiled regions find their layer by key: a deepcopy gets a new key, so it runs its
    own parameters (after the original was compiled)."""
    conv = tg.nn.EdgeConv(mlp()).double()
    torch._dynamo.reset()
    first = torch.compile(conv, backend="aot_eager", fullgraph=True)(_x(1), EDGE_INDEX)
    twin = copy.deepcopy(conv)
    assert twin._key != conv._key
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2.0)
    torch._dynamo.reset()
    got = torch.compile(twin, backend="aot_eager", fullgraph=True)(_x(1), EDGE_INDEX)
    torch.testing.assert_close(got, twin(_x(1), EDGE_INDEX))
    assert not torch.allclose(got, first)
