"""tg.nn.GATConv / GATv2Conv inside torch.compile with return_attention_weights=True and
attention dropout in training (fullgraph, no graph break: the per-edge outputs leave the
opaque tiga::layer op with a data-dependent edge count). In eval mode the compiled layer is
PyG's: outputs, alpha and gradients through both, the looped edge_index in PyG's order (a
tg.Graph back for a tg.Graph given). In training mode the mask is drawn inside the op from a
seed the compiled graph takes from torch's generator: checked against PyG's layer in training
whose F.dropout applies that same mask (outputs, alpha, gradients: the backward reuses the
forward's mask), and statistically (the dropped fraction, the kept weights scaled 1/(1-p),
a new mask per call). aot_eager, and inductor for the training route (its RNG lowering)."""
from __future__ import annotations

from unittest import mock

import pytest

import tiga as tg

from ._pyg import assert_same, loaded, pyg, randomized, torch

counters = pytest.importorskip("torch._dynamo.utils").counters
N, F = 7, 5
# a self loop (node 3), a duplicate edge (1 -> 2) and an isolated node (6)
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 3], [1, 2, 2, 0, 3, 1, 4, 5, 0]])
LAYERS = {"GATConv": (tg.nn.GATConv, pyg.GATConv),
          "GATv2Conv": (tg.nn.GATv2Conv, pyg.GATv2Conv)}


def _pair(layer: str, p: float, **kwargs):
    ours_cls, pyg_cls = LAYERS[layer]
    theirs = randomized(pyg_cls(F, 4, heads=2, dropout=p, **kwargs))
    return loaded(ours_cls(F, 4, heads=2, dropout=p, **kwargs), theirs), theirs


def _x(seed: int, n: int = N):
    return torch.randn(n, F, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _compiled(model, backend="aot_eager"):
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(model, backend=backend, fullgraph=True)


def _no_break():
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("relation", ["edge_index", "graph"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_eval_attention_weights_are_pygs(layer, relation):
    ours, theirs = _pair(layer, 0.5, edge_dim=2)    # eval: no dropout, as PyG
    ours.eval(), theirs.eval()
    attr = torch.randn(EDGE_INDEX.size(1), 2, dtype=torch.float64)
    rel = EDGE_INDEX if relation == "edge_index" else \
        tg.Graph.from_edge_index(EDGE_INDEX, num_nodes=N)
    compiled = _compiled(ours)

    def call(m, v, a):
        out, (_, alpha) = (compiled(v, rel, a, return_attention_weights=True) if m is ours
                           else m(v, EDGE_INDEX, a, return_attention_weights=True))
        return out, alpha
    for seed in (1, 2):
        assert_same(ours, theirs, call, _x(seed), attr)
    _no_break()
    want = theirs(_x(1), EDGE_INDEX, attr, return_attention_weights=True)[1][0]
    got = compiled(_x(1), rel, attr, return_attention_weights=True)[1][0]
    if relation == "graph":
        assert isinstance(got, tg.Graph)
        got = torch.from_numpy(got.to_edge_index())
    assert torch.equal(got, want)


@pytest.mark.parametrize("layer,backend", [("GATConv", "aot_eager"),
                                           ("GATv2Conv", "aot_eager"), ("GATConv", "inductor")])
def test_training_dropout_is_pygs_with_the_same_mask(layer, backend):
    """PyG's layer in training, its F.dropout replaced by the compiled call's mask (read
    off the alpha it returned; the same generator state gives the same seed)."""
    ours, theirs = _pair(layer, 0.4)
    ours.train(), theirs.train()
    compiled = _compiled(ours, backend)

    def run(v):
        torch.manual_seed(123)
        return compiled(v, EDGE_INDEX, return_attention_weights=True)
    mask = run(_x(1).requires_grad_())[1][1].detach() != 0   # (as assert_same calls it)
    assert not mask.all() and mask.any()

    def masked(alpha, p, training):
        return alpha * mask / (1 - p)

    def call(m, v):
        if m is ours:
            out, (_, alpha) = run(v)
        else:
            with mock.patch.object(torch.nn.functional, "dropout", masked):
                out, (_, alpha) = m(v, EDGE_INDEX, return_attention_weights=True)
        return out, alpha
    assert_same(ours, theirs, call, _x(1))
    _no_break()


def test_dropout_statistics():
    """Over 3000 edges x 2 heads: the dropped fraction is p (5 sigma), the kept weights
    are eval's scaled by 1/(1-p), and each call draws a new mask; out only (no weights
    asked) compiles too."""
    n, p = 300, 0.3
    gen = torch.Generator().manual_seed(8)
    ei = torch.stack([torch.randint(0, n, (3000,), generator=gen),
                      torch.randint(0, n, (3000,), generator=gen)])
    conv = tg.nn.GATConv(F, 4, heads=2, dropout=p).double()
    x = _x(3, n)
    compiled = _compiled(conv)
    conv.eval()
    _, (_, plain) = compiled(x, ei, return_attention_weights=True)
    conv.train()
    _, (_, first) = compiled(x, ei, return_attention_weights=True)
    _, (_, second) = compiled(x, ei, return_attention_weights=True)
    dropped = (first == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / first.numel()) ** 0.5
    kept = first != 0
    torch.testing.assert_close(first[kept], plain[kept] / (1 - p), rtol=1e-12, atol=0)
    assert not torch.equal(first == 0, second == 0)
    assert compiled(x, ei).shape == (n, 8)
    assert sum(counters["graph_break"].values()) == 0


@pytest.mark.parametrize("relation,loops", [("graph", True), ("edge_index", False)])
def test_known_edge_counts_need_no_fullgraph(relation, loops):
    """Without fullgraph (torch's default, which breaks at data-dependent sizes) the
    weights route is still one graph where the edge count is known: a constant tg.Graph's
    looped edges, or an edge_index without loops added (its own E)."""
    ours, theirs = _pair("GATConv", 0.0, add_self_loops=loops)
    rel = EDGE_INDEX if relation == "edge_index" else \
        tg.Graph.from_edge_index(EDGE_INDEX, num_nodes=N)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(ours, backend="aot_eager")

    def call(m, v):
        out, (_, alpha) = (compiled(v, rel, return_attention_weights=True) if m is ours
                           else m(v, EDGE_INDEX, return_attention_weights=True))
        return out, alpha
    assert_same(ours, theirs, call, _x(1))
    _no_break()
