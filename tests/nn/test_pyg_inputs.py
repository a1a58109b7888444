"""The inputs PyG's layers take besides x and edge_index (issue 40), against PyG with its
state dict loaded (float64, outputs and every gradient): bipartite (x_src, None) with
size=, the static-graph x (B, N, F), flow="target_to_source", torch.sparse adj_t (CSR,
CSC, COO), lazy in_channels=-1, SAGEConv's aggregators, GINEConv, GAT on an empty graph,
and return_attention_weights giving the plain forward's output bit for bit."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import CASES, assert_same, case, loaded, pyg, randomized, torch

utils = pytest.importorskip("torch_geometric.utils")


def _x(*shape, seed: int = 1):
    return torch.randn(*shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


def _mlp(n_in: int = 5, n_out: int = 3):
    return torch.nn.Sequential(torch.nn.Linear(n_in, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, n_out))


LAYERS = {
    "gcn": lambda m: m.GCNConv(5, 3),
    "sage": lambda m: m.SAGEConv(5, 3),
    "gin": lambda m: m.GINConv(_mlp()),
    "gat": lambda m: m.GATConv(5, 3, heads=2),
    "gatv2": lambda m: m.GATv2Conv(5, 3, heads=2),
    "edge": lambda m: m.EdgeConv(_mlp(10, 3), aggr="max"),
}


def _pair(name: str):
    torch.manual_seed(0)
    theirs = randomized(LAYERS[name](pyg))
    torch.manual_seed(0)
    return loaded(LAYERS[name](tg.nn), theirs), theirs


@pytest.mark.parametrize("layout", ["csr", "csc", "coo"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_sparse_adjacency_matches_pyg(name, layout):
    # (no duplicate edges: a sparse adjacency holds one entry per pair)
    ei, n = case("isolated" if name in ("sage", "gin", "gcn") else "pyg")
    adj = utils.to_torch_csc_tensor(ei, size=(n, n)).t()      # CSR (targets, sources)
    if layout == "csc":
        adj = adj.to_sparse_csc()
    elif layout == "coo":
        adj = utils.to_torch_coo_tensor(ei, size=(n, n)).t().coalesce()
    ours, theirs = _pair(name)
    want = theirs(_x(n, 5), ei)
    torch.testing.assert_close(ours(_x(n, 5), adj), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("graph", sorted(CASES))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_target_to_source_flow_matches_pyg(name, graph):
    ei, n = case(graph)
    torch.manual_seed(0)
    theirs = randomized(LAYERS[name](pyg))
    theirs.flow = "target_to_source"
    torch.manual_seed(0)
    ours = loaded(LAYERS[name](tg.nn), theirs)
    ours.flow = "target_to_source"
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n, 5))


@pytest.mark.parametrize("name", ["gcn", "sage", "gin"])
def test_static_graph_matches_pyg(name):
    ei, n = case("self_loops")
    ours, theirs = _pair(name)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(3, n, 5))


@pytest.mark.parametrize("name", ["sage", "gin", "gat"])
def test_bipartite_without_destination_rows_matches_pyg(name):
    ei = torch.tensor([[0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0]])
    ours, theirs = _pair(name)
    assert_same(ours, theirs, lambda m, v: m((v, None), ei, size=(6, 4)), _x(6, 5))


AGGRS = {
    "list": dict(aggr=["mean", "max", "std"]),
    "var": dict(aggr="var"),
    "std": dict(aggr="std"),
    "softmax": dict(aggr="softmax"),
    "softmax_learn": dict(aggr="softmax", aggr_kwargs=dict(learn=True, t=0.5)),
    "powermean": dict(aggr="powermean", aggr_kwargs=dict(learn=True, p=1.5)),
    "proj": dict(aggr=["mean", "sum"], aggr_kwargs=dict(
        mode="proj", mode_kwargs=dict(in_channels=5, out_channels=4))),
    "mul": dict(aggr="mul"),
}


@pytest.mark.parametrize("graph", ["pyg", "duplicates", "no_edges", "isolated"])
@pytest.mark.parametrize("config", sorted(AGGRS))
def test_sage_aggregators_match_pyg(config, graph):
    ei, n = case(graph)
    theirs = randomized(pyg.SAGEConv(5, 3, **AGGRS[config]))
    ours = loaded(tg.nn.SAGEConv(5, 3, **AGGRS[config]), theirs)
    x = _x(n, 5).abs() + 0.1 if config == "powermean" else _x(n, 5)
    assert_same(ours, theirs, lambda m, v: m(v, ei), x)


def test_sage_aggregation_module_and_lstm_match_pyg():
    ei = torch.tensor([[0, 1, 2, 3, 3], [0, 0, 1, 1, 2]])
    theirs = randomized(pyg.SAGEConv(5, 3, aggr=pyg.aggr.SoftmaxAggregation(learn=True)))
    ours = loaded(tg.nn.SAGEConv(5, 3, aggr=tg.nn.aggr.SoftmaxAggregation(learn=True)),
                  theirs)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(4, 5))
    theirs = randomized(pyg.SAGEConv(5, 3, aggr="lstm"))
    ours = loaded(tg.nn.SAGEConv(5, 3, aggr="lstm"), theirs)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(4, 5))
    with pytest.raises(ValueError, match="'index' tensor is not sorted"):
        ours(_x(4, 5), ei.flip(1))


@pytest.mark.parametrize("graph", sorted(CASES))
@pytest.mark.parametrize("edge_dim", [None, 4])
def test_gine_matches_pyg(graph, edge_dim):
    ei, n = case(graph)
    theirs = randomized(pyg.GINEConv(_mlp(), eps=0.2, train_eps=True, edge_dim=edge_dim))
    ours = loaded(tg.nn.GINEConv(_mlp(), eps=0.2, train_eps=True, edge_dim=edge_dim), theirs)
    e = _x(ei.size(1), edge_dim or 5, seed=3)
    assert_same(ours, theirs, lambda m, v, w: m(v, ei, w), _x(n, 5), e)
    if graph == "pyg":
        assert_same(ours, theirs, lambda m, v, w: m((v, None), ei, w, size=(n, n)),
                    _x(n, 5), e)


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gatv2"])
def test_lazy_in_channels_match_pyg(name):
    make = {"gcn": lambda m: m.GCNConv(-1, 3), "sage": lambda m: m.SAGEConv(-1, 3),
            "gat": lambda m: m.GATConv(-1, 3, heads=2),
            "gatv2": lambda m: m.GATv2Conv(-1, 3, heads=2)}[name]
    ei, n = case("pyg")
    theirs, ours = make(pyg).double(), make(tg.nn).double()
    theirs(_x(n, 5), ei)
    ours(_x(n, 5), ei)     # the first call gives the weights their shapes
    theirs = randomized(theirs)
    ours = loaded(ours, theirs)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n, 5))


@pytest.mark.parametrize("name", ["gat", "gatv2"])
def test_attention_on_a_graph_without_nodes(name):
    ours, _ = _pair(name)
    out = ours(torch.zeros(0, 5, dtype=torch.float64), torch.zeros(2, 0, dtype=torch.int64))
    assert out.shape == (0, 6)
    out, (where, alpha) = ours(torch.zeros(0, 5, dtype=torch.float64),
                               torch.zeros(2, 0, dtype=torch.int64),
                               return_attention_weights=True)
    assert out.shape == (0, 6) and where.shape == (2, 0) and alpha.shape == (0, 2)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", ["gat", "gatv2"])
def test_attention_weights_leave_the_output_bit_identical(name, seed):
    """float32, as PyG's test: the output with return_attention_weights=True is the plain
    forward's, bit for bit (PyG's own test checks it with allclose's default tolerance)."""
    torch.manual_seed(seed)
    conv = LAYERS[name](tg.nn)
    x = torch.randn(40, 5)
    ei = torch.randint(0, 40, (2, 200))
    out = conv(x, ei)
    got, (where, alpha) = conv(x, ei, return_attention_weights=True)
    assert torch.equal(got, out)
    assert where.shape == (2, alpha.size(0)) and alpha.shape[1] == 2
    adj = utils.to_torch_csc_tensor(ei, size=(40, 40)).t()
    sparse_out, (adj_alpha, _) = conv(x, adj, return_attention_weights=True)
    assert torch.equal(sparse_out, conv(x, adj))
    assert adj_alpha.shape == (40, 40, 2)


