"""tg.nn.GCNConv against PyG's GCNConv (state dict loaded, float64): outputs and gradients
with respect to x, edge weights and parameters, on PyG's test graph and on isolated nodes,
existing self loops, duplicate edges and no edges; and its argument errors."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import CASES, assert_same, case, loaded, pyg, randomized, torch

CONFIGS = {
    "default": {},
    "improved": {"improved": True},
    "no_loops": {"add_self_loops": False},
    "unnormalized": {"normalize": False},
    "no_bias": {"bias": False},
}


def _layers(kwargs):
    theirs = randomized(pyg.GCNConv(5, 3, **kwargs))
    return loaded(tg.nn.GCNConv(5, 3, **kwargs), theirs), theirs


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_matches_pyg(name, config):
    ei, n = case(name)
    ours, theirs = _layers(CONFIGS[config])
    x = torch.randn(n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert_same(ours, theirs, lambda m, v: m(v, ei), x)


@pytest.mark.parametrize("name", ["pyg", "self_loops", "duplicates"])
@pytest.mark.parametrize("config", ["default", "improved", "unnormalized"])
def test_edge_weights_and_their_gradients(name, config):
    """PyG's gcn_norm gradient test: weights (loops' ones included) are differentiable.

    One deliberate difference: where a node has several self loops, PyG keeps the last
    one's weight but its index_put backward also hands the node's loop gradient to the
    overwritten ones; here they get their true derivative, 0 (checked by differences)."""
    ei, n = case(name)
    ours, theirs = _layers(CONFIGS[config])
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, 5, dtype=torch.float64, generator=gen)
    w = torch.rand(ei.size(1), dtype=torch.float64, generator=gen) + 0.1
    loops = (ei[0] == ei[1]).nonzero().flatten().tolist()
    overwritten = [e for e in loops if any(f > e and ei[0, f] == ei[0, e] for f in loops)]
    if config == "unnormalized" or not overwritten:
        assert_same(ours, theirs, lambda m, v, ew: m(v, ei, ew), x, w)
        return
    torch.testing.assert_close(ours(x, ei, w), theirs(x, ei, w), rtol=1e-12, atol=1e-12)
    w_ours, w_pyg = w.clone().requires_grad_(), w.clone().requires_grad_()
    cot = torch.randn(n, 3, dtype=torch.float64, generator=gen)
    (g_ours,) = torch.autograd.grad((ours(x, ei, w_ours) * cot).sum(), [w_ours])
    (g_pyg,) = torch.autograd.grad((theirs(x, ei, w_pyg) * cot).sum(), [w_pyg])
    kept = [e for e in range(ei.size(1)) if e not in overwritten]
    torch.testing.assert_close(g_ours[kept], g_pyg[kept], rtol=1e-10, atol=1e-12)
    for e in overwritten:
        bump = torch.zeros_like(w)
        bump[e] = 1e-3
        with torch.no_grad():
            diff = ((ours(x, ei, w + bump) - ours(x, ei, w - bump)) * cot).sum() / 2e-3
        assert float(g_ours[e]) == 0.0 and abs(float(diff)) < 1e-12
        assert float(g_pyg[e]) != 0.0     # PyG's quirk, so that this test notices a fix


def test_a_tg_graph_gives_what_its_edge_index_gives():
    ei, n = case("duplicates")
    ours, theirs = _layers({})
    x = torch.randn(n, 5, dtype=torch.float64)
    w = torch.rand(ei.size(1), dtype=torch.float64)
    graph = tg.Graph.from_edge_index(ei, num_nodes=n)
    torch.testing.assert_close(ours(x, graph, w), theirs(x, ei, w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_cached_reuses_the_first_normalisation_as_pyg(weighted, monkeypatch):
    """cached=True: PyG's outputs and gradients (x, parameters) on later calls too, with
    the normalisation computed once (counted); the same graph as an equal copy is reused."""
    runs = count_normalisations(monkeypatch)
    theirs = randomized(pyg.GCNConv(5, 3, cached=True))
    ours = loaded(tg.nn.GCNConv(5, 3, cached=True), theirs)
    ei, n = case("self_loops")
    w = torch.rand(ei.size(1), dtype=torch.float64) + 0.5 if weighted else None
    for seed, edges in ((1, ei), (2, ei), (3, ei.clone())):
        x = torch.randn(n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        assert_same(ours, theirs, lambda m, v, e=edges: m(v, e, w), x)
    assert len(runs) == 1


def count_normalisations(monkeypatch) -> list:
    """A list that gets an entry per normalisation GCNConv computes."""
    from tiga.torch_bridge.layers import gcn
    original, runs = gcn._normalized, []

    def counting(*args):
        runs.append(1)
        return original(*args)
    monkeypatch.setattr(gcn, "_normalized", counting)
    return runs


def test_cached_refuses_another_graph():
    """PyG would silently reuse the first graph's normalisation; Tiga names what changed,
    reset_parameters() starts over, and the cached normalisation is a constant (no
    gradient to edge_weight)."""
    ours = tg.nn.GCNConv(5, 3, cached=True).double()
    ei, n = case("self_loops")
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    x = torch.randn(n, 5, dtype=torch.float64)
    ours(x, ei, w).sum().backward()
    assert w.grad is None
    with pytest.raises(tg.TigaError, match="GCNConv: cached=True .* edge_weight differs"):
        ours(x, ei, w.detach() * 2)
    other, _ = case("pyg")
    with pytest.raises(tg.TigaError, match="GCNConv: cached=True .* edge_index differs"):
        ours(x, other, None)
    ours.reset_parameters()
    fresh = tg.nn.GCNConv(5, 3).double()
    fresh.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x, other), fresh(x, other))


def test_argument_errors_name_the_argument():
    with pytest.raises(tg.TigaError, match="does not support adding self-loops"):
        tg.nn.GCNConv(4, 2, add_self_loops=True, normalize=False)
    with pytest.raises(tg.TigaError, match="out_channels is 0"):
        tg.nn.GCNConv(4, 0)
    conv = tg.nn.GCNConv(4, 2)
    ei, _ = case("pyg")
    x = torch.randn(4, 4)
    with pytest.raises(tg.ShapeError, match="x is \\(4,\\), expected a 2-D tensor"):
        conv(torch.randn(4), ei)
    with pytest.raises(tg.ShapeError, match="edge_weight is \\(5,\\), expected .*\\(6,\\)"):
        conv(x, ei, torch.ones(5))
    with pytest.raises(tg.ShapeError, match="relation of 5 sources .* x has 4"):
        conv(x, tg.Graph.from_edge_index(ei, num_nodes=5))
    with pytest.raises(tg.GraphValidationError, match="edge_index"):
        conv(x, torch.tensor([[0, 9], [1, 2]]))


def test_an_edge_index_changed_in_place_is_read_again():
    """The relation built from an edge_index tensor is reused only while the tensor is
    unchanged (its version counter), and dropped with the tensor."""
    from tiga.torch_bridge.layers import common

    ours, theirs = _layers({})
    ei, n = case("pyg")
    ei = ei.clone()
    x = torch.randn(n, 5, dtype=torch.float64)
    first = ours(x, ei)
    assert len([k for k in common._RELATIONS if k[0] == id(ei)]) == 1
    ei[1, 0] = 3             # edge 0 -> 1 becomes 0 -> 3
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(ours(x, ei), first)
    key = id(ei)
    del ei
    assert not [k for k in common._RELATIONS if k[0] == key]
