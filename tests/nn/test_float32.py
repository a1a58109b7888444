"""Every tg.nn layer in float32 (the dtype models train in) against PyG's in float32, state
dict loaded: outputs and gradients to float32 rounding, on a graph with self loops,
duplicate edges and an isolated node."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import assert_same, case, pyg, torch

nn = torch.nn


def _mlp(n_in, n_out):
    return nn.Sequential(nn.Linear(n_in, 6), nn.ReLU(), nn.Linear(6, n_out))


LAYERS = {
    "GCNConv": lambda m: m.GCNConv(5, 3),
    "SAGEConv": lambda m: m.SAGEConv(5, 3, aggr="max"),
    "GATConv": lambda m: m.GATConv(5, 3, heads=2),
    "GATv2Conv": lambda m: m.GATv2Conv(5, 3, heads=2, concat=False),
    "GINConv": lambda m: m.GINConv(_mlp(5, 3), train_eps=True),
    "EdgeConv": lambda m: m.EdgeConv(_mlp(10, 3)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_float32_matches_pyg(name):
    ei, _ = case("duplicates")        # node 4 isolated, node 2 with two loops
    theirs = LAYERS[name](pyg)
    ours = LAYERS[name](tg.nn)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.5 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 5)
    out = assert_same(ours, theirs, lambda m, v: m(v, ei), x, rtol=1e-5, atol=1e-6)[0]
    assert out.dtype == torch.float32
