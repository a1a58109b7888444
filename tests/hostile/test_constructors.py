"""Hostile relation inputs: bad arrays, mutated arrays, unvalidated graphs (issue 13).

Each group runs in one subprocess (see _run.py): a crash or hang fails the test."""
from __future__ import annotations

from ._run import check_cases

COMMON = '''
class Sum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x

def dense_oracle(row_ptr, col_idx, x):
    """The relation's sums computed from plain Python lists (independent of Tiga)."""
    return np.array([sum(x[c] for c in col_idx[row_ptr[d]:row_ptr[d + 1]])
                     for d in range(len(row_ptr) - 1)])

GVE = tg.GraphValidationError
'''


BAD_INDEX_ARRAYS_NAME_ARGUMENT_POSITION_AND_RULE = COMMON + '''
@case
def float_col_idx():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], np.array([0.0])), "col_idx: dtype is float64")

@case
def bool_row_ptr():
    raises(GVE, lambda: tg.Graph.from_csr(np.array([False, True]), [0]), "row_ptr: dtype is bool")

@case
def two_d_col_idx():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], np.zeros((1, 1), int)),
           "col_idx: has shape (1, 1), expected a 1-D array")

@case
def empty_row_ptr():
    raises(GVE, lambda: tg.Graph.from_csr(np.zeros(0, int), []), "row_ptr: has length 0")

@case
def row_ptr_not_starting_at_zero():
    raises(GVE, lambda: tg.Graph.from_csr([1, 2], [0, 0]), "row_ptr: entry at position 0 is 1")

@case
def non_monotonic_row_ptr():
    raises(GVE, lambda: tg.Graph.from_csr([0, 3, 2, 3], [0, 0, 0], num_src=1),
           "row_ptr: entry at position 2 is 2, expected non-decreasing")

@case
def row_ptr_end_mismatch():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1, 4], [0, 0], num_src=1),
           "row_ptr: last entry (position 2) is 4", "len(col_idx) = 2")

@case
def negative_source_id():
    raises(GVE, lambda: tg.Graph.from_csr([0, 2], [0, -1], num_src=2),
           "col_idx: entry at position 1 is -1", "< num_src = 2")

@case
def huge_source_id():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], [10**12], num_src=2),
           "col_idx: entry at position 0 is 1000000000000")

@case
def uint64_id_beyond_int64():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], np.array([2**64 - 1], np.uint64)),
           "col_idx: entry at position 0 is 18446744073709551615", "int64 index storage")

@case
def python_int_too_big_for_any_dtype():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], [2**70]), "col_idx: dtype is object")

@case
def bad_num_src():
    for bad, shown in ((-1, "-1"), (True, "True"), (2.0, "2.0"), ("3", "'3'")):
        raises(GVE, lambda: tg.Graph.from_csr([0, 1], [0], num_src=bad),
               f"num_src: is {shown}")

@case
def bad_validate_and_copy_flags():
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], [0], validate="fast"),
           "validate: is 'fast', expected one of")
    raises(GVE, lambda: tg.Graph.from_csr([0, 1], [0], copy=None), "copy: is None")

@case
def coo_lengths_and_ranges():
    raises(GVE, lambda: tg.Graph.from_coo([0, 1], [0], num_src=2, num_dst=2),
           "dst: has length 1", "len(src) = 2")
    raises(GVE, lambda: tg.Graph.from_coo([0, 1], [0, 7], num_src=2, num_dst=2),
           "dst: entry at position 1 is 7", "< num_dst = 2")

@case
def edge_index_shape():
    raises(GVE, lambda: tg.Graph.from_edge_index(np.zeros((3, 2), int)),
           "edge_index: has shape (3, 2), expected shape (2, E)")

@case
def scipy_not_sparse():
    raises(GVE, lambda: tg.Graph.from_scipy(np.eye(2)), "matrix: is ndarray")

@case
def implicit_kinds():
    raises(GVE, lambda: tg.Graph.dense(-2), "num_src: is -2")
    raises(GVE, lambda: tg.Graph.triangular(1.5), "n: is 1.5")
    raises(GVE, lambda: tg.Graph.cu_seqlens([0, 3, 2]), "cu_seqlens: entry at position 2 is 2")
    raises(GVE, lambda: tg.Graph.cu_seqlens([2, 3]), "cu_seqlens: entry at position 0 is 2")
    raises(GVE, lambda: tg.Graph.stencil((3, 3), [(1,)]), "offsets: entry at position 0 has 1")
    raises(GVE, lambda: tg.Graph.stencil((-3,), [(1,)]), "shape: entry at position 0: is -3")
    raises(GVE, lambda: tg.Graph.cat([tg.Graph.dense(2), "g"]),
           "graphs: entry at position 1 is str")

@case
def generated_inputs():
    pts = np.random.default_rng(0).random((4, 2))
    raises(GVE, lambda: tg.Graph.knn(pts, 4), "k: is 4, expected 1 <= k <= 3")
    raises(GVE, lambda: tg.Graph.radius(pts, -1.0), "cutoff: is -1.0")
    raises(GVE, lambda: tg.Graph.radius(np.array([[0.0, np.inf]]), 1.0),
           "positions: entry [0, 1] is inf")
    raises(GVE, lambda: tg.Graph.radius(np.zeros((2, 0)), 1.0), "positions: has 0 coordinate")
'''


