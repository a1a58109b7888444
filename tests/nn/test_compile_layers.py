"""tg.nn layers inside torch.compile (issue 26 item 6): a two-layer GCN and a two-head GAT
model compile with fullgraph=True and no graph break under the eager, aot_eager and
inductor backends, each layer's relation work one opaque `tiga::layer` op (GCN's cached=True
included: the cache is read inside the op), with outputs and
gradients (input, edge weights, every parameter) equal to PyG's model holding the same
state dict (float64), for an edge_index tensor and for a tg.Graph given directly; and a
bipartite SAGE + GIN model under aot_eager.
Kept few: an inductor compile takes tens of seconds on 2 cores."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import assert_same, pyg, randomized, torch
from .test_gcn import count_normalisations

counters = pytest.importorskip("torch._dynamo.utils").counters

N, F = 7, 5
# a self loop (node 3), a duplicate edge (1 -> 2) and an isolated node (6)
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 3], [1, 2, 2, 0, 3, 1, 4, 5, 0]])


class TwoLayers(torch.nn.Module):
    """conv1 -> relu -> conv2, the relation (and GCN's edge weights) passed to both."""

    def __init__(self, make_first, make_second):
        super().__init__()
        self.conv1, self.conv2 = make_first(), make_second()

    def forward(self, x, edge_index, edge_weight=None):
        extra = () if edge_weight is None else (edge_weight,)
        return self.conv2(torch.relu(self.conv1(x, edge_index, *extra)), edge_index, *extra)


def gcn(nn):
    return TwoLayers(lambda: nn.GCNConv(F, 6), lambda: nn.GCNConv(6, 3))


def gat(nn):
    return TwoLayers(lambda: nn.GATConv(F, 4, heads=2),
                     lambda: nn.GATv2Conv(8, 3, heads=2, concat=False))


def pair(make):
    theirs = randomized(make(pyg))
    ours = make(tg.nn).double()
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def layer_ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if "tiga.layer" in str(n.target))


def compiled_matches_pyg(make, backend, relation, *inputs):
    """compile(ours) == PyG's model, outputs and gradients, with one Dynamo graph holding
    one opaque op per layer and no graph break."""
    ours, theirs = pair(make)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(ours, backend=recording, fullgraph=True)
    edge_index = EDGE_INDEX if relation == "edge_index" else \
        tg.Graph.from_coo(EDGE_INDEX[0].numpy(), EDGE_INDEX[1].numpy(), num_src=N, num_dst=N)

    def call(model, x, *rest):
        if model is ours:
            return compiled(x, edge_index, *rest)
        return model(x, EDGE_INDEX, *rest)
    for seed in (1, 2):    # new values, same shapes: the same compiled graph
        x = torch.randn(N, F, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed))
        assert_same(ours, theirs, call, x, *inputs)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1 and len(graphs) == 1
    assert layer_ops(graphs[0]) == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_two_layer_gcn_with_edge_weights(backend):
    weight = torch.rand(EDGE_INDEX.size(1), dtype=torch.float64,
                        generator=torch.Generator().manual_seed(3)) + 0.5
    compiled_matches_pyg(gcn, backend, "edge_index", weight)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_two_head_gat(backend):
    compiled_matches_pyg(gat, backend, "edge_index")


@pytest.mark.parametrize("make", [gcn, gat])
def test_a_graph_given_directly(make):
    """A tg.Graph is a constant of the op (its edge order: from_coo's, which PyG's
    add_remaining_self_loops / GAT loops do not depend on for these node outputs)."""
    compiled_matches_pyg(make, "aot_eager", "graph")


def cached_gcn(nn):
    return TwoLayers(lambda: nn.GCNConv(F, 6, cached=True),
                     lambda: nn.GCNConv(6, 3, cached=True))


def test_cached_gcn(monkeypatch):
    """cached=True is one op per layer too (it graph-broke per layer): the layer's cache
    is read inside the op, filled once per layer in two compiled steps with backward."""
    runs = count_normalisations(monkeypatch)
    compiled_matches_pyg(cached_gcn, "aot_eager", "edge_index")
    assert len(runs) == 2


class Bipartite(torch.nn.Module):
    """SAGE (max) and GIN (trainable eps) over a bipartite relation, 8 sources -> 7 nodes."""

    def __init__(self, nn):
        super().__init__()
        self.sage = nn.SAGEConv((F, F), F, aggr="max")
        self.gin = nn.GINConv(torch.nn.Linear(F, 3), train_eps=True)

    def forward(self, x_src, x_dst, edge_index):
        return self.gin((x_src, self.sage((x_src, x_dst), edge_index)), edge_index)


def test_bipartite_sage_and_gin():
    ours, theirs = pair(Bipartite)
    gen = torch.Generator().manual_seed(4)
    edge_index = torch.stack([torch.randint(0, 8, (20,), generator=gen),
                              torch.randint(0, N, (20,), generator=gen)])
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)

    def call(model, x_src, x_dst):
        return (compiled if model is ours else model)(x_src, x_dst, edge_index)
    assert_same(ours, theirs, call, torch.randn(8, F, dtype=torch.float64, generator=gen),
                torch.randn(N, F, dtype=torch.float64, generator=gen))
    assert sum(counters["graph_break"].values()) == 0
