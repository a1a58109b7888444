"""Graph.remove_self_loops / add_remaining_self_loops against PyG's utils of the same names:
edge order, and edge fields carried by the returned edge_ids (random relations with loops,
repeated loops, duplicates, isolated nodes, no edges; CSR-built relations whose storage
order differs from edge order; rectangular relations)."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

torch = pytest.importorskip("torch")
utils = pytest.importorskip("torch_geometric.utils")


def _random_edges(seed: int, n: int, e: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, e))
    loops = rng.integers(0, n, size=e // 3)
    ei = np.concatenate([ei, np.stack([loops, loops])], axis=1)   # repeated loops too
    return ei[:, rng.permutation(ei.shape[1])]


EDGES = [(_random_edges(s, n, e), n) for s, n, e in
         [(0, 6, 12), (1, 10, 30), (2, 3, 9), (3, 8, 0), (4, 12, 5)]]


@pytest.mark.parametrize("edges,n", EDGES)
def test_remove_self_loops_matches_pyg(edges, n):
    graph = tg.Graph.from_edge_index(edges, num_nodes=n)
    attr = torch.randn(edges.shape[1], 2, dtype=torch.float64)
    want_ei, want_attr = utils.remove_self_loops(torch.from_numpy(edges), attr)
    bare, ids = graph.remove_self_loops()
    np.testing.assert_array_equal(bare.to_edge_index(), want_ei.numpy())
    assert ids.dtype == np.int64
    torch.testing.assert_close(attr[torch.from_numpy(ids.copy())], want_attr, rtol=0, atol=0)
    assert (bare.num_src, bare.num_dst, bare.kind) == (n, n, "csr")


@pytest.mark.parametrize("edges,n", EDGES)
def test_add_remaining_self_loops_matches_pyg(edges, n):
    graph = tg.Graph.from_edge_index(edges, num_nodes=n)
    attr = torch.randn(edges.shape[1], dtype=torch.float64)
    want_ei, want_attr = utils.add_remaining_self_loops(torch.from_numpy(edges), attr, 7.5, n)
    looped, ids = graph.add_remaining_self_loops()
    np.testing.assert_array_equal(looped.to_edge_index(), want_ei.numpy())
    filled = np.append(attr.numpy(), 7.5)          # index len(attr): the fill value
    got = filled[np.where(ids >= 0, ids, len(attr))]
    np.testing.assert_array_equal(got, want_attr.numpy())
    assert looped.num_edges == int((edges[0] != edges[1]).sum()) + n
    again, _ = looped.add_remaining_self_loops()     # idempotent: no second loop
    np.testing.assert_array_equal(again.to_edge_index(), looped.to_edge_index())


def test_edge_order_is_the_users_not_the_storage_order():
    """from_coo stores by destination; the edits follow edge (user) order all the same."""
    graph = tg.Graph.from_coo([2, 0, 1, 0, 1], [2, 1, 1, 0, 0], num_src=3, num_dst=3)
    assert graph.edge_perm is not None      # storage order differs from edge order
    edges = graph.to_edge_index()
    looped, ids = graph.add_remaining_self_loops()
    want_ei, _ = utils.add_remaining_self_loops(torch.from_numpy(edges), num_nodes=3)
    np.testing.assert_array_equal(looped.to_edge_index(), want_ei.numpy())
    np.testing.assert_array_equal(ids, [1, 4, 3, 2, 0])
    bare, ids = graph.remove_self_loops()
    np.testing.assert_array_equal(bare.to_edge_index(), [[0, 1], [1, 0]])
    np.testing.assert_array_equal(ids, [1, 4])


def test_rectangular_relation_gets_loops_for_the_shared_ids():
    graph = tg.Graph.from_coo([0, 4, 2], [1, 0, 2], num_src=5, num_dst=3)
    looped, ids = graph.add_remaining_self_loops()
    np.testing.assert_array_equal(looped.to_edge_index(), [[0, 4, 0, 1, 2], [1, 0, 0, 1, 2]])
    np.testing.assert_array_equal(ids, [0, 1, -1, -1, 2])
    assert (looped.num_src, looped.num_dst) == (5, 3)
    bare, ids = graph.remove_self_loops()
    np.testing.assert_array_equal(ids, [0, 1])


def test_loops_of_an_implicit_relation():
    """A dense relation resolves its CSR first (every i reads every j, loops included)."""
    looped, ids = tg.Graph.dense(3).add_remaining_self_loops()
    dense = tg.Graph.dense(3).to_edge_index()
    want_ei, _ = utils.add_remaining_self_loops(torch.from_numpy(dense), num_nodes=3)
    np.testing.assert_array_equal(looped.to_edge_index(), want_ei.numpy())
    assert sorted(ids[-3:]) == [0, 4, 8]