def test_bad_index_arrays_name_argument_position_and_rule():
    check_cases(BAD_INDEX_ARRAYS_NAME_ARGUMENT_POSITION_AND_RULE)


GRAPHS_OWN_THEIR_INDEX_ARRAYS = COMMON + '''
x = np.array([2.0, 3.0])

@case
def from_csr_then_write_col_idx():
    rp, ci = np.array([0, 2, 3]), np.array([0, 1, 1])
    g = tg.Graph.from_csr(rp, ci, num_src=2)
    want = dense_oracle([0, 2, 3], [0, 1, 1], x)
    same(Sum()(graph=g, src={"x": x}), want)
    ci[1] = 10**12
    rp[1] = 99
    same(Sum()(graph=g, src={"x": x}), want)
    same(Sum().reference(graph=g, src={"x": x}), want)

@case
def from_csr_copy_false_freezes():
    rp, ci = np.array([0, 2, 3]), np.array([0, 1, 1])
    g = tg.Graph.from_csr(rp, ci, num_src=2, copy=False)
    raises(ValueError, lambda: ci.__setitem__(1, 10**12), "read-only")
    raises(ValueError, lambda: rp.__setitem__(1, 99), "read-only")
    same(Sum()(graph=g, src={"x": x}), dense_oracle([0, 2, 3], [0, 1, 1], x))

@case
def from_csr_copy_false_on_a_view_freezes_its_base():
    base = np.array([7, 0, 1, 1])
    g = tg.Graph.from_csr(np.array([0, 2, 3]), base[1:], num_src=2, copy=False)
    raises(ValueError, lambda: base.__setitem__(2, 10**12), "read-only")
    same(Sum()(graph=g, src={"x": x}), dense_oracle([0, 2, 3], [0, 1, 1], x))

@case
def validate_none_then_write():
    rp, ci = np.array([0, 2, 3]), np.array([0, 1, 1])
    g = tg.Graph.from_csr(rp, ci, num_src=2, validate="none")
    ci[0] = -(10**12)     # after construction: the graph kept its own copy
    same(Sum()(graph=g, src={"x": x}), dense_oracle([0, 2, 3], [0, 1, 1], x))

@case
def coo_validate_none_then_write():
    src, dst = np.array([1, 0, 1]), np.array([0, 0, 1])
    g = tg.Graph.from_coo(src, dst, num_src=2, num_dst=2, validate="none")
    src[0] = 10**12
    same(Sum()(graph=g, src={"x": x}), np.array([5.0, 3.0]))

@case
def scipy_then_write_indices():
    import scipy.sparse as sp
    m = sp.csr_matrix((np.ones(3), np.array([0, 1, 1]), np.array([0, 2, 3])), shape=(2, 2))
    g = tg.Graph.from_scipy(m)
    m.indices[1] = 10**6
    same(Sum()(graph=g, src={"x": x}), np.array([5.0, 3.0]))

@case
def edge_index_then_write():
    ei = np.array([[0, 1, 1], [0, 0, 1]])
    g = tg.Graph.from_edge_index(ei)
    ei[0, 0] = 10**12
    same(Sum()(graph=g, src={"x": x}), np.array([5.0, 3.0]))

@case
def radius_leaves_positions_writable_and_unaffected():
    pos = np.array([[0.0, 0.0], [0.5, 0.0], [3.0, 0.0]])
    g = tg.Graph.radius(pos, 1.0)
    before = [a.copy() for a in g.resolve_csr()]
    assert pos.flags.writeable, "radius made the caller's positions read-only"
    pos[2] = [0.1, 0.0]
    g2 = tg.Graph.radius(np.array([[0.0, 0.0], [0.5, 0.0], [3.0, 0.0]]), 1.0)
    for a, b, c in zip(before, g.resolve_csr(), g2.resolve_csr()):
        assert np.array_equal(a, b) and np.array_equal(b, c), (a, b, c)

@case
def knn_leaves_query_writable():
    pos, q = np.random.default_rng(1).random((5, 2)), np.zeros((2, 2))
    tg.Graph.knn(pos, 2, query=q)
    assert pos.flags.writeable and q.flags.writeable
'''


