"""Relation utilities: to_edge_index (round trip with from_edge_index / from_coo),
with_self_loops (A + I; edge order; loops last in each stored row) and gcn_norm (against a
dense numpy oracle, and against PyG's gcn_norm when torch_geometric is installed)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def edge_lists(draw, square=True):
    """Random relations with empty rows, duplicates, self edges and zero edges."""
    num_src = draw(st.integers(1, 7))
    num_dst = num_src if square else draw(st.integers(1, 7))
    e = draw(st.integers(0, 20))
    src = np.array(draw(st.lists(st.integers(0, num_src - 1), min_size=e, max_size=e)),
                   dtype=np.int64)
    dst = np.array(draw(st.lists(st.integers(0, num_dst - 1), min_size=e, max_size=e)),
                   dtype=np.int64)
    return src, dst, num_src, num_dst


def _graphs(src, dst, num_src, num_dst):
    """The same relation built three ways: user order from COO, and CSR order."""
    coo = tg.Graph.from_coo(src, dst, num_src=num_src, num_dst=num_dst)
    order = np.argsort(dst, kind="stable")
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_dst))])
    csr = tg.Graph.from_csr(row_ptr, src[order], num_src=num_src)
    return [(coo, src, dst), (csr, src[order], dst[order])]


@PROPS
@given(edge_lists(square=False))
def test_to_edge_index_returns_edges_in_edge_order(rel):
    src, dst, num_src, num_dst = rel
    for g, s, d in _graphs(src, dst, num_src, num_dst):
        ei = g.to_edge_index()
        assert ei.dtype == np.int64 and ei.shape == (2, len(s))
        np.testing.assert_array_equal(ei, np.stack([s, d]))


@PROPS
@given(edge_lists())
def test_edge_index_round_trip(rel):
    src, dst, n, _ = rel
    ei = np.stack([src, dst])
    g = tg.Graph.from_edge_index(ei, num_nodes=n)
    np.testing.assert_array_equal(g.to_edge_index(), ei)
    again = tg.Graph.from_edge_index(g.to_edge_index(), num_nodes=n)
    for a, b in zip(again.resolve_csr(), g.resolve_csr()):
        np.testing.assert_array_equal(a, b)


def _message_sum(g, x, w):
    """y[i] = sum over edges e = (j -> i) of w[e] * x[j], through Tiga's reference."""
    def edge(src, dst, edge):
        return src.x * edge.w
    return np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": x}, edge={"w": w}))


@PROPS
@given(edge_lists(square=False))
def test_with_self_loops_is_a_plus_i(rel):
    src, dst, num_src, num_dst = rel
    loops = min(num_src, num_dst)
    for g, s, d in _graphs(src, dst, num_src, num_dst):
        h = g.with_self_loops()
        assert (h.num_src, h.num_dst, h.num_edges) == (num_src, num_dst, len(s) + loops)
        # edge order: the original edges, then loop i for i = 0 .. loops-1
        want = np.stack([np.concatenate([s, np.arange(loops)]),
                         np.concatenate([d, np.arange(loops)])])
        np.testing.assert_array_equal(h.to_edge_index(), want)
        # storage: each loop is the last edge of its row; original rows keep their order
        row_ptr, col_idx = h.resolve_csr()
        rp0, ci0 = g.resolve_csr()
        for i in range(num_dst):
            row = col_idx[row_ptr[i]:row_ptr[i + 1]]
            old = ci0[rp0[i]:rp0[i + 1]]
            np.testing.assert_array_equal(row, np.append(old, i) if i < loops else old)
        # as an operator: (A + I) x with the edge field extended by the loops' weights
        rng = np.random.default_rng(len(s))
        x, w, wl = rng.normal(size=num_src), rng.normal(size=len(s)), rng.normal(size=loops)
        dense = np.zeros((num_dst, num_src))
        np.add.at(dense, (d, s), w)
        dense[np.arange(loops), np.arange(loops)] += wl
        np.testing.assert_allclose(_message_sum(h, x, np.concatenate([w, wl])), dense @ x,
                                   atol=1e-12)


def _dense_gcn_norm(src, dst, n):
    a = np.zeros((n, n))
    np.add.at(a, (dst, src), 1.0)
    deg = a.sum(axis=1)   # in-degree: edges arriving at each node
    inv = np.zeros(n)
    inv[deg > 0] = deg[deg > 0] ** -0.5
    return inv[dst] * inv[src]


@PROPS
@given(edge_lists())
def test_gcn_norm_matches_dense_oracle(rel):
    src, dst, n, _ = rel
    for g, s, d in _graphs(src, dst, n, n):
        np.testing.assert_allclose(g.gcn_norm(), _dense_gcn_norm(s, d, n), rtol=1e-14)
        s_l, d_l = np.concatenate([s, np.arange(n)]), np.concatenate([d, np.arange(n)])
        looped = g.gcn_norm(add_self_loops=True)
        np.testing.assert_allclose(looped, _dense_gcn_norm(s_l, d_l, n), rtol=1e-14)
        np.testing.assert_array_equal(looped, g.with_self_loops().gcn_norm())
    assert g.gcn_norm(dtype=np.float32).dtype == np.float32


def test_gcn_norm_needs_one_node_set():
    g = tg.Graph.from_coo([0, 1], [0, 2], num_src=2, num_dst=3)
    with pytest.raises(tg.GraphValidationError, match=r"gcn_norm: the relation has "
                                                      r"num_src=2 and num_dst=3"):
        g.gcn_norm()


def test_implicit_kinds_resolve():
    g = tg.Graph.triangular(4)
    np.testing.assert_array_equal(g.with_self_loops().degrees(), np.arange(1, 5) + 1)
    src, dst = g.to_edge_index()
    assert (src <= dst).all() and len(src) == 10


@PROPS
@given(edge_lists())
def test_gcn_norm_matches_pyg(rel):
    pyg_utils = pytest.importorskip("torch_geometric.utils")
    torch = pytest.importorskip("torch")
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm
    src, dst, n, _ = rel
    g = tg.Graph.from_edge_index(np.stack([src, dst]), num_nodes=n)
    ei = torch.as_tensor(np.stack([src, dst]))
    _, want = pyg_gcn_norm(ei, None, n, add_self_loops=False)
    np.testing.assert_allclose(g.gcn_norm(), want.double().numpy(), rtol=1e-6)
    # PyG's A + I (add_self_loops appends loop i as edge E + i), then its normalisation
    ei_l, _ = pyg_utils.add_self_loops(ei, num_nodes=n)
    np.testing.assert_array_equal(g.with_self_loops().to_edge_index(), ei_l.numpy())
    _, want_l = pyg_gcn_norm(ei_l, None, n, add_self_loops=False)
    np.testing.assert_allclose(g.gcn_norm(add_self_loops=True), want_l.double().numpy(),
                               rtol=1e-6)
