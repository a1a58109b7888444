"""Issue 40's thirteen more layers inside torch.compile (aot_eager): the eleven whose
relation work is opaque `tiga::layer` ops (SGConv, APPNP, TAGConv, ChebConv, GraphConv,
GCN2Conv, ResGatedGraphConv, TransformerConv; NNConv and PNAConv: the edge order, then the
reduction of the messages their networks form in the traced graph; RGCNConv, plain and
featureless) compile with no graph break; GENConv (its softmax and power-mean
aggregations hold parameters) and PointNetConv (self loops remade per call) break the graph
at their relation work and still compile. All give PyG's outputs and input gradients with
PyG's state dict loaded (float64)."""
from __future__ import annotations

import pytest

import tiga as tg

torch = pytest.importorskip("torch")
pyg = pytest.importorskip("torch_geometric.nn")
counters = pytest.importorskip("torch._dynamo.utils").counters

# a self loop (node 3), a duplicate edge (1 -> 2) and an isolated node (6)
EI = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 3], [1, 2, 2, 0, 3, 1, 4, 5, 0]])
W = torch.rand(9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
E = torch.randn(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
TYPES = torch.tensor([0, 1, 1, 0, 2, 2, 1, 0, 1])

FUSED = {
    "SGConv": (lambda nn: nn.SGConv(5, 3, K=2), lambda m, x: m(x, EI, W)),
    "APPNP": (lambda nn: nn.APPNP(2, 0.1), lambda m, x: m(x, EI, W)),
    "TAGConv": (lambda nn: nn.TAGConv(5, 3, K=2), lambda m, x: m(x, EI, W)),
    "ChebConv": (lambda nn: nn.ChebConv(5, 3, K=3), lambda m, x: m(x, EI, W)),
    "GraphConv": (lambda nn: nn.GraphConv(5, 3, aggr="max"), lambda m, x: m(x, EI, W)),
    "GCN2Conv": (lambda nn: nn.GCN2Conv(5, 0.2), lambda m, x: m(x, x, EI, W)),
    "ResGatedGraphConv": (lambda nn: nn.ResGatedGraphConv(5, 3, edge_dim=2),
                          lambda m, x: m(x, EI, E)),
    "TransformerConv": (lambda nn: nn.TransformerConv(5, 3, heads=2, edge_dim=2),
                        lambda m, x: m(x, EI, E)),
    "NNConv": (lambda nn: nn.NNConv(5, 3, torch.nn.Linear(2, 15), aggr="max"),
               lambda m, x: m(x, EI, E)),
    "RGCNConv": (lambda nn: nn.RGCNConv(5, 3, 3, num_bases=2), lambda m, x: m(x, EI, TYPES)),
    "RGCNConv-featureless": (lambda nn: nn.RGCNConv(7, 3, 3),
                             lambda m, x: m(None, EI, TYPES) + x[:, :3]),
    "PNAConv": (lambda nn: nn.PNAConv(5, 4, ["mean", "max", "std"], ["identity", "linear"],
                                      torch.tensor([1, 2, 3]), edge_dim=2),
                lambda m, x: m(x, EI, E)),
}
PER_EDGE = {
    "GENConv": (lambda nn: nn.GENConv(5, 3, edge_dim=2, norm="layer"),
                lambda m, x: m(x, EI, E)),
    "PointNetConv": (lambda nn: nn.PointNetConv(torch.nn.Linear(8, 3)),
                     lambda m, x: m(x, x[:, :3], EI)),
}


def _compiled_matches_pyg(make, call) -> int:
    """compile(ours) against PyG's layer: outputs and input gradients; the graph breaks."""
    theirs = make(pyg).double()
    ours = make(tg.nn).double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lambda v: call(ours, v), backend="aot_eager")
    got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = fn(got_x), call(theirs, want_x)
    cot = torch.randn(got.shape, dtype=got.dtype, generator=torch.Generator().manual_seed(3))
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(got_x.grad, want_x.grad, rtol=1e-9, atol=1e-11)
    return sum(counters["graph_break"].values())


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_layers_compile_without_graph_break(name):
    assert _compiled_matches_pyg(*FUSED[name]) == 0


@pytest.mark.parametrize("name", sorted(PER_EDGE))
def test_per_edge_layers_compile(name):
    _compiled_matches_pyg(*PER_EDGE[name])
