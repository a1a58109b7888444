"""Tests for core relations: constructors against plain-Python oracles, transpose, degrees,
types, validation messages, and robustness against arbitrary inputs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiga.core import dtypes
from tiga.core.errors import GraphValidationError
from tiga.core.graph import Graph
from tiga.core.types import Dim, GraphType

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- plain-Python oracles -----------------------------------------------------------------


def edges_in_order(g: Graph) -> list:
    """(src, dst) of every edge in the graph's edge order (user order when edge_perm is set)."""
    row_ptr, col_idx = g.resolve_csr()
    stored = []
    for d in range(g.num_dst):
        for p in range(int(row_ptr[d]), int(row_ptr[d + 1])):
            stored.append((int(col_idx[p]), d))
    if g.edge_perm is None:
        return stored
    out = [None] * len(stored)
    for p, e in enumerate(g.edge_perm.tolist()):
        out[e] = stored[p]
    return out


def assert_csr_consistent(g: Graph) -> None:
    row_ptr, col_idx = g.resolve_csr()
    assert row_ptr.dtype == np.int64
    assert len(row_ptr) == g.num_dst + 1 and row_ptr[0] == 0
    assert row_ptr[-1] == len(col_idx) == g.num_edges
    assert all(row_ptr[i] <= row_ptr[i + 1] for i in range(g.num_dst))
    assert all(0 <= c < g.num_src for c in col_idx.tolist())


def dense_oracle(s: int, d: int) -> list:
    return [(j, i) for i in range(d) for j in range(s)]


def triangular_oracle(n: int) -> list:
    return [(j, i) for i in range(n) for j in range(i + 1)]


def cu_seqlens_oracle(cu: list, causal: bool) -> list:
    out = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        for i in range(a, b):
            out += [(j, i) for j in range(a, i + 1 if causal else b)]
    return out


def stencil_oracle(shape: tuple, offsets: list, periodic: bool) -> list:
    def flat(coord):
        idx = 0
        for c, n in zip(coord, shape, strict=True):
            idx = idx * n + c
        return idx

    out = []
    for point in itertools.product(*(range(n) for n in shape)):  # C order
        for off in offsets:
            nb = [c + o for c, o in zip(point, off, strict=True)]
            if periodic:
                nb = [c % n for c, n in zip(nb, shape, strict=True)]
            elif not all(0 <= c < n for c, n in zip(nb, shape, strict=True)):
                continue
            out.append((flat(nb), flat(point)))
    return out


def cat_oracle(graphs: list) -> list:
    out, s_off, d_off = [], 0, 0
    for g in graphs:
        out += [(s + s_off, d + d_off) for s, d in edges_in_order(g)]
        s_off, d_off = s_off + g.num_src, d_off + g.num_dst
    return out


# ---- constructors -------------------------------------------------------------------------


def test_from_csr_literal_example():
    g = Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
    assert (g.kind, g.num_src, g.num_dst, g.num_edges) == ("csr", 2, 3, 3)
    assert edges_in_order(g) == [(0, 0), (1, 0), (1, 1)]
    assert g.edge_perm is None and g.validated == "full"
    assert repr(g) == "Graph(kind='csr', num_src=2, num_dst=3, num_edges=3)"


def test_from_csr_infers_num_src_and_keeps_dtype():
    g = Graph.from_csr(np.array([0, 1, 3], np.int32), np.array([4, 0, 2], np.int32))
    assert g.num_src == 5 and g.index_dtype == dtypes.int32
    row_ptr, col_idx = g.resolve_csr()
    assert row_ptr.dtype == np.int64 and col_idx.dtype == np.int32
    assert Graph.from_csr([0, 0], []).num_src == 0
    assert Graph.from_csr(np.array([0, 1]), np.array([3], np.int16)).index_dtype == dtypes.int32
    assert Graph.from_csr(np.array([0, 1]), np.array([3], np.uint32)).index_dtype == dtypes.int64


def test_from_csr_owns_its_arrays():
    row_ptr, col_idx = np.array([0, 2, 3]), np.array([1, 0, 1])
    g = Graph.from_csr(row_ptr, col_idx)
    got_rp, got_ci = g.resolve_csr()
    assert not np.shares_memory(got_rp, row_ptr) and not np.shares_memory(got_ci, col_idx)
    col_idx[1] = 10**12          # the caller's array stays writable and the graph unchanged
    assert edges_in_order(g) == [(1, 0), (0, 0), (1, 1)]


