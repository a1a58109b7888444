"""GIN's aggregation and global_add_pool as one autograd node (torch_bridge/layers/summed.py):
the padding, the sum, the slice and the root term in one node give the general path's
outputs and gradients bit for bit, on hostile batches (isolated nodes, duplicate edges, self
loops, graphs without edges or nodes), bucketed or not, float32 and float64, eps 0 or not;
what the node does not take (a trainable eps, torch.func) runs the general path.

Oracle: the general path (the layer with summed() declined), compared with torch.equal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tiga as tg
import tiga.torch_bridge.layers.pool as pool_mod
import tiga.torch_bridge.layers.sage_gin as gin_mod
from tiga.lower import CPU_LLVM_AVAILABLE
from tiga.torch_bridge.layers import summed as summed_mod

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")


def _graphs(seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for n in (5, 1, 9, 0, 7, 12, 3):
        e = int(rng.integers(0, 3 * n + 1)) if n else 0
        s, d = rng.integers(0, max(n, 1), e), rng.integers(0, max(n, 1), e)
        if n > 2:       # a duplicate edge and a self loop
            s, d = np.append(s, [s[0] if e else 0, 1]), np.append(d, [d[0] if e else 1, 1])
        out.append(tg.Graph.from_coo(s, d, num_src=n, num_dst=n))
    return out


def _step(monkeypatch, fused: bool, relation, batch, eps, dtype, train_eps=False):
    if not fused:
        monkeypatch.setattr(gin_mod, "summed", lambda *a, **k: None)
        monkeypatch.setattr(pool_mod, "summed", lambda *a, **k: None)
    torch.manual_seed(0)
    n = batch.ptr[-1]
    x = torch.randn(int(n), 6, dtype=dtype, requires_grad=True)
    conv = tg.nn.GINConv(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()),
                         eps=eps, train_eps=train_eps).to(dtype)
    h = conv(conv(x * 1.5, relation).relu(), relation)
    y = tg.nn.global_add_pool(h, batch)
    (y * torch.linspace(-1, 2, y.numel(), dtype=dtype).reshape(y.shape)).sum().backward()
    with torch.no_grad():
        plain = tg.nn.global_add_pool(conv(x, relation), batch)
    monkeypatch.undo()
    return [y, plain, x.grad] + [p.grad for p in conv.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [0.0, 0.37])
@pytest.mark.parametrize("given", ["batch", "edge_index32", "edge_index64"])
def test_one_node_matches_the_general_path_bit_for_bit(monkeypatch, dtype, eps, given):
    batch = tg.Graph.batch(_graphs(1))
    src, dst = np.asarray(batch.to_edge_index())
    relation = batch if given == "batch" else torch.from_numpy(
        np.stack([src, dst]).astype(np.int32 if given == "edge_index32" else np.int64))
    before = dict(summed_mod.STATS)
    fused = _step(monkeypatch, True, relation, batch, eps, dtype)
    # two convs and the pool forward, one conv and the pool without grad; three backwards
    assert summed_mod.STATS["forward"] - before["forward"] == 5
    assert summed_mod.STATS["backward"] - before["backward"] == 3
    general = _step(monkeypatch, False, relation, batch, eps, dtype)
    for a, b in zip(fused, general):
        assert a.shape == b.shape and torch.equal(a, b)


def test_trainable_eps_and_torch_func_take_the_general_path(monkeypatch):
    batch = tg.Graph.batch(_graphs(2))
    before = dict(summed_mod.STATS)
    trained = _step(monkeypatch, True, batch, batch, 0.2, torch.float64, train_eps=True)
    assert summed_mod.STATS["backward"] == before["backward"] + 1     # the pool's only
    general = _step(monkeypatch, False, batch, batch, 0.2, torch.float64, train_eps=True)
    for a, b in zip(trained, general):
        assert torch.equal(a, b)
    conv = tg.nn.GINConv(torch.nn.Identity()).double()
    x = torch.randn(int(batch.ptr[-1]), 3, dtype=torch.float64)
    count = summed_mod.STATS["forward"]
    g = torch.func.grad(lambda v: conv(v, batch).square().sum())(x)
    assert summed_mod.STATS["forward"] == count
    with torch.no_grad():
        want = torch.autograd.functional.vjp(lambda v: conv(v, batch).square().sum(), x)[1]
    assert torch.allclose(g, want, rtol=1e-12, atol=1e-12)


def test_an_output_changed_in_place_before_backward(monkeypatch):
    """The sum's VJP reads neither its output nor x: y.relu_() and x.add_() before backward
    are allowed, as on the general path."""
    batch = tg.Graph.batch(_graphs(3))
    grads = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(gin_mod, "summed", lambda *a, **k: None)
        conv = tg.nn.GINConv(torch.nn.Identity())
        x = torch.ones(int(batch.ptr[-1]), 4, requires_grad=True)
        h = x * 2
        y = conv(h, batch)
        y.relu_()
        with torch.no_grad():
            h.add_(1.0)
        y.sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


def test_the_kept_program_outlives_other_stores_and_not_a_clear():
    """A plan is kept across the call cache's other stores and restaged after clear()."""
    from tiga.torch_bridge.autograd import STATS as BRIDGE
    from tiga.trace import call_cache

    batch = tg.Graph.batch(_graphs(5))
    conv = tg.nn.GINConv(torch.nn.Identity())
    x = torch.randn(int(batch.ptr[-1]), 7)
    conv(x, batch)
    staged = BRIDGE["stagings"]
    tg.nn.GINConv(torch.nn.Identity())(torch.randn(int(batch.ptr[-1]), 9), batch)  # a store
    assert BRIDGE["stagings"] == staged + 1
    conv(x, batch)
    assert BRIDGE["stagings"] == staged + 1
    call_cache.clear()
    again = conv(x, batch)
    assert BRIDGE["stagings"] == staged + 2
    assert torch.equal(again, conv(x, batch))
