"""tg.nn.GATConv and tg.nn.GATv2Conv against PyG's (state dict loaded, float64): outputs,
attention weights and gradients, on PyG's test graph, isolated nodes, existing self loops,
duplicate edges and no edges; heads, concat, edge features and their loop fill values,
residual, bipartite inputs, dropout in training; the multi-head shapes."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import CASES, assert_same, case, loaded, pyg, randomized, torch

CONFIGS = {
    "one_head": {},
    "two_heads": {"heads": 2},
    "mean_of_heads": {"heads": 2, "concat": False},
    "no_loops": {"heads": 2, "add_self_loops": False},
    "slope_residual": {"heads": 2, "negative_slope": 0.1, "residual": True, "bias": False},
}
LAYERS = {"GATConv": (tg.nn.GATConv, pyg.GATConv), "GATv2Conv": (tg.nn.GATv2Conv,
                                                                 pyg.GATv2Conv)}


def _x(n: int, f: int = 5, seed: int = 1):
    return torch.randn(n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _pair(layer: str, *args, **kwargs):
    ours_cls, pyg_cls = LAYERS[layer]
    theirs = randomized(pyg_cls(*args, **kwargs))
    return loaded(ours_cls(*args, **kwargs), theirs), theirs


# every graph case with two heads; the other configurations on the cases that test them
# (each distinct head count and route compiles its own programs: this keeps the file fast)
RUNS = [("two_heads", name) for name in sorted(CASES)] + \
    [(config, name) for config in sorted(CONFIGS) if config != "two_heads"
     for name in ("self_loops", "isolated")] + [("no_loops", "no_edges")]


@pytest.mark.parametrize("layer,config,name",
                         [("GATConv", c, n) for c, n in RUNS] +
                         [("GATv2Conv", c, n) for c, n in RUNS if n != "isolated"])
def test_matches_pyg(layer, config, name):
    ei, n = case(name)
    ours, theirs = _pair(layer, 5, 4, **CONFIGS[config])
    out = assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))[0]
    heads = CONFIGS[config].get("heads", 1)
    assert out.shape == (n, 4 * heads if CONFIGS[config].get("concat", True) else 4)


@pytest.mark.parametrize("name", ["pyg", "self_loops", "duplicates", "no_edges"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_attention_weights_and_their_gradients(layer, name):
    """return_attention_weights=True: the looped edge_index in PyG's order and alpha (E, H),
    each incoming softmax summing to 1; gradients through out and alpha together."""
    ei, n = case(name)
    ours, theirs = _pair(layer, 5, 4, heads=2)

    def call(m, v):
        out, (_, alpha) = m(v, ei, return_attention_weights=True)
        return out, alpha

    out, alpha = assert_same(ours, theirs, call, _x(n))
    got_ei = ours(_x(n), ei, return_attention_weights=True)[1][0]
    want_ei = theirs(_x(n), ei, return_attention_weights=True)[1][0]
    assert torch.equal(got_ei, want_ei) and alpha.shape == (want_ei.size(1), 2)
    sums = torch.zeros(n, 2, dtype=alpha.dtype).index_add_(0, got_ei[1], alpha)
    torch.testing.assert_close(sums, torch.ones_like(sums))   # every node has its loop
    graph = tg.Graph.from_edge_index(ei, num_nodes=n)
    g_out, (g_graph, g_alpha) = ours(_x(n), graph, return_attention_weights=True)
    assert isinstance(g_graph, tg.Graph) and (g_graph.to_edge_index() == want_ei.numpy()).all()
    torch.testing.assert_close(g_alpha, alpha, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fill_value", ["mean", "max", 0.5])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_edge_features_and_loop_fill(layer, fill_value):
    ei, n = case("self_loops")
    ours, theirs = _pair(layer, 5, 4, heads=2, edge_dim=3, fill_value=fill_value)
    attr = torch.randn(ei.size(1), 3, dtype=torch.float64)
    assert_same(ours, theirs, lambda m, v, a: m(v, ei, a), _x(n), attr)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_one_dimensional_edge_features(layer):
    ei, n = case("duplicates")
    ours, theirs = _pair(layer, 5, 4, edge_dim=1)
    attr = torch.rand(ei.size(1), dtype=torch.float64)
    assert_same(ours, theirs, lambda m, v, a: m(v, ei, a), _x(n), attr)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_bipartite(layer):
    """(x_src (6, 5), x_dst (3, 4)): loops for the first min(6, 3) nodes, as PyG."""
    ei = torch.tensor([[0, 5, 2, 2, 4, 1, 1], [0, 0, 1, 1, 2, 0, 1]])
    ours, theirs = _pair(layer, (5, 4), 2, heads=2)
    assert_same(ours, theirs, lambda m, a, b: m((a, b), ei), _x(6), _x(3, 4, seed=2))


def test_gatv2_shared_weights():
    ei, n = case("isolated")
    ours, theirs = _pair("GATv2Conv", 5, 4, heads=2, share_weights=True)
    assert ours.lin_r is ours.lin_l
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_dropout_in_training_draws_pyg_masks(layer):
    """Attention dropout acts on alpha (E, H) in PyG's edge order, so the same seed drops
    the same weights: outputs and gradients agree in training mode too."""
    ei, n = case("duplicates")
    ours, theirs = _pair(layer, 5, 4, heads=2, dropout=0.5)
    ours.train(), theirs.train()

    def call(m, v):
        torch.manual_seed(123)
        out, (_, alpha) = m(v, ei, return_attention_weights=True)
        return out, alpha

    out, alpha = assert_same(ours, theirs, call, _x(n))
    assert (alpha == 0).any()
    torch.manual_seed(5)   # the fused route is not taken in training: same as weights on
    want = theirs(_x(n), ei)
    torch.manual_seed(5)
    torch.testing.assert_close(ours(_x(n), ei), want, rtol=1e-12, atol=1e-12)


def test_argument_errors_name_the_argument():
    with pytest.raises(tg.TigaError, match="GATConv: heads is 0, expected a positive int"):
        tg.nn.GATConv(4, 2, heads=0)
    with pytest.raises(tg.TigaError, match="dropout is 1.5, expected 0 <= p < 1"):
        tg.nn.GATv2Conv(4, 2, dropout=1.5)
    ei, n = case("pyg")
    conv = tg.nn.GATConv(5, 2, edge_dim=2, fill_value="median")
    with pytest.raises(tg.TigaError, match="fill_value is 'median', expected a number"):
        conv(_x(n).float(), ei, torch.randn(ei.size(1), 2))
    with pytest.raises(tg.ShapeError, match="edge_attr is \\(2, 2\\), expected a tensor "
                                            "with 6 rows"):
        conv(_x(n).float(), ei, torch.randn(2, 2))
    with pytest.raises(tg.ShapeError, match="size is \\(4, 5\\), but x has 4 source and 4"):
        tg.nn.GATConv(5, 2)(_x(n).float(), ei, size=(4, 5))
