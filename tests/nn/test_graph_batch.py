"""Batches of small graphs (issue 40 item 4): tg.Graph.batch (disjoint union, batch, ptr,
unbatch; tg.Graphs, PyG Data lists, a PyG Batch as it is) and tg.nn's global pooling
against PyG's (float64, outputs and gradients), and a graph-classification step that
matches PyG's with its state dict loaded."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from ._pyg import loaded, pyg, randomized, torch

data = pytest.importorskip("torch_geometric.data")


def _graphs():
    """Three graphs: a path, one edge, four isolated nodes."""
    return [tg.Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3),
            tg.Graph.from_edge_index(torch.tensor([[1], [0]]), num_nodes=2),
            tg.Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.int64), num_nodes=4)]


def _x(*shape, seed: int = 1):
    return torch.randn(*shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed))


def test_batch_is_the_disjoint_union_with_pyg_vectors():
    graphs = _graphs()
    b = tg.Graph.batch(graphs)
    assert isinstance(b, tg.Graph) and b.num_graphs == 3
    assert b.batch.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert b.ptr.tolist() == [0, 3, 5, 9]
    assert b.to_edge_index().tolist() == [[0, 1, 2, 4], [1, 2, 0, 3]]
    assert all(g is h for g, h in zip(b.unbatch(), graphs))
    pyg_batch = data.Batch.from_data_list(
        [data.Data(edge_index=torch.as_tensor(g.to_edge_index()), num_nodes=g.num_dst)
         for g in graphs])
    assert b.to_edge_index().tolist() == pyg_batch.edge_index.tolist()
    assert b.batch.tolist() == pyg_batch.batch.tolist()
    assert b.ptr.tolist() == pyg_batch.ptr.tolist()


def test_pyg_batches_and_data_lists_are_taken_as_they_are():
    graphs = _graphs()
    items = [data.Data(edge_index=torch.as_tensor(g.to_edge_index()), num_nodes=g.num_dst)
             for g in graphs]
    pyg_batch = data.Batch.from_data_list(items)
    for b in (tg.Graph.batch(pyg_batch), tg.Graph.batch(items)):
        assert b.batch.tolist() == pyg_batch.batch.tolist()
        assert b.to_edge_index().tolist() == pyg_batch.edge_index.tolist()
        back = b.unbatch()
        assert [g.to_edge_index().tolist() for g in back] == \
            [g.to_edge_index().tolist() for g in graphs]
        assert [g.num_dst for g in back] == [3, 2, 4]


def test_bipartite_batches_keep_source_offsets():
    g0 = tg.Graph.from_coo(np.array([0, 3]), np.array([1, 0]), num_src=4, num_dst=2)
    g1 = tg.Graph.from_coo(np.array([1]), np.array([2]), num_src=2, num_dst=3)
    b = tg.Graph.batch([g0, g1])
    assert b.src_ptr.tolist() == [0, 4, 6] and b.ptr.tolist() == [0, 2, 5]
    assert b.src_batch.tolist() == [0, 0, 0, 0, 1, 1]
    assert b.to_edge_index().tolist() == [[0, 3, 5], [1, 0, 4]]


def test_batch_rejects_what_it_cannot_read():
    with pytest.raises(tg.GraphValidationError, match="expected a list of graphs"):
        tg.Graph.batch(_graphs()[0])
    with pytest.raises(tg.GraphValidationError, match="item 1 is a int"):
        tg.Graph.batch([_graphs()[0], 3])


POOLS = ["add", "mean", "max"]


@pytest.mark.parametrize("form", ["tensor", "graph_batch", "pyg_batch", "numpy"])
@pytest.mark.parametrize("pool", POOLS)
def test_pools_match_pyg(pool, form):
    graphs = _graphs()
    b = tg.Graph.batch(graphs)
    vector = torch.from_numpy(b.batch)
    given = {"tensor": vector, "graph_batch": b, "numpy": b.batch,
             "pyg_batch": data.Batch.from_data_list(
                 [data.Data(edge_index=torch.as_tensor(g.to_edge_index()),
                            num_nodes=g.num_dst) for g in graphs])}[form]
    ours, theirs = getattr(tg.nn, f"global_{pool}_pool"), getattr(pyg, f"global_{pool}_pool")
    x = _x(9, 4).requires_grad_()
    got, want = ours(x, given), theirs(x, vector)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cot = _x(*want.shape, seed=5)
    g_got = torch.autograd.grad((got * cot).sum(), x)[0]
    g_want = torch.autograd.grad((want * cot).sum(), x)[0]
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pool", POOLS)
def test_pools_take_pyg_options(pool):
    ours, theirs = getattr(tg.nn, f"global_{pool}_pool"), getattr(pyg, f"global_{pool}_pool")
    x = _x(6, 3)
    unsorted = torch.tensor([2, 0, 2, 1, 0, 2])
    for args in ((unsorted,), (unsorted, 5), (None,)):
        torch.testing.assert_close(ours(x, *args), theirs(x, *args))
    torch.testing.assert_close(ours(x[:, 0], unsorted), theirs(x[:, 0], unsorted))
    static = _x(2, 6, 3)
    torch.testing.assert_close(ours(static, unsorted), theirs(static, unsorted))


def test_softmax_pool_is_the_softmax_aggregation():
    x, index = _x(9, 4), torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    want = pyg.aggr.SoftmaxAggregation(t=0.5)(x, index)
    torch.testing.assert_close(tg.nn.global_softmax_pool(x, index, t=0.5), want)
    torch.testing.assert_close(tg.nn.global_softmax_pool(x, t=0.5),
                               pyg.aggr.SoftmaxAggregation(t=0.5)(x, dim=-2))


class _Classifier(torch.nn.Module):
    def __init__(self, layers, pool):
        super().__init__()
        self.conv1, self.conv2 = layers.GCNConv(5, 8), layers.GCNConv(8, 8)
        self.lin = torch.nn.Linear(16, 2)
        self.pool = pool

    def forward(self, x, edge_index, batch):
        h = self.conv1(x, edge_index).relu()
        h = self.conv2(h, edge_index).relu()
        return self.lin(torch.cat([self.pool[0](h, batch), self.pool[1](h, batch)], dim=-1))


def test_graph_classification_step_matches_pyg():
    rng = np.random.default_rng(0)
    graphs = []
    for _ in range(12):
        n = int(rng.integers(1, 9))
        e = int(rng.integers(0, 2 * n))
        graphs.append(tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e),
                                        num_src=n, num_dst=n))
    b = tg.Graph.batch(graphs)
    edge_index, vector = torch.as_tensor(b.to_edge_index()), torch.from_numpy(b.batch)
    theirs = randomized(_Classifier(pyg, (pyg.global_mean_pool, pyg.global_max_pool)))
    ours = loaded(_Classifier(tg.nn, (tg.nn.global_mean_pool, tg.nn.global_max_pool)),
                  theirs)
    x = _x(b.num_dst, 5)
    want = theirs(x, edge_index, vector)
    for rel in (edge_index, b):
        got = ours(x, rel, b)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        g_got = torch.autograd.grad(got.square().sum(), list(ours.parameters()))
        g_want = torch.autograd.grad(want.square().sum(), list(theirs.parameters()),
                                     retain_graph=True)
        for a, w in zip(g_got, g_want):
            torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)