def test_from_csr_copy_false_is_zero_copy_and_freezes():
    base = np.array([9, 1, 0, 1])
    row_ptr, col_idx = np.array([0, 2, 3]), base[1:]
    got_rp, got_ci = Graph.from_csr(row_ptr, col_idx, copy=False).resolve_csr()
    assert np.shares_memory(got_rp, row_ptr) and np.shares_memory(got_ci, col_idx)
    for arr in (row_ptr, col_idx, base):   # the view and the array it views
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 10**12
    # a dtype conversion copies anyway, and leaves the caller's array writable
    narrow = np.array([1, 0, 1], np.int16)
    Graph.from_csr(np.array([0, 2, 3]), narrow, copy=False)
    assert narrow.flags.writeable
    # memory numpy cannot freeze (a bytearray) is copied, not shared
    raw = np.frombuffer(bytearray(np.array([1, 0, 1]).tobytes()), np.int64)
    assert not np.shares_memory(Graph.from_csr([0, 2, 3], raw, copy=False).resolve_csr()[1],
                                raw)
    with pytest.raises(GraphValidationError, match=r"copy: is 'no', expected True or False"):
        Graph.from_csr([0, 0], [], copy="no")


@pytest.mark.parametrize("validate", ["none", "basic"])
def test_from_coo_deferred_check_reads_private_arrays(validate):
    src, dst = np.array([0, 1]), np.array([1, 0])
    g = Graph.from_coo(src, dst, num_src=2, num_dst=2, validate=validate)
    src[0] = -5
    g.ensure_valid()   # checks what the CSR was built from, not the caller's later write
    assert edges_in_order(g) == [(0, 1), (1, 0)]
    frozen = np.array([0, 1])
    Graph.from_coo(frozen, np.array([1, 0]), num_src=2, num_dst=2, validate=validate,
                   copy=False)
    with pytest.raises(ValueError, match="read-only"):
        frozen[0] = 3


@pytest.mark.parametrize("s,d", [(0, 0), (3, 0), (0, 2), (1, 1), (3, 4), (4, None)])
def test_dense(s, d):
    g = Graph.dense(s, d)
    d = s if d is None else d
    assert (g.kind, g.num_src, g.num_dst, g.num_edges) == ("dense", s, d, s * d)
    assert edges_in_order(g) == dense_oracle(s, d)
    assert_csr_consistent(g)


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_triangular(n):
    g = Graph.triangular(n)
    assert g.kind == "triangular" and g.params == {"n": n} and g.num_edges == n * (n + 1) // 2
    assert edges_in_order(g) == triangular_oracle(n)
    assert_csr_consistent(g)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("cu", [[0], [0, 0], [0, 3], [0, 2, 2, 5, 6], [0, 1, 4, 4]])
def test_cu_seqlens(cu, causal):
    g = Graph.cu_seqlens(np.array(cu), causal=causal)
    expected = cu_seqlens_oracle(cu, causal)
    assert (g.kind, g.num_src, g.num_dst, g.num_edges) == ("cu_seqlens", cu[-1], cu[-1],
                                                             len(expected))
    assert g.params == {"cu_seqlens": tuple(cu), "causal": causal}
    assert edges_in_order(g) == expected
    assert_csr_consistent(g)


STENCILS = [
    ((5,), [(-1,), (0,), (1,)]),
    ((4,), [(2,), (-3,), (1,), (1,)]),
    ((3, 4), [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)]),
    ((2, 3), [(1, 1), (-2, 5)]),
    ((2, 3, 4), [(0, 0, 1), (1, -1, 0), (0, 0, -1), (-1, 0, 0)]),
    ((3, 0), [(0, 1)]),
    ((3,), []),
]


@pytest.mark.parametrize("periodic", [False, True])
@pytest.mark.parametrize("shape,offsets", STENCILS)
def test_stencil(shape, offsets, periodic):
    g = Graph.stencil(shape, offsets, periodic=periodic)
    expected = stencil_oracle(shape, offsets, periodic)
    points = int(np.prod(shape))
    assert (g.kind, g.num_src, g.num_dst) == ("stencil", points, points)
    assert g.num_edges == len(expected)  # known before materialising
    assert g.params == {"shape": tuple(shape), "offsets": tuple(map(tuple, offsets)),
                        "periodic": periodic}
    assert edges_in_order(g) == expected
    assert_csr_consistent(g)


