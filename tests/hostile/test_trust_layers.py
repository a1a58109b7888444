"""tg.nn layers never answer for an old graph, and torch.func over a layer works (issue 41).

On 58b7cff a layer's relation memo was keyed by the edge_index object and torch's version
counter, which an edit through an alias leaves alone (the numpy array behind
torch.from_numpy, t.numpy(), t.data): GCN, SAGE, GAT and GIN answered for the old graph.
The oracles need no PyG: the same layer called on a fresh copy of the edited edge_index (a
new object, so no memo can answer) and, for GIN, the sum written in dense torch. Also on
58b7cff, torch.func.grad over functional_call(layer, ...) raised a GraphValidationError
blaming edge_index; its gradients are checked here against eager autograd, and an
edge_index batched by vmap is an error that says what to batch instead.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402

LAYERS = {
    "gcn": lambda: tg.nn.GCNConv(4, 3),
    "sage": lambda: tg.nn.SAGEConv(4, 3),
    "gat": lambda: tg.nn.GATConv(4, 3, heads=2),
    "gin": lambda: tg.nn.GINConv(torch.nn.Linear(4, 3)),
}
EDGES = [[0, 2, 3, 4], [1, 1, 0, 2]]


def _aliased(how: str):
    """(edge_index, edit): edit() points edge 0 at node 3 (was 1) through an alias that does
    not bump torch's version counter."""
    if how == "from_numpy":
        arr = np.array(EDGES)
        ei = torch.from_numpy(arr)

        def edit():
            arr[1, 0] = 3
    else:
        ei = torch.tensor(EDGES)

        def edit():
            (ei.data if how == "data" else ei.numpy())[1, 0] = 3
    return ei, edit


@pytest.mark.parametrize("how", ["from_numpy", "numpy", "data"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_an_edit_through_an_alias_is_seen(name, how):
    torch.manual_seed(0)
    layer, x = LAYERS[name](), torch.randn(5, 4)
    ei, edit = _aliased(how)
    before = layer(x, ei)
    version = ei._version
    edit()
    assert ei._version == version and ei[1, 0] == 3      # the alias left the counter alone
    got = layer(x, ei)
    assert torch.equal(got, layer(x, ei.clone())), "answered for the old graph"
    assert not torch.equal(got, before)
    if name == "gin":
        src, dst = ei
        summed = torch.zeros_like(x).index_add_(0, dst, x[src])
        torch.testing.assert_close(got, layer.nn(x + summed))


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_torch_func_grad_over_a_layer_matches_autograd(name):
    from torch.func import functional_call, grad
    torch.manual_seed(1)
    layer, x, ei = LAYERS[name](), torch.randn(5, 4), torch.tensor(EDGES)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    got = grad(lambda p: functional_call(layer, p, (x, ei)).square().sum())(params)
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    functional_call(layer, leaves, (x, ei)).square().sum().backward()
    assert set(got) == set(leaves)
    for k in got:
        torch.testing.assert_close(got[k], leaves[k].grad, msg=k)


def test_vmap_over_edge_index_says_what_to_batch_instead():
    from torch.func import vmap
    layer, x, ei = LAYERS["gcn"](), torch.randn(5, 4), torch.tensor(EDGES)
    with pytest.raises(tg.UnsupportedError, match="edge_index: is batched by torch.func.vmap") \
            as info:
        vmap(lambda e: layer(x, e))(torch.stack([ei, ei.flip(0)]))
    assert "tg.Graph.batch" in str(info.value)
