"""Partitioning and halo plans without MPI: every rank's plan is built in one process and
checked against the global CSR (the oracle) and against the other ranks' plans."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.distributed.halo import build_plan
from tiga.xla_free_runtime.distributed.partition import owners


@st.composite
def graphs(draw):
    n = draw(st.integers(0, 30))
    e = draw(st.integers(0, 4 * n)) if n else 0
    src = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e))
    g = tg.Graph.from_coo(np.array(src, np.int64), np.array(dst, np.int64), num_src=n,
                          num_dst=n)
    return g, draw(st.integers(1, 5)), draw(st.sampled_from(["rows", "edges", "spatial"]))


def _global_edges(g):
    """{global edge id: (dst, src)} from the global relation (edge order = edge ids)."""
    ei = g.to_edge_index()
    return {k: (int(ei[1, k]), int(ei[0, k])) for k in range(ei.shape[1])}


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_plans_cover_the_graph_and_match_across_ranks(case):
    g, size, method = case
    row_ptr, col_idx = g.resolve_csr()
    pos = np.random.default_rng(0).standard_normal((g.num_dst, 3))
    owner = owners(row_ptr, size, method, pos if method == "spatial" else None)
    assert owner.shape == (g.num_dst,) and (owner >= 0).all() and (owner < size).all()
    plans = [build_plan(row_ptr, col_idx, g.edge_perm, owner, r) for r in range(size)]
    # every destination row is owned once; every edge is local to its destination's owner
    assert sorted(np.concatenate([p.owned for p in plans]).tolist()) == list(range(g.num_dst))
    assert sorted(np.concatenate([p.edge_ids for p in plans]).tolist()) == \
        list(range(g.num_edges))
    edges = _global_edges(g)
    for p in plans:
        ids = np.concatenate([p.owned, p.ghosts])
        dst_local = np.repeat(np.arange(p.n_owned), np.diff(p.row_ptr))
        for k, eid in enumerate(p.edge_ids):
            assert edges[int(eid)] == (int(p.owned[dst_local[k]]), int(ids[p.col_idx[k]]))
        # interior rows read owned sources only; boundary rows read at least one ghost
        ni = p.interior_edges
        assert (p.col_idx[:ni] < p.n_owned).all()
        for r in range(p.n_interior, p.n_owned):
            assert (p.col_idx[p.row_ptr[r]:p.row_ptr[r + 1]] >= p.n_owned).any()
        assert (owner[p.ghosts] != p.rank).all()
    # what rank q receives from r is exactly what r sends to q, in the same order
    for q, pq in enumerate(plans):
        for r, a, b in pq.recv:
            sent = dict(plans[r].send)[q]
            assert np.array_equal(plans[r].owned[sent], pq.ghosts[a:b])
        for r, _ in pq.send:
            assert any(rr == q for rr, _, _ in plans[r].recv)


def test_rows_and_edges_are_contiguous_and_balanced():
    row_ptr = np.array([0, 10, 10, 10, 10, 20, 21, 22, 23], np.int64)   # skewed degrees
    by_rows = owners(row_ptr, 2, "rows")
    assert by_rows.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    by_edges = owners(row_ptr, 2, "edges")
    assert (np.diff(by_edges) >= 0).all()
    work = [int(np.diff(row_ptr)[by_edges == r].sum() + (by_edges == r).sum()) for r in (0, 1)]
    assert abs(work[0] - work[1]) <= 11      # one row of 10 edges at most off balance


def test_spatial_is_recursive_coordinate_bisection():
    pos = np.array([[x, y] for x in range(8) for y in range(2)], np.float64)   # 8 x 2 strip
    owner = owners(np.zeros(len(pos) + 1, np.int64), 4, "spatial", pos)
    for r in range(4):     # 4 boxes cut along x (the longest extent): x in [2r, 2r + 1]
        assert sorted(set(pos[owner == r, 0].tolist())) == [2 * r, 2 * r + 1]


def test_partition_arguments_are_checked():
    row_ptr = np.zeros(4, np.int64)
    with pytest.raises(tg.GraphValidationError, match="method"):
        owners(row_ptr, 2, "metis")
    with pytest.raises(tg.GraphValidationError, match="positions"):
        owners(row_ptr, 2, "spatial")
    with pytest.raises(tg.ShapeError, match=r"positions: expected shape \(3, dims\)"):
        owners(row_ptr, 2, "spatial", np.zeros((2, 2)))
    with pytest.raises(tg.GraphValidationError, match="positions: only method='spatial'"):
        owners(row_ptr, 2, "rows", np.zeros((3, 2)))


def test_import_tiga_does_not_import_mpi4py():
    import subprocess
    import sys

    code = "import sys, tiga; assert 'mpi4py' not in sys.modules; print(tiga.distributed.init)"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 40), st.integers(1, 5), st.floats(0.05, 0.6), st.booleans(),
       st.integers(0, 2 ** 31))
def test_radius_plans_cover_the_relation_and_match_across_ranks(n, size, cutoff, loop, seed):
    from tiga.xla_free_runtime.distributed.generated import radius_plan

    rng = np.random.default_rng(seed)
    pos = np.round(rng.random((n, 2)), 1)        # a coarse grid: ties and coincident points
    g = tg.Graph.radius(pos, cutoff, loop=loop)
    row_ptr, col = g.resolve_csr()                # the oracle: one process's relation
    owner = owners(np.zeros(n + 1, np.int64), size, "spatial", pos)
    plans = [radius_plan(g, owner, r, size, lambda mine, counts: np.diff(row_ptr))[0]
             for r in range(size)]
    got = {}
    for p in plans:
        ids = np.concatenate([p.owned, p.ghosts])
        dst = np.repeat(p.owned, np.diff(p.row_ptr))
        for k, eid in enumerate(p.edge_ids):
            got[int(eid)] = (int(dst[k]), int(ids[p.col_idx[k]]))
        assert (p.col_idx[:p.interior_edges] < p.n_owned).all()
        assert (owner[p.ghosts] != p.rank).all()
    want = {k: (int(d), int(s)) for k, (d, s) in
            enumerate(zip(np.repeat(np.arange(n), np.diff(row_ptr)), col))}
    assert got == want
    for q, pq in enumerate(plans):
        for r, a, b in pq.recv:
            assert np.array_equal(plans[r].owned[dict(plans[r].send)[q]], pq.ghosts[a:b])
        for r, _ in pq.send:
            assert any(rr == q for rr, _, _ in plans[r].recv)


class _Wanted(Exception):
    pass


@settings(max_examples=30, deadline=None)
@given(graphs())
def test_store_plans_match_the_in_memory_plans(case):
    """A store-backed plan (each rank reads its own rows, ghost ids exchanged) equals the
    plan built from the whole CSR; ranks are simulated in one process (two passes)."""
    from tiga.xla_free_runtime.distributed.stored import store_ownership, store_plan

    g, size, method = case
    row_ptr, col = g.resolve_csr()
    row_ptr = np.asarray(row_ptr, np.int64)
    pos = np.random.default_rng(1).standard_normal((g.num_dst, 2))
    reads = []

    class Reader:       # the Store reader's row-range interface over the in-memory CSR
        num_dst, num_edges = g.num_dst, g.num_edges
        fields = {"pos": {"role": "dst"}}

        def read_rows(self, a, b):
            reads.append((a, b))
            return row_ptr[a:b + 1] - row_ptr[a], col[row_ptr[a]:row_ptr[b]], row_ptr[a]

        def page_bounds(self, page_rows):
            assert page_rows == 1
            return row_ptr

        def __getitem__(self, name):
            assert name == "pos"
            return pos

    reader = Reader()
    own = store_ownership(reader, size, method, "pos" if method == "spatial" else None)
    wanted = {}

    def record(r):
        def exchange(per_peer):
            wanted[r] = per_peer
            raise _Wanted
        return exchange

    for r in range(size):
        with pytest.raises(_Wanted):
            store_plan(reader, own, r, record(r))
    owner = own.of(np.arange(g.num_dst))
    assert np.array_equal(owner, owners(row_ptr, size, method,
                                        pos if method == "spatial" else None))
    for r in range(size):      # a store keeps the CSR's storage order: no edge_perm
        reads.clear()
        plan = store_plan(reader, own, r, lambda _, r=r: [wanted[q][r] for q in range(size)])
        # only this rank's rows were read, each once, as runs of consecutive ids
        got = np.concatenate([np.arange(a, b) for a, b in reads] + [np.zeros(0, int)])
        assert got.tolist() == np.flatnonzero(owner == r).tolist()
        ref = build_plan(row_ptr, col, None, owner, r)
        for field in ("owned", "ghosts", "row_ptr", "col_idx", "edge_ids"):
            assert np.array_equal(getattr(plan, field), getattr(ref, field)), field
        assert plan.n_interior == ref.n_interior and plan.recv == ref.recv
        assert [q for q, _ in plan.send] == [q for q, _ in ref.send]
        for (_, a), (_, b) in zip(plan.send, ref.send):
            assert np.array_equal(a, b)


def test_store_positions_are_checked():
    from tiga.xla_free_runtime.distributed.stored import check_store_method, store_positions

    class Reader:
        fields = {"x": {"role": "src"}, "w": {"role": "edge"}}

    with pytest.raises(tg.GraphValidationError, match="positions: method='spatial'"):
        check_store_method("spatial", None)
    with pytest.raises(tg.GraphValidationError, match="only method='spatial'"):
        check_store_method("rows", "x")
    with pytest.raises(tg.GraphValidationError, match="no field 'p'"):
        store_positions(Reader(), "p")
    with pytest.raises(tg.GraphValidationError, match="role 'edge'"):
        store_positions(Reader(), "w")


def test_benchmark_lattice_model_matches_the_partitioner():
    """benchmarks/distributed.py projects with lattice box counts: they must be what the
    real partitioner and halo plans give (power-of-two ranks on a cube cut whole planes)."""
    import importlib.util
    import sys
    from pathlib import Path

    where = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(where))         # its workloads package
    try:
        spec = importlib.util.spec_from_file_location("bench_distributed",
                                                      where / "distributed.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        rows = bench.check_lattice_model(8)
    finally:
        sys.path.remove(str(where))
    for row in rows:
        assert row["real"] == {k: int(v) for k, v in row["lattice"].items()}, row
    stats = bench.box_stats(8, 1)
    assert stats["edges"][0] == 26 * 6 ** 3 + 8 * 7 + 12 * 6 * 11 + 6 * 36 * 17
    assert stats["ghosts"][0] == 0 and stats["peers"][0] == 0
