"""tg.nn.SAGEConv and tg.nn.GINConv against PyG's (state dict loaded, float64): outputs and
gradients on PyG's test graph, isolated nodes, self loops, duplicate edges, no edges, and
bipartite inputs; argument errors."""
from __future__ import annotations

import pytest

import tiga as tg

from ._pyg import CASES, assert_same, case, loaded, pyg, randomized, torch

SAGE = {
    "mean": {},
    "max": {"aggr": "max"},
    "sum": {"aggr": "sum"},
    "min": {"aggr": "min"},
    "normalize": {"normalize": True},
    "no_root": {"root_weight": False},
    "project": {"project": True},
    "no_bias": {"bias": False},
}


def _x(n: int, f: int = 5, seed: int = 1):
    return torch.randn(n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("config", sorted(SAGE))
def test_sage_matches_pyg(name, config):
    ei, n = case(name)
    theirs = randomized(pyg.SAGEConv(5, 3, **SAGE[config]))
    ours = loaded(tg.nn.SAGEConv(5, 3, **SAGE[config]), theirs)
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_sage_bipartite(aggr):
    """(x_src, x_dst) with their own widths, sources 0..5 feeding destinations 0..2."""
    ei = torch.tensor([[0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0]])
    theirs = randomized(pyg.SAGEConv((5, 4), 3, aggr=aggr))
    ours = loaded(tg.nn.SAGEConv((5, 4), 3, aggr=aggr), theirs)
    assert_same(ours, theirs, lambda m, a, b: m((a, b), ei), _x(6), _x(3, 4, seed=2))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("widths", [(5, 3), (3, 5)])
@pytest.mark.parametrize("config", ["mean", "sum", "no_root", "no_bias"])
def test_sage_projects_before_or_after_aggregating(name, widths, config):
    """A narrowing layer (5 -> 3) projects before its sum / mean (lin_l and lin_r as one
    matmul), a widening one (3 -> 5) after: PyG's outputs and gradients either way."""
    ei, n = case(name)
    theirs = randomized(pyg.SAGEConv(*widths, **SAGE[config]))
    ours = loaded(tg.nn.SAGEConv(*widths, **SAGE[config]), theirs)
    assert ours._projects_first() == (widths[1] < widths[0])
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n, widths[0]))


@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_sage_projects_first_on_static_graph_batches(aggr):
    """A 3-D x (B, N, F) sharing one edge_index, through the projecting-first route."""
    ei, n = case("isolated")
    theirs = randomized(pyg.SAGEConv(5, 3, aggr=aggr))
    ours = loaded(tg.nn.SAGEConv(5, 3, aggr=aggr), theirs)
    x = torch.randn(2, n, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert_same(ours, theirs, lambda m, v: m(v, ei), x)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("train_eps", [False, True])
def test_gin_matches_pyg(name, train_eps):
    ei, n = case(name)

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

    theirs = randomized(pyg.GINConv(mlp(), eps=0.3, train_eps=train_eps))
    ours = loaded(tg.nn.GINConv(mlp(), eps=0.3, train_eps=train_eps), theirs)
    assert ("eps" in dict(ours.named_parameters())) == train_eps
    assert_same(ours, theirs, lambda m, v: m(v, ei), _x(n))


def test_gin_bipartite_and_reset():
    ei = torch.tensor([[0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0]])
    theirs = randomized(pyg.GINConv(torch.nn.Linear(5, 3), train_eps=True))
    ours = loaded(tg.nn.GINConv(torch.nn.Linear(5, 3), train_eps=True), theirs)
    assert_same(ours, theirs, lambda m, a, b: m((a, b), ei), _x(6), _x(3, seed=2))
    ours.reset_parameters()
    assert float(ours.eps.detach()) == 0.0


def test_argument_errors_name_the_argument():
    with pytest.raises(tg.TigaError, match="SAGEConv: aggr is 'median', expected one of"):
        tg.nn.SAGEConv(4, 2, aggr="median")
    with pytest.raises(tg.TigaError, match="in_channels is -2, expected a positive int"):
        tg.nn.SAGEConv(-2, 2)
    conv = tg.nn.SAGEConv(4, 2)
    ei, _ = case("pyg")
    with pytest.raises(tg.TigaError, match="x is list, expected a 2-D torch tensor or a pair"):
        conv([torch.randn(4, 4)], ei)
    with pytest.raises(tg.ShapeError, match="x_dst is \\(4, 4, 1, 1\\), expected a 2-D tensor"):
        conv((torch.randn(4, 4), torch.randn(4, 4, 1, 1)), ei)
    with pytest.raises(tg.ShapeError, match="edge_index has shape \\(3, 2\\)"):
        conv((torch.randn(4, 4), torch.randn(3, 4)), torch.zeros(3, 2, dtype=torch.int64))


def test_size_must_agree_with_x_and_inference_needs_no_grad():
    ei = torch.tensor([[0, 5, 2, 2, 4, 1], [0, 0, 1, 1, 2, 0]])
    theirs = randomized(pyg.SAGEConv((5, 4), 3))
    ours = loaded(tg.nn.SAGEConv((5, 4), 3), theirs)
    x_src, x_dst = _x(6), _x(3, 4, seed=2)
    with torch.no_grad():
        got = ours((x_src, x_dst), ei, (6, 3))
    assert got.grad_fn is None
    torch.testing.assert_close(got, theirs((x_src, x_dst), ei, (6, 3)), rtol=1e-12,
                               atol=1e-12)
    with pytest.raises(tg.ShapeError, match="SAGEConv: size is \\(6, 4\\), but x has 6 source "
                                            "and 3 destination rows"):
        ours((x_src, x_dst), ei, (6, 4))
    gin = tg.nn.GINConv(torch.nn.Identity())
    with pytest.raises(tg.ShapeError, match="GINConv: size is \\(2, 2\\)"):
        gin(_x(3), ei[:, :0], size=(2, 2))