def test_graphs_own_their_index_arrays():
    """The issue's SIGSEGV: writing the caller's col_idx after from_csr must not reach the
    kernel; copy=False freezes instead (numpy raises on the write)."""
    check_cases(GRAPHS_OWN_THEIR_INDEX_ARRAYS)


UNVALIDATED_GRAPHS_ARE_CHECKED_BEFORE_ANY_KERNEL = COMMON + '''
x = np.array([2.0, 3.0])
BAD = {
    "huge_id": ([0, 2, 3], [0, 10**12, 1], "col_idx: entry at position 1 is 1000000000000"),
    "negative_id": ([0, 2, 3], [0, -5, 1], "col_idx: entry at position 1 is -5"),
    "non_monotonic": ([0, 3, 1, 3], [0, 1, 1], "row_ptr: entry at position 2 is 1"),
    "end_mismatch": ([0, 2, 9], [0, 1, 1], "row_ptr: last entry (position 2) is 9"),
}

@case
def compiled_call():
    for name, (rp, ci, msg) in BAD.items():
        g = tg.Graph.from_csr(np.array(rp), np.array(ci), num_src=2, validate="none")
        raises(GVE, lambda: Sum()(graph=g, src={"x": x}), msg)

@case
def reference_call():
    for name, (rp, ci, msg) in BAD.items():
        g = tg.Graph.from_csr(np.array(rp), np.array(ci), num_src=2, validate="none")
        raises(GVE, lambda: Sum().reference(graph=g, src={"x": x}), msg)

@case
def grad_and_jit():
    g = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 7, 1]), num_src=2,
                          validate="basic")
    loss = lambda v: Sum()(graph=g, src={"x": v}).sum()
    raises(GVE, lambda: tg.grad(loss)(x), "col_idx: entry at position 1 is 7")
    raises(GVE, lambda: tg.jit(loss)(x), "col_idx: entry at position 1 is 7")

@case
def transpose_and_degrees():
    g = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 7, 1]), num_src=2,
                          validate="none")
    raises(GVE, lambda: g.transpose(), "col_idx: entry at position 1 is 7")
    raises(GVE, lambda: g.degrees("src"), "col_idx: entry at position 1 is 7")

@case
def unvalidated_coo():
    g = tg.Graph.from_coo(np.array([0, 5]), np.array([0, 1]), num_src=2, num_dst=2,
                          validate="none")
    raises(GVE, lambda: Sum()(graph=g, src={"x": x}), "src: entry at position 1 is 5")
'''


def test_unvalidated_graphs_are_checked_before_any_kernel():
    """validate="none" promises validity; a broken promise is a GraphValidationError at the
    first use, on every route (never a wild read)."""
    check_cases(UNVALIDATED_GRAPHS_ARE_CHECKED_BEFORE_ANY_KERNEL)