def test_stencil_accepts_numpy_offsets_and_int_shape():
    g = Graph.stencil(6, np.array([[-1], [1]]))
    assert edges_in_order(g) == stencil_oracle((6,), [(-1,), (1,)], False)


def test_from_coo_keeps_user_edge_order():
    src, dst = [2, 0, 1, 1, 0], [1, 0, 1, 0, 2]
    g = Graph.from_coo(src, dst, num_src=3, num_dst=4)
    assert g.kind == "csr" and g.num_dst == 4 and g.num_edges == 5
    assert edges_in_order(g) == list(zip(src, dst, strict=True))
    assert g.edge_perm.dtype == np.int64
    row_ptr, col_idx = g.resolve_csr()
    for d in range(g.num_dst):  # stable: user order within each destination row
        users = g.edge_perm[row_ptr[d]:row_ptr[d + 1]].tolist()
        assert users == sorted(users) and all(dst[e] == d for e in users)
    assert [src[e] for e in g.edge_perm.tolist()] == col_idx.tolist()


def test_from_coo_index_dtype():
    g = Graph.from_coo(np.array([1, 0], np.int32), np.array([0, 0], np.int32), num_src=2,
                       num_dst=1)
    assert g.index_dtype == dtypes.int32 and g.resolve_csr()[1].dtype == np.int32


