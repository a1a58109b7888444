"""An edge_index changed in place between calls (issue 40 item 6) is never served from a
stale memo: through index_put_ (which bumps the version counter) and through .data or
.numpy() (which do not), for every layer, a flipped (flow) or sparse relation, GCN's
cache and the pooling relation."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import torch

utils = pytest.importorskip("torch_geometric.utils")

LAYERS = {
    "gcn": lambda: tg.nn.GCNConv(4, 3),
    "gcn_t2s": lambda: tg.nn.GCNConv(4, 3, flow="target_to_source"),
    "sage": lambda: tg.nn.SAGEConv(4, 3, aggr=["mean", "max"]),
    "gin": lambda: tg.nn.GINConv(torch.nn.Linear(4, 3)),
    "gat": lambda: tg.nn.GATConv(4, 3, heads=2),
    "gatv2": lambda: tg.nn.GATv2Conv(4, 3),
    "edge": lambda: tg.nn.EdgeConv(torch.nn.Linear(8, 3)),
}


def _edit(ei: torch.Tensor, how: str) -> None:
    """Point edge 0 at node 3 (was 1) without replacing the tensor."""
    if how == "data":
        ei.data[1, 0] = 3
    elif how == "numpy":
        ei.numpy()[1, 0] = 3
    else:
        ei.index_put_((torch.tensor([1]), torch.tensor([0])), torch.tensor(3))


@pytest.mark.parametrize("how", ["data", "numpy", "index_put"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_in_place_edits_are_seen(name, how):
    torch.manual_seed(0)
    conv = LAYERS[name]()
    x = torch.randn(5, 4)
    ei = torch.tensor([[0, 2, 3, 4], [1, 1, 0, 2]])
    before = conv(x, ei)
    _edit(ei, how)
    fresh = ei.clone()
    got = conv(x, ei)
    assert torch.equal(got, conv(x, fresh))
    assert not torch.equal(got, before)


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_sparse_adjacency_edits_are_seen(how):
    torch.manual_seed(0)
    conv = tg.nn.SAGEConv(4, 3, aggr="sum")
    x = torch.randn(5, 4)
    adj = utils.to_torch_coo_tensor(torch.tensor([[0, 2, 3, 4], [1, 1, 0, 2]]),
                                    size=(5, 5)).t().coalesce()
    before = conv(x, adj)
    index = adj._indices()
    if how == "data":
        index.data[1, 0] = 4       # edge 1 -> 0 becomes 4 -> 0 (still coalesced)
    else:
        index.numpy()[1, 0] = 4
    got = conv(x, adj)
    assert not torch.equal(got, before)
    fresh = torch.sparse_coo_tensor(index.clone(), adj._values().clone(), (5, 5)).coalesce()
    assert torch.equal(got, conv(x, fresh))


def test_gcn_cache_sees_an_edit_through_data():
    conv = tg.nn.GCNConv(4, 3, cached=True)
    x, ei = torch.randn(5, 4), torch.tensor([[0, 2, 3, 4], [1, 1, 0, 2]])
    conv(x, ei)
    ei.data[1, 0] = 3
    with pytest.raises(tg.TigaError, match="cached=True holds the normalisation"):
        conv(x, ei)


def test_pooling_sees_an_edit_through_data():
    x, batch = torch.randn(5, 2), torch.tensor([0, 0, 1, 1, 1])
    before = tg.nn.global_add_pool(x, batch)
    batch.data[2] = 0
    got = tg.nn.global_add_pool(x, batch)
    assert torch.equal(got, tg.nn.global_add_pool(x, batch.clone()))
    assert not torch.equal(got, before)
