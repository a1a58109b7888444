"""The new tg.nn pieces of issue 40 against PyG (state dict loaded, float64, outputs and
every gradient) over 20 random hostile graphs each: isolated nodes, duplicate edges,
existing and doubled self loops, graphs without edges, int32 and int64 indices, unsorted
edges; GINEConv, SAGEConv's aggregators and the global pools."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from ._pyg import assert_same, loaded, pyg, randomized, torch


def hostile(seed: int) -> tuple:
    """(edge_index, num_nodes) of a random hostile graph (int32 on odd seeds)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    e = 0 if seed % 7 == 3 else int(rng.integers(1, 3 * n + 1))
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if e and seed % 3 == 0:                   # doubled self loops
        loop = int(rng.integers(0, n))
        src, dst = np.concatenate([src, [loop, loop]]), np.concatenate([dst, [loop, loop]])
    if e and seed % 2 == 0:                   # duplicate edges
        src, dst = np.concatenate([src, src[:2]]), np.concatenate([dst, dst[:2]])
    dtype = torch.int32 if seed % 2 else torch.int64
    return torch.tensor(np.stack([src, dst]), dtype=dtype), n + int(seed % 4 == 1)


def _edges(layer, ei):
    """int32 indices go to tg.nn as they are and to PyG as int64: PyG 2.8.1's SAGEConv
    gives wrong input gradients for an int32 edge_index (its outputs agree), so PyG's
    int64 result is the reference for both."""
    return ei if type(layer).__module__.startswith("tiga.") else ei.long()


def _x(*shape, seed: int = 1):
    return torch.randn(*shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(20))
def test_gine_on_hostile_graphs(seed):
    ei, n = hostile(seed)

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(),
                                   torch.nn.Linear(6, 2))

    theirs = randomized(pyg.GINEConv(mlp(), train_eps=True, edge_dim=3), seed)
    ours = loaded(tg.nn.GINEConv(mlp(), train_eps=True, edge_dim=3), theirs)
    assert_same(ours, theirs, lambda m, v, w: m(v, _edges(m, ei), w), _x(n, 4),
                _x(ei.size(1), 3, seed=seed))


SAGE = [dict(aggr=["mean", "max", "min", "sum"]), dict(aggr=["std", "var"]),
        dict(aggr="softmax", aggr_kwargs=dict(learn=True, t=0.7)),
        dict(aggr="powermean", aggr_kwargs=dict(learn=True, p=2.0))]


@pytest.mark.parametrize("seed", range(20))
def test_sage_aggregators_on_hostile_graphs(seed):
    ei, n = hostile(seed)
    kwargs = SAGE[seed % len(SAGE)]
    theirs = randomized(pyg.SAGEConv(4, 2, **kwargs), seed)
    x = _x(n, 4)
    if kwargs["aggr"] == "powermean":    # a power and rows that keep the mean finite
        x = x.abs() + 0.2
        with torch.no_grad():
            theirs.aggr_module.p.fill_(1.5)
    ours = loaded(tg.nn.SAGEConv(4, 2, **kwargs), theirs)
    assert_same(ours, theirs, lambda m, v: m(v, _edges(m, ei)), x)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("pool", ["add", "mean", "max"])
def test_pools_on_random_batches(pool, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 15))
    groups = int(rng.integers(1, 6))
    batch = torch.tensor(rng.integers(0, groups, n), dtype=torch.int64)
    if seed % 2:
        batch = batch.sort().values
    ours, theirs = getattr(tg.nn, f"global_{pool}_pool"), getattr(pyg, f"global_{pool}_pool")
    x = _x(n, 3, seed=seed).requires_grad_()
    got, want = ours(x, batch, groups), theirs(x, batch, groups)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cot = _x(*want.shape, seed=seed + 1)
    torch.testing.assert_close(torch.autograd.grad((got * cot).sum(), x)[0],
                               torch.autograd.grad((want * cot).sum(), x)[0])