def test_gcn_norm_matches_pyg():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_norm
    ei, n = case("self_loops")
    w = _x(ei.size(1)).abs()
    got_ei, got_w = tg.nn.gcn_norm(ei, w, n, improved=True)
    want_ei, want_w = pyg_norm(ei, w, n, improved=True)
    assert torch.equal(got_ei, want_ei)
    torch.testing.assert_close(got_w, want_w, rtol=1e-12, atol=1e-12)


def test_aggregations_called_as_pyg():
    x = _x(9, 4)
    index = torch.tensor([0, 0, 1, 1, 1, 3, 3, 3, 2])
    for name in ("Sum", "Mean", "Max", "Min", "Var", "Std", "Softmax", "PowerMean"):
        ours = getattr(tg.nn.aggr, f"{name}Aggregation")()
        theirs = getattr(pyg.aggr, f"{name}Aggregation")()
        x_in = x.abs() if name == "PowerMean" else x
        torch.testing.assert_close(ours(x_in, index, dim_size=5),
                                   theirs(x_in, index, dim_size=5))
    ptr = torch.tensor([0, 2, 5, 9])
    torch.testing.assert_close(tg.nn.aggr.MeanAggregation()(x, ptr=ptr),
                               pyg.aggr.MeanAggregation()(x, ptr=ptr))


@pytest.mark.parametrize("which", ["softmax", "multi_proj"])
def test_sage_takes_pyg_aggregation_modules(which):
    """A torch_geometric aggregation module as aggr=: kept as it is (PyG's state dict
    names), run in torch on the gathered rows."""
    def make(m):
        if which == "softmax":
            return m.aggr.SoftmaxAggregation(learn=True)
        return m.aggr.MultiAggregation(["mean", "max"], mode="proj",
                                       mode_kwargs=dict(in_channels=5, out_channels=4))
    ei, n = case("duplicates")
    theirs = randomized(pyg.SAGEConv(5, 3, aggr=make(pyg)))
    ours = loaded(tg.nn.SAGEConv(5, 3, aggr=make(pyg)), theirs)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n, 5))
