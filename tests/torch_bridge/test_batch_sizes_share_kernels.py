"""Batches of other node and edge counts reuse the compiled kernels (issue 40): a cpu-llvm row
kernel reads the relation's counts at run time, so its cache key prints them as symbols
(render.size_generic) and a shuffled epoch of batches compiles each kernel once.

Oracles: the reference interpreter (`.reference`) for every relation, whichever call compiled
the kernel; PyG's GIN and global_add_pool (float64, outputs and every gradient) for the
tg.nn path; the compile cache's own counters for what was built."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.lower import CPU_LLVM_AVAILABLE
from tiga.xla_free_runtime.caches.executables import CACHE

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")


class Weighted(tg.MessagePassing):
    def __init__(self, reducer):
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.h


class Shifted(tg.MessagePassing):
    """A whole `param` operand: its shape is part of the code, so it is never erased."""
    reducer = tg.sum()

    def edge(self, src, dst, edge, p):
        return (src.x[:, None] * p).sum(dim=-1)     # (p's broadcast reaches the kernel)


def _builds() -> int:
    """Kernels built or read from disk so far (a memory hit is neither)."""
    return CACHE.stats.misses + CACHE.stats.disk_hits


def _relation(rng, num_src: int, num_dst: int, num_edges: int, index, coo: bool):
    s = rng.integers(0, num_src, num_edges).astype(index)
    d = rng.integers(0, num_dst, num_edges).astype(index)
    if coo:     # stored order differs from the user's: the walk has an edge permutation
        return tg.Graph.from_coo(s, d, num_src=num_src, num_dst=num_dst)
    order = np.argsort(d, kind="stable")
    rp = np.searchsorted(d[order], np.arange(num_dst + 1)).astype(index)
    return tg.Graph.from_csr(rp, s[order], num_src=num_src)


@pytest.mark.parametrize("reducer", ["sum", "mean", "max"])
@pytest.mark.parametrize("coo", [False, True])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_other_counts_reuse_the_kernel_and_match_the_reference(monkeypatch, tmp_path,
                                                               reducer, coo, index):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    layer = Weighted(getattr(tg, reducer)())
    # (bipartite, no edges, isolated rows, a high-degree row: each its own counts)
    sizes = [(9, 7, 30), (40, 40, 200), (3, 11, 0), (120, 5, 600), (1, 1, 1), (64, 64, 130)]
    for i, (n_src, n_dst, n_edges) in enumerate(sizes):
        g = _relation(rng, n_src, n_dst, n_edges, index, coo)
        call = dict(graph=g, src={"x": rng.normal(size=(n_src, 3))},
                    dst={"h": rng.normal(size=(n_dst, 3))},
                    edge={"w": rng.normal(size=(n_edges, 1))})
        before = _builds()
        got = np.asarray(layer(**call))
        if i:
            assert _builds() == before, f"counts {n_src, n_dst, n_edges} built a kernel"
        np.testing.assert_allclose(got, np.asarray(layer.reference(**call)), rtol=1e-12,
                                   atol=1e-12)


def test_a_param_shape_is_still_part_of_the_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(4)
    g = _relation(rng, 12, 12, 40, np.int64, False)
    x = rng.normal(size=(12, 2))
    for k in (3, 5):
        before = _builds()
        call = dict(graph=g, src={"x": x}, p=rng.normal(size=(k,)))
        got = np.asarray(Shifted()(**call))
        assert _builds() > before, f"a param of {k} entries reused another's kernel"
        np.testing.assert_allclose(got, np.asarray(Shifted().reference(**call)), rtol=1e-12)


torch = pytest.importorskip("torch")


def _molecule(rng, n: int):
    a = np.arange(n - 1)
    ring = rng.integers(0, n - 4)
    b = np.concatenate([np.stack([a, a + 1]), [[ring], [ring + 3]]], axis=1)
    return torch.from_numpy(np.concatenate([b, b[::-1]], axis=1).astype(np.int64))


def test_shuffled_gin_batches_compile_once_and_match_pyg(monkeypatch, tmp_path):
    pyg = pytest.importorskip("torch_geometric.nn")
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)
    sizes = rng.integers(5, 12, 24)
    edges = [_molecule(rng, int(n)) for n in sizes]
    graphs = [tg.Graph.from_edge_index(e, num_nodes=int(n)) for e, n in zip(edges, sizes)]
    xs = [torch.from_numpy(rng.normal(size=(int(n), 4))) for n in sizes]

    def model(lib):
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))
        return lib.GINConv(mlp, train_eps=True).double()

    theirs = model(pyg)
    ours = model(tg.nn)
    ours.load_state_dict(theirs.state_dict())
    counts = []
    for pick in [rng.permutation(24)[:k] for k in (6, 5, 7, 8, 4)]:
        batch = tg.Graph.batch([graphs[i] for i in pick])
        offsets = np.cumsum([0] + [int(sizes[i]) for i in pick])
        edge_index = torch.cat([edges[i] + int(o) for i, o in zip(pick, offsets)], dim=1)
        x = torch.cat([xs[i] for i in pick])
        ids = torch.as_tensor(np.repeat(np.arange(len(pick)), sizes[pick]))
        grads = []
        for lib, layer, rel in ((tg.nn, ours, batch), (pyg, theirs, edge_index)):
            leaf = x.clone().requires_grad_()
            out = lib.global_add_pool(layer(leaf, rel).relu(), ids)
            layer.zero_grad()
            (out * torch.arange(out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
            grads.append([out, leaf.grad] + [p.grad for p in layer.parameters()])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
        counts.append((int(batch.num_dst), int(batch.num_edges), _builds()))
    assert len({c[:2] for c in counts}) >= 4, "the batches should differ in their counts"
    assert all(c[2] == counts[0][2] for c in counts), f"later batches built kernels: {counts}"


@pytest.mark.parametrize("coo", [False, True])
def test_bucketed_batches_give_the_unpadded_results_bit_for_bit(coo):
    """tg.Graph.batch relations run padded to bucketed sizes (layers/buckets.py); the same
    relation as a plain tg.Graph runs unpadded: outputs and gradients are equal exactly."""
    from tiga.torch_bridge.layers.buckets import bucketed

    rng = np.random.default_rng(6)
    sizes = rng.integers(5, 12, 9)
    edges = [_molecule(rng, int(n)) for n in sizes]
    if coo:     # graphs with an edge permutation (user order is not destination order)
        edges = [e[:, torch.from_numpy(rng.permutation(e.size(1)))] for e in edges]
    batch = tg.Graph.batch([tg.Graph.from_edge_index(e, num_nodes=int(n))
                            for e, n in zip(edges, sizes)])
    plain = tg.Graph.from_edge_index(torch.as_tensor(batch.to_edge_index()),
                                     num_nodes=int(batch.num_dst))
    assert bucketed(batch) and not bucketed(plain)
    ids = torch.as_tensor(np.asarray(batch.batch))
    torch.manual_seed(1)
    layer = tg.nn.GINConv(torch.nn.Linear(5, 5), train_eps=True)
    x = torch.randn(int(batch.num_dst), 5)
    results = []
    for rel, pool_by in ((batch, batch), (plain, ids)):
        leaf = x.clone().requires_grad_()
        h = layer(leaf, rel).relu()
        out = torch.cat([tg.nn.global_add_pool(h, pool_by), tg.nn.global_max_pool(h, pool_by),
                         tg.nn.global_mean_pool(h, pool_by)], dim=1)
        layer.zero_grad()
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append([h, out, leaf.grad] + [p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*results):
        assert a.shape == b.shape and torch.equal(a, b)