def test_from_edge_index():
    ei = np.array([[0, 2, 2, 1, 3], [1, 1, 0, 1, 3]])
    g = Graph.from_edge_index(ei)
    assert (g.num_src, g.num_dst, g.num_edges) == (4, 4, 5)
    assert edges_in_order(g) == list(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    assert Graph.from_edge_index(ei, num_nodes=7).num_dst == 7
    empty = Graph.from_edge_index(np.zeros((2, 0), np.int64))
    assert (empty.num_src, empty.num_dst, empty.num_edges) == (0, 0, 0)


def test_from_scipy_coo_keeps_duplicates_and_order():
    sp = pytest.importorskip("scipy.sparse")
    rows, cols = np.array([1, 0, 1, 2, 1]), np.array([2, 2, 2, 0, 0])
    m = sp.coo_matrix((np.ones(5), (rows, cols)), shape=(3, 4))
    g = Graph.from_scipy(m)
    assert (g.num_dst, g.num_src, g.num_edges) == (3, 4, 5)
    assert edges_in_order(g) == list(zip(cols.tolist(), rows.tolist(), strict=True))


def test_from_scipy_csr_is_taken_as_stored():
    sp = pytest.importorskip("scipy.sparse")
    indptr, indices = np.array([0, 3, 3, 5], np.int32), np.array([2, 0, 2, 1, 1], np.int32)
    m = sp.csr_matrix((np.ones(5), indices, indptr), shape=(3, 3))
    g = Graph.from_scipy(m)
    row_ptr, col_idx = g.resolve_csr()
    assert row_ptr.tolist() == indptr.tolist() and col_idx.tolist() == indices.tolist()
    assert g.index_dtype == dtypes.int32 and g.edge_perm is None
    g2 = Graph.from_scipy(sp.csr_array((np.ones(5), indices, indptr), shape=(3, 3)))
    assert edges_in_order(g2) == edges_in_order(g)


def test_from_scipy_csc_with_duplicates():
    sp = pytest.importorskip("scipy.sparse")
    indptr, indices = np.array([0, 2, 2, 5]), np.array([1, 1, 0, 2, 0])
    m = sp.csc_matrix((np.ones(5), indices, indptr), shape=(3, 3))
    expected = [(j, int(indices[k])) for j in range(3) for k in range(indptr[j], indptr[j + 1])]
    assert edges_in_order(Graph.from_scipy(m)) == expected


def test_cat_offsets_and_edge_order():
    parts = [Graph.triangular(2),
             Graph.from_coo([1, 0, 2], [0, 1, 0], num_src=3, num_dst=2),
             Graph.dense(0, 2),
             Graph.from_csr([0, 1], [0], num_src=4)]
    g = Graph.cat(parts)
    assert g.kind == "cat" and (g.num_src, g.num_dst) == (9, 7)
    assert edges_in_order(g) == cat_oracle(parts)
    assert g.edge_perm is not None and g.edge_perm.dtype == np.int64
    assert g.params["blocks"][0] == ("triangular", 2, 2, 3)
    assert_csr_consistent(g)


def test_cat_without_permutations_and_empty():
    parts = [Graph.triangular(2), Graph.triangular(3)]
    g = Graph.cat(parts)
    assert g.edge_perm is None and edges_in_order(g) == cat_oracle(parts)
    empty = Graph.cat([])
    assert (empty.num_src, empty.num_dst, empty.num_edges) == (0, 0, 0)


def test_cat_index_dtype():
    a = Graph.from_csr(np.array([0, 1], np.int32), np.array([0], np.int32))
    assert Graph.cat([a, a]).index_dtype == dtypes.int32
    assert Graph.cat([a, Graph.dense(2)]).index_dtype == dtypes.int64


# ---- queries ------------------------------------------------------------------------------


def test_resolve_csr_is_cached_and_read_only():
    g = Graph.triangular(4)
    first = g.resolve_csr()
    assert g.resolve_csr() is first
    assert first[0].dtype == np.int64 and first[1].dtype == np.int64
    with pytest.raises(ValueError):
        first[1][0] = 3


def test_type_concrete_and_symbolic():
    g = Graph.from_csr(np.array([0, 1, 3], np.int32), np.array([4, 0, 2], np.int32))
    assert g.type() == GraphType("csr", 5, 2, 3, dtypes.int32, None)
    assert g.type(symbolic=True) == GraphType("csr", Dim("S"), Dim("N"), Dim("E"), dtypes.int32)
    sq = Graph.triangular(3).type(symbolic=True)
    assert sq.num_src == sq.num_dst == Dim("N") and str(sq) == "triangular[N,N;E]"


def test_transpose_small_example():
    g = Graph.from_coo([2, 0, 1, 1], [1, 0, 1, 0], num_src=3, num_dst=2)
    gt, perm = g.transpose()
    assert (gt.kind, gt.num_src, gt.num_dst, gt.num_edges) == ("csr", 2, 3, 4)
    assert gt.edge_perm is None and perm.dtype == np.int64
    assert edges_in_order(gt) == [(0, 0), (1, 1), (0, 1), (1, 2)]
    assert perm.tolist() == [1, 2, 3, 0]
    assert g.transpose()[0] is gt  # cached


@pytest.mark.parametrize("make", [lambda: Graph.dense(3, 2), lambda: Graph.triangular(4),
                                  lambda: Graph.stencil((3, 3), [(0, 1), (1, 0), (0, 0)]),
                                  lambda: Graph.cu_seqlens([0, 2, 5], causal=False)])
def test_transpose_implicit(make):
    g = make()
    gt, perm = g.transpose()
    edges = edges_in_order(g)
    assert [(d, s) for s, d in edges_in_order(gt)] == [edges[e] for e in perm.tolist()]
    assert g.degrees("src").tolist() == gt.degrees("dst").tolist()


def test_degrees_bad_argument():
    with pytest.raises(GraphValidationError, match=r"by: is 'out', expected 'dst' or 'src'"):
        Graph.dense(2).degrees(by="out")


@st.composite
def coo_graphs(draw):
    num_src = draw(st.integers(0, 6))
    num_dst = draw(st.integers(0, 6))
    num_edges = draw(st.integers(0, 25)) if num_src and num_dst else 0
    src = draw(st.lists(st.integers(0, max(num_src - 1, 0)), min_size=num_edges,
                        max_size=num_edges))
    dst = draw(st.lists(st.integers(0, max(num_dst - 1, 0)), min_size=num_edges,
                        max_size=num_edges))
    return src, dst, num_src, num_dst


@FAST
@given(coo_graphs())
def test_transpose_properties(case):
    src, dst, num_src, num_dst = case
    g = Graph.from_coo(np.array(src, np.int64), np.array(dst, np.int64), num_src=num_src,
                       num_dst=num_dst)
    assert edges_in_order(g) == list(zip(src, dst, strict=True))
    gt, perm = g.transpose()
    assert (gt.num_src, gt.num_dst) == (num_dst, num_src)
    # an edge field in user order, permuted, lines up with the transposed edges
    f_src, f_dst = np.array(src, np.int64)[perm], np.array(dst, np.int64)[perm]
    assert list(zip(f_dst.tolist(), f_src.tolist(), strict=True)) == edges_in_order(gt)
    assert sorted(perm.tolist()) == list(range(len(src)))
    for s in range(num_src):  # stable: original edge order within each source row
        rp = gt.resolve_csr()[0]
        assert perm[rp[s]:rp[s + 1]].tolist() == sorted(perm[rp[s]:rp[s + 1]].tolist())
    gtt, _ = gt.transpose()
    assert sorted(edges_in_order(gtt)) == sorted(zip(src, dst, strict=True))
    assert g.degrees().tolist() == np.bincount(dst, minlength=num_dst).tolist()
    assert g.degrees(by="src").tolist() == np.bincount(src, minlength=num_src).tolist()
    assert g.degrees().dtype == np.int64 and g.degrees(by="src").dtype == np.int64


@FAST
@given(st.lists(coo_graphs(), max_size=4))
def test_cat_property(cases):
    parts = [Graph.from_coo(s, d, num_src=ns, num_dst=nd) for s, d, ns, nd in cases]
    g = Graph.cat(parts)
    assert edges_in_order(g) == cat_oracle(parts)
    assert_csr_consistent(g)


# ---- lazy validation ----------------------------------------------------------------------


def test_validate_none_is_checked_by_ensure_valid():
    g = Graph.from_csr([0, 2, 1], [0, 9], num_src=3, validate="none")
    assert g.validated == "none"
    with pytest.raises(GraphValidationError, match=r"row_ptr: last entry"):
        g.ensure_valid()
    with pytest.raises(GraphValidationError):
        g.transpose()  # never computes on an unvalidated relation
    good = Graph.from_csr([0, 1, 2], [0, 2], num_src=3, validate="none")
    assert good.ensure_valid() is good and good.validated == "full"


def test_validate_basic_defers_the_scans():
    g = Graph.from_csr([0, 2, 1, 3], [0, 1, 7], num_src=3, validate="basic")
    assert g.validated == "basic"
    with pytest.raises(GraphValidationError, match=r"row_ptr: entry at position 2 is 1"):
        g.ensure_valid()
    with pytest.raises(GraphValidationError, match=r"row_ptr: entry at position 0 is 1"):
        Graph.from_csr([1, 1], [0], validate="basic")


def test_from_coo_lazy_validation_names_coo_arguments():
    g = Graph.from_coo([0, 5], [1, -1], num_src=2, num_dst=2, validate="none")
    with pytest.raises(GraphValidationError, match=r"src: entry at position 1 is 5"):
        g.degrees()
    assert g.validated == "none"


def test_cat_of_unvalidated_parts():
    bad = Graph.from_csr([0, 1], [4], num_src=2, validate="none")
    g = Graph.cat([Graph.dense(1), bad])
    assert g.validated == "none"
    with pytest.raises(GraphValidationError, match=r"col_idx: entry at position 0 is 4"):
        g.ensure_valid()
    ok = Graph.cat([Graph.dense(1), Graph.from_csr([0, 1], [1], num_src=2, validate="basic")])
    assert ok.ensure_valid().validated == "full"


# ---- validation messages ------------------------------------------------------------------

BAD_CSR = [
    (([0, 1, 2], [0, 1], 1), r"col_idx: entry at position 1 is 1, expected 0 <= col_idx < "
                             r"num_src = 1"),
    (([0, 2, 3, 3, 5], [0, 1, 1, 4, 7], 5), r"col_idx: entry at position 4 is 7, expected "
                                            r"0 <= col_idx < num_src = 5"),
    (([0, 1], [-1], 2), r"col_idx: entry at position 0 is -1, expected 0 <= col_idx"),
    (([1, 2], [0], None), r"row_ptr: entry at position 0 is 1, expected row_ptr\[0\] == 0"),
    (([0, 2, 1, 3], [0, 0, 0], None), r"row_ptr: entry at position 2 is 1, expected "
                                      r"non-decreasing row_ptr"),
    (([0, 1, 4], [0, 0, 0], None), r"row_ptr: last entry \(position 2\) is 4, expected "
                                   r"row_ptr\[-1\] == len\(col_idx\) = 3"),
    (([], [], None), r"row_ptr: has length 0, expected length num_dst \+ 1"),
    (([0.0, 1.0], [0], None), r"row_ptr: dtype is float64, expected an integer dtype"),
    (([0, 1], [True], None), r"col_idx: dtype is bool, expected an integer dtype"),
    (([[0, 1]], [0], None), r"row_ptr: has shape \(1, 2\), expected a 1-D array"),
    (([0, 1], [[0]], None), r"col_idx: has shape \(1, 1\), expected a 1-D array"),
    (([0, [1, 2]], [0], None), r"row_ptr: could not be read as an array"),
    (([0, 2**70], [0], None), r"row_ptr: could not be read|row_ptr: dtype is object"),
    (([0, 1], ["a"], None), r"col_idx: dtype is str"),
    (([0, 1], [0], -1), r"num_src: is -1, expected a non-negative integer"),
    (([0, 1], [0], 2.0), r"num_src: is 2.0, expected a non-negative integer"),
    (([0, 1], [0], True), r"num_src: is True, expected a non-negative integer"),
    (([0, 1], [0], 2**64), r"num_src: is 18446744073709551616, expected a non-negative integer"),
]


@pytest.mark.parametrize("args,message", BAD_CSR)
def test_from_csr_errors(args, message):
    row_ptr, col_idx, num_src = args
    with pytest.raises(GraphValidationError, match=message):
        Graph.from_csr(row_ptr, col_idx, num_src=num_src)


def test_unsigned_row_ptr_cannot_wrap():
    with pytest.raises(GraphValidationError, match=r"row_ptr: entry at position 2 is 1, exp"):
        Graph.from_csr(np.array([0, 2, 1, 2], np.uint64), np.array([0, 0]), num_src=1)
    with pytest.raises(GraphValidationError, match=r"col_idx: entry at position 0 is "
                                                   r"18446744073709551615, expected at most "
                                                   r"9223372036854775807 \(int64 index"):
        Graph.from_csr(np.array([0, 1], np.uint64), np.array([2**64 - 1], np.uint64))


def test_unknown_validate_level():
    with pytest.raises(GraphValidationError, match=r"validate: is 'fast', expected one of"):
        Graph.from_csr([0, 1], [0], validate="fast")
    with pytest.raises(GraphValidationError, match=r"validate: is None"):
        Graph.from_coo([0], [0], num_src=1, num_dst=1, validate=None)


BAD_COO = [
    (([0, 1], [0], 2, 2), r"dst: has length 1, expected len\(dst\) == len\(src\) = 2"),
    (([0, 3, 1], [0, 0, 0], 3, 1), r"src: entry at position 1 is 3, expected 0 <= src < "
                                   r"num_src = 3"),
    (([0, 0, 1], [0, 1, -2], 3, 2), r"dst: entry at position 2 is -2, expected 0 <= dst < "
                                    r"num_dst = 2"),
    (([0], [0.5], 1, 1), r"dst: dtype is float64"),
    (([0], [0], 1, -3), r"num_dst: is -3, expected a non-negative integer"),
    (([0], [0], "1", 1), r"num_src: is '1', expected a non-negative integer"),
]


@pytest.mark.parametrize("args,message", BAD_COO)
def test_from_coo_errors(args, message):
    src, dst, num_src, num_dst = args
    with pytest.raises(GraphValidationError, match=message):
        Graph.from_coo(src, dst, num_src=num_src, num_dst=num_dst)


@pytest.mark.parametrize("edge_index,num_nodes,message", [
    ([0, 1], None, r"edge_index: has shape \(2,\), expected a 2-D array"),
    ([[0, 1], [1, 0], [0, 0]], None, r"edge_index: has shape \(3, 2\), expected shape \(2, E\)"),
    ([[0, 5], [1, 0]], 3, r"edge_index\[0\]: entry at position 1 is 5, expected 0 <= "
                          r"edge_index\[0\] < num_nodes = 3"),
    ([[0, 1], [-1, 0]], None, r"edge_index\[1\]: entry at position 0 is -1"),
    ([[0.0], [1.0]], None, r"edge_index: dtype is float64"),
    ([[0], [1]], -1, r"num_nodes: is -1"),
])
def test_from_edge_index_errors(edge_index, num_nodes, message):
    with pytest.raises(GraphValidationError, match=message):
        Graph.from_edge_index(edge_index, num_nodes)


def test_from_scipy_errors():
    sp = pytest.importorskip("scipy.sparse")
    with pytest.raises(GraphValidationError, match=r"matrix: is ndarray, expected a 2-D scipy"):
        Graph.from_scipy(np.eye(2))
    bad = sp.csr_matrix((np.ones(2), np.array([0, 5]), np.array([0, 1, 2])), shape=(2, 3))
    with pytest.raises(GraphValidationError, match=r"matrix.indices: entry at position 1 is 5, "
                                                   r"expected 0 <= matrix.indices < num_src = 3"):
        Graph.from_scipy(bad)


@pytest.mark.parametrize("call,message", [
    (lambda: Graph.dense(-1), r"num_src: is -1, expected a non-negative integer"),
    (lambda: Graph.dense(2, 1.5), r"num_dst: is 1.5, expected a non-negative integer"),
    (lambda: Graph.triangular(-2), r"n: is -2, expected a non-negative integer"),
    (lambda: Graph.triangular("3"), r"n: is '3'"),
    (lambda: Graph.cu_seqlens([1, 3]), r"cu_seqlens: entry at position 0 is 1, expected "
                                       r"cu_seqlens\[0\] == 0"),
    (lambda: Graph.cu_seqlens([0, 4, 2, 6]), r"cu_seqlens: entry at position 2 is 2, expected "
                                             r"non-decreasing cu_seqlens"),
    (lambda: Graph.cu_seqlens([]), r"cu_seqlens: has length 0"),
    (lambda: Graph.cu_seqlens([[0, 1]]), r"cu_seqlens: has shape \(1, 2\), expected a 1-D"),
    (lambda: Graph.cu_seqlens([0.0, 2.0]), r"cu_seqlens: dtype is float64, expected an integer"),
    (lambda: Graph.cu_seqlens([0, 2], causal="yes"), r"causal: is 'yes', expected True or"),
    (lambda: Graph.stencil((3, 3), [(0, 1), (1,)]), r"offsets: entry at position 1 has 1 "
                                                    r"components, expected len\(shape\) = 2"),
    (lambda: Graph.stencil((3,), [(0.5,)]), r"offsets: entry at position 0 is \(0.5,\), "
                                            r"expected a tuple of 1 integers"),
    (lambda: Graph.stencil((3,), [1]), r"offsets: entry at position 0 is 1"),
    (lambda: Graph.stencil((3,), 7), r"offsets: is 7, expected a sequence"),
    (lambda: Graph.stencil((3,), [(2**40,)]), r"offsets: entry at position 0 is \(1099511627776"),
    (lambda: Graph.stencil((), [()]), r"shape: is empty, expected at least one dimension"),
    (lambda: Graph.stencil((3, -1), [(0, 0)]), r"shape: entry at position 1: is -1, expected a "
                                               r"non-negative integer"),
    (lambda: Graph.stencil(None, [(0,)]), r"shape: is None, expected a sequence"),
    (lambda: Graph.stencil((2**40, 2**40), []), r"shape: has 1208925819614629174706176 points"),
    (lambda: Graph.stencil((3,), [(1,)], periodic=1), r"periodic: is 1, expected True or False"),
    (lambda: Graph.cat([Graph.dense(1), 3]), r"graphs: entry at position 1 is int, expected a "
                                             r"Graph"),
    (lambda: Graph.cat(Graph.dense(1)), r"graphs: is a single Graph, expected a sequence"),
    (lambda: Graph.cat(5), r"graphs: is int, expected a sequence of Graphs"),
])
def test_implicit_constructor_errors(call, message):
    with pytest.raises(GraphValidationError, match=message):
        call()


# ---- input kinds --------------------------------------------------------------------------


class _Detachable:
    """Stands in for an autograd tensor: __array__ refuses until detach() is called."""

    def __init__(self, data, attached=True):
        self.data, self.attached = np.asarray(data), attached

    def detach(self):
        return _Detachable(self.data, attached=False)

    def __array__(self, dtype=None, copy=None):
        if self.attached:
            raise RuntimeError("call detach() first")
        return self.data


class _DLPackOnly:
    """A producer that speaks only DLPack (no __array__)."""

    def __init__(self, data, device=(1, 0)):
        self.data, self.device = np.asarray(data), device

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device

    def cpu(self):
        return _DLPackOnly(self.data)


def test_detach_and_dlpack_inputs():
    g = Graph.from_csr(_Detachable([0, 1, 2]), _DLPackOnly([1, 0]))
    assert edges_in_order(g) == [(1, 0), (0, 1)] and g.device == "cpu"
    gpu = Graph.from_coo(_DLPackOnly([0, 1], device=(2, 1)), [1, 1], num_src=2, num_dst=2)
    assert gpu.device == "cuda:1" and edges_in_order(gpu) == [(0, 1), (1, 1)]


class _Broken:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("storage is gone")


def test_unreadable_input():
    with pytest.raises(GraphValidationError, match=r"col_idx: could not be read as an array "
                                                   r"\(RuntimeError: storage is gone\)"):
        Graph.from_csr([0, 1], _Broken())


def test_torch_inputs():
    torch = pytest.importorskip("torch")
    row_ptr = torch.tensor([0, 2, 3, 3])
    col_idx = torch.tensor([0, 1, 1], dtype=torch.int32)
    g = Graph.from_csr(row_ptr, col_idx, num_src=2, validate="full")
    assert g.index_dtype == dtypes.int32 and edges_in_order(g) == [(0, 0), (1, 0), (1, 1)]
    assert not np.shares_memory(g.resolve_csr()[1], col_idx.numpy())  # owned: copied
    shared = Graph.from_csr(row_ptr, col_idx, num_src=2, copy=False)
    # torch memory cannot be frozen by numpy: copied even with copy=False
    assert not np.shares_memory(shared.resolve_csr()[1], col_idx.numpy())
    coo = Graph.from_coo(torch.tensor([1, 0]), torch.tensor([0, 0]), num_src=2, num_dst=1)
    assert edges_in_order(coo) == [(1, 0), (0, 0)]
    assert Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]])).num_edges == 2
    assert Graph.cu_seqlens(torch.tensor([0, 2, 3])).num_edges == 4
    with pytest.raises(GraphValidationError, match=r"col_idx: dtype is float32"):
        Graph.from_csr(row_ptr, torch.zeros(3, requires_grad=True))
    assert Graph.dense(torch.tensor(3)).num_edges == 9


