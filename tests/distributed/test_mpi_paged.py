"""Under mpiexec (2 or 3 ranks): a store-backed partition made under a host budget too small
for a rank's local CSR pages the rank's own relations (a rank-private store, read page by
page). Oracles: the same program over the global in-memory graph in one process (forward
and tg.grad), and the in-memory partition of the same store (plan, local CSR, edge order)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.distributed import graph as dgraph
from tiga.xla_free_runtime.store import stores as tstore

from ._mpi import needs_mpiexec
from .test_mpi_equivalence import _call, _layer

pytestmark = [needs_mpiexec, pytest.mark.mpi]

PAGE_ROWS = 8


def _problem(n=96, seed=40, f=3):
    """A ring band (interior rows under a row split) plus random long edges (ghosts), in
    storage order = edge order (the store's edge ids are the graph's)."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    dst = np.concatenate([i, i, i, rng.integers(0, n, n // 2)])
    src = np.concatenate([(i - 1) % n, (i + 1) % n, (i + 2) % n, rng.integers(0, n, n // 2)])
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    rp, col = g.resolve_csr()
    g = tg.Graph.from_csr(rp, col, num_src=n)
    data = {"x": rng.standard_normal((n, f)), "h": rng.standard_normal((n, f)),
            "w": rng.standard_normal((g.num_edges, 1)), "pos": rng.standard_normal((n, 2))}
    return g, data


def _shared_dir(tmp_path_factory, comm):
    """One directory every rank sees (rank 0's, broadcast)."""
    path = str(tmp_path_factory.mktemp("paged")) if comm.rank == 0 else None
    return comm.raw.bcast(path, root=0)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    comm = tg.distributed.init()
    g, d = _problem()
    path = f"{_shared_dir(tmp_path_factory, comm)}/s"
    if comm.rank == 0:
        rp, col = g.resolve_csr()
        with tg.store.create(path, num_src=g.num_src, num_dst=g.num_dst) as w:
            for a in range(0, g.num_dst, 10):
                b = min(a + 10, g.num_dst)
                w.append_csr_chunk(rp[a:b + 1] - rp[a], col[rp[a]:rp[b]])
    comm.raw.Barrier()
    return g, d, path


@pytest.fixture
def page_reads(monkeypatch, tmp_path):
    """Every row-range read of a store: {store path: [rows read]}; a whole-CSR read fails.
    (The rank-local store's transposed relation, for source cotangents, is built by the
    paging layer in its own bounded buckets.)"""
    reads: dict = {}
    original = tstore.Store.read_rows

    def read_rows(self, a, b, out=(None, None)):
        reads.setdefault(str(self.path), []).append(b - a)
        return original(self, a, b, out)

    monkeypatch.setattr(tstore.Store, "read_rows", read_rows)
    monkeypatch.setattr(tstore.Store, "read_csr",
                        lambda self: pytest.fail(f"{self.path}: a CSR was read whole"))
    monkeypatch.setattr(dgraph, "INTERIOR_CHUNK_EDGES", 16)   # several interior chunks
    with tg.scope(page_rows=PAGE_ROWS, spill_dir=tmp_path):
        yield reads


def _partition(path, method, d, budget="2KiB"):
    with tg.scope(budgets={"host": budget}):
        return tg.distributed.partition(
            tg.Graph.open(path), method=method,
            positions=d["pos"] if method == "spatial" else None)


@pytest.mark.parametrize("method", ["rows", "edges", "spatial"])
def test_paged_partition_matches_one_process(stored, page_reads, method):
    g, d, path = stored
    dg = _partition(path, method, d)
    assert dg.paged and dg.full.kind == dg.interior.kind == dg.boundary.kind == "paged"
    assert len(dg.interior_chunks) > 1 or dg.plan.interior_edges < 32
    assert max(page_reads[path]) <= PAGE_ROWS       # never the rank's whole CSR
    layer = _layer("max")
    xl, w = dg.local(d["x"]), dg.local_edges(d["w"])
    y = _call(layer, dg, xl, dg.local(d["h"]), w)
    want = _call(layer, g, d["x"], d["h"], d["w"])
    np.testing.assert_allclose(dg.gather(np.asarray(y)), np.asarray(want), rtol=1e-12)
    assert max(page_reads[str(dg.local_store.path)]) <= PAGE_ROWS     # paged launches
    for name in ("sum", "mean"):
        layer = _layer(name)

        def loss(x, h, ww, graph, layer=layer):
            return (_call(layer, graph, x, h, ww) ** 2).sum()

        gx, gh, gw = tg.grad(loss, argnums=(0, 1, 2))(xl, dg.local(d["h"]), w, dg)
        want = tg.grad(loss, argnums=(0, 1, 2))(d["x"], d["h"], d["w"], g)
        np.testing.assert_allclose(dg.gather(np.asarray(gx)), want[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(dg.gather(np.asarray(gh)), want[1], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.asarray(gw), dg.local_edges(want[2]), rtol=1e-9,
                                   atol=1e-12)
    assert max(page_reads[path]) <= PAGE_ROWS


def test_paged_local_store_is_the_in_memory_plan(stored, page_reads):
    g, d, path = stored
    dg = _partition(path, "rows", d)
    ref = _partition(path, "rows", d, budget="1GiB")       # room: read at once
    assert dg.paged and not ref.paged
    p, q = dg.plan, ref.plan
    for field in ("owned", "ghosts", "row_ptr"):
        np.testing.assert_array_equal(getattr(p, field), getattr(q, field))
    assert (p.n_interior, p.recv) == (q.n_interior, q.recv)
    assert [(r, s.tolist()) for r, s in p.send] == [(r, s.tolist()) for r, s in q.send]
    local = dg.full.params["reader"]
    rp, col, first = local.read_rows(0, local.num_dst)
    assert first == 0
    np.testing.assert_array_equal(rp, q.row_ptr)
    np.testing.assert_array_equal(col, q.col_idx)
    np.testing.assert_array_equal(dg.local_edges(d["w"]), ref.local_edges(d["w"]))
    np.testing.assert_array_equal(dg.degrees("src"), ref.degrees("src"))
    np.testing.assert_array_equal(dg.degrees("src"), g.degrees("src")[dg.owned])


def test_paged_local_store_is_deleted_with_the_graph(stored, page_reads, tmp_path):
    g, d, path = stored
    dg = _partition(path, "rows", d)
    where = dg.local_store.path
    assert where.exists() and where.parent == tmp_path
    y = _call(_layer("sum"), dg, dg.local(d["x"]), dg.local(d["h"]), dg.local_edges(d["w"]))
    assert np.asarray(y).shape[0] == dg.plan.n_owned
    del dg
    gc.collect()
    assert not where.exists()


def test_paged_partition_that_fails_leaves_no_store(stored, page_reads, monkeypatch,
                                                   tmp_path):
    g, d, path = stored

    def broken(self, *args, **kwargs):
        raise tg.StorageError("disk full (on purpose)")

    monkeypatch.setattr(tstore.StoreWriter, "append_field", broken)   # every rank fails
    with pytest.raises(tg.StorageError, match="on purpose"):
        _partition(path, "rows", d)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tiga-dist-")]