# ---- robustness and speed -----------------------------------------------------------------

_arrays = st.one_of(
    st.lists(st.integers(-3, 12), max_size=8),
    st.lists(st.floats(allow_nan=True), max_size=3),
    st.lists(st.booleans(), max_size=3),
    st.lists(st.lists(st.integers(-2, 5), max_size=3), max_size=3),
    st.sampled_from([None, 3, "x", 2**70, [2**70], np.uint64([0, 2**63]), np.int8([0, -1, 1])]),
)
_sizes = st.one_of(st.none(), st.integers(-2, 10), st.sampled_from([1.5, True, 2**64, "3"]))
_levels = st.sampled_from(["full", "basic", "none"])


@settings(max_examples=200, deadline=None)
@given(_arrays, _arrays, _sizes, _sizes, _levels)
def test_no_input_crashes(a, b, n, m, level):
    """Anything either builds a graph or raises GraphValidationError, and an unvalidated graph
    either validates or raises GraphValidationError; no numpy error escapes."""
    calls = [lambda: Graph.from_csr(a, b, num_src=n, validate=level),
             lambda: Graph.from_coo(a, b, num_src=n, num_dst=m, validate=level),
             lambda: Graph.from_edge_index([a, b], num_nodes=n),
             lambda: Graph.cu_seqlens(a, causal=True),
             lambda: Graph.stencil(a[:3] if isinstance(a, list) else a, [b])]
    for call in calls:
        try:
            g = call()
        except GraphValidationError:
            continue
        try:
            g.ensure_valid()
        except GraphValidationError:
            continue
        assert_csr_consistent(g)
        g.transpose()


def test_implicit_kinds_resolve_millions_of_edges():
    """Vectorised construction at scale: sizes and offsets agree (speed lives in benchmarks)."""
    for g in (Graph.dense(1500, 1000), Graph.triangular(2000),
              Graph.cu_seqlens([0, 1000, 2500, 2500, 3000], causal=False),
              Graph.stencil((100, 100, 40), [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, 0),
                                             (0, -1, 0), (0, 0, 1), (0, 0, -1)])):
        row_ptr, col_idx = g.resolve_csr()
        assert len(col_idx) == g.num_edges >= 10**6 and row_ptr[-1] == g.num_edges
        assert np.all(np.diff(row_ptr) >= 0) and col_idx.min() >= 0
        assert col_idx.max() < g.num_src
