"""Degrees of a paged relation (issue 15): counted from row ranges of the store, never the
whole CSR, by destination from row_ptr, by source from the transposed row_ptr or column ids
counted range by range. Oracle: numpy on the in-memory CSR (np.diff / np.bincount)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.core.prims.graph import degrees_p
from tiga.trace.tracer import bind
from tiga.xla_free_runtime.paging import degrees as pd
from tiga.xla_free_runtime.store import stores as store_mod

pytest.importorskip("zarr", minversion="3.1")


def store_of(path, rp, ci, n_src, chunks=2):
    """A committed store of the CSR, ingested in `chunks` row chunks."""
    n = len(rp) - 1
    cuts = np.linspace(0, n, chunks + 1).astype(int)
    with tg.store.create(path, num_src=n_src, num_dst=n, overwrite=True) as w:
        for a, b in zip(cuts[:-1], cuts[1:]):
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
    return tg.store.open(path)


def oracle(rp, ci, n_src):
    return {"dst": np.diff(rp), "src": np.bincount(ci, minlength=n_src).astype(np.int64)}


@pytest.fixture
def no_whole_csr(monkeypatch):
    """Reading the stored CSR whole (Store.read_csr, resolve_csr of a paged relation) fails
    the test; the in-memory relations of single pages resolve as usual."""
    real = tg.Graph.resolve_csr

    def refuse(*a, **k):
        raise AssertionError("the stored CSR was read whole")

    def resolve(self):
        return refuse() if self.kind == "paged" else real(self)
    monkeypatch.setattr(store_mod.Store, "read_csr", refuse)
    monkeypatch.setattr(tg.Graph, "resolve_csr", resolve)


@st.composite
def relations(draw):
    n_dst = draw(st.integers(0, 30))
    n_src = draw(st.integers(1, 25))
    skew = draw(st.sampled_from([0, 2, 9]))
    deg = draw(st.lists(st.integers(0, skew), min_size=n_dst, max_size=n_dst))
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    seed = draw(st.integers(0, 2**16))
    ci = np.random.default_rng(seed).integers(0, n_src, rp[-1]).astype(np.int32)
    return rp, ci, n_src, draw(st.integers(1, 8))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=relations(), transposed=st.booleans())
def test_paged_degrees_equal_the_in_memory_ones(tmp_path_factory, monkeypatch, case,
                                                transposed):
    rp, ci, n_src, step = case
    path = tmp_path_factory.mktemp("deg") / "s"
    store = store_of(path, rp, ci, n_src)
    if transposed:
        store.transpose()
    monkeypatch.setattr(pd, "STEP_ROWS", step)       # several ranges, ragged last one
    want = oracle(rp, ci, n_src)
    g = tg.Graph.open(path)
    assert (g.params["reader"].transposed is not None) == transposed
    for by in ("dst", "src"):
        got = g.degrees(by=by)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want[by])
    assert g._csr is None                           # nothing resolved on the way
    mem = tg.Graph.from_csr(rp, ci, num_src=n_src)
    np.testing.assert_array_equal(g.degrees("src"), mem.degrees("src"))


def _recording(monkeypatch, storage, log):
    real = storage.read_rows

    def read_rows(start, stop, out=None):
        log.append((int(start), int(stop)))
        return real(start, stop, out)
    monkeypatch.setattr(storage, "read_rows", read_rows)


def _ring(n, k):
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] * 7 + np.arange(k)) % n).reshape(-1).astype(np.int32)
    return rp, ci


def test_column_ids_are_read_in_windows_never_whole(tmp_path, monkeypatch, no_whole_csr):
    rp, ci = _ring(200, 3)
    store_of(tmp_path / "s", rp, ci, 200)
    g = tg.Graph.open(tmp_path / "s")
    reader = g.params["reader"]
    cols, ptrs = [], []
    _recording(monkeypatch, reader._col, cols)
    _recording(monkeypatch, reader._row_ptr, ptrs)
    monkeypatch.setattr(pd, "STEP_ROWS", 16)
    want = oracle(rp, ci, 200)
    np.testing.assert_array_equal(g.degrees("src"), want["src"])
    # every read of the 600 column ids is one window of at most 16, and they tile [0, 600)
    assert all(0 < b - a <= 16 for a, b in cols)
    assert sorted(cols) == [(a, min(a + 16, 600)) for a in range(0, 600, 16)]
    assert ptrs == []
    np.testing.assert_array_equal(g.degrees("dst"), want["dst"])
    assert cols[-1] == (592, 600) and len(cols) == 38     # by destination: no column read
    assert all(b - a <= 16 for a, b in ptrs) and sum(b - a for a, b in ptrs) == 201


def test_out_degrees_read_the_transposed_row_ptr_only(tmp_path, monkeypatch, no_whole_csr):
    rp, ci = _ring(120, 4)
    store_of(tmp_path / "s", rp, ci, 120).transpose()
    g = tg.Graph.open(tmp_path / "s")
    t = g.params["reader"].transposed
    cols, tcols, tptrs = [], [], []
    _recording(monkeypatch, g.params["reader"]._col, cols)
    _recording(monkeypatch, t._col, tcols)
    _recording(monkeypatch, t._row_ptr, tptrs)
    monkeypatch.setattr(pd, "STEP_ROWS", 32)
    np.testing.assert_array_equal(g.degrees("src"), oracle(rp, ci, 120)["src"])
    assert cols == [] and tcols == []
    assert all(b - a <= 32 for a, b in tptrs) and sum(b - a for a, b in tptrs) == 121


def test_degrees_inside_jit_and_grad_of_a_mean_never_read_the_csr(tmp_path, no_whole_csr):
    rp, ci = _ring(60, 3)
    store_of(tmp_path / "s", rp, ci, 60)
    g = tg.Graph.open(tmp_path / "s")
    want = oracle(rp, ci, 60)
    f = tg.jit(lambda g, x: (bind(degrees_p, g, by="src") * x, bind(degrees_p, g, by="dst")))
    x = np.random.default_rng(1).random(60)
    out_src, out_dst = f(g, x)
    np.testing.assert_allclose(np.asarray(out_src), want["src"] * x, rtol=0)
    np.testing.assert_array_equal(np.asarray(out_dst), want["dst"])

    def loss(graph):
        return lambda x: tg.math.sum(tg.propagate(
            graph, lambda s, d, e: s.x * s.x, tg.mean(), src={"x": x}) ** 2)
    xs = np.random.default_rng(2).random((60, 2))
    with tg.scope(page_rows=16), tg.profile() as prof:
        got = tg.grad(loss(g))(xs)          # the mean's VJP divides by the in-degrees
    assert prof.measured("paged")[-1].pages == 4
    # the oracle: float64 finite differences of the same loss on the in-memory relation
    mem = tg.Graph.from_csr(rp, ci, num_src=60)
    flat, eps = xs.reshape(-1), 1e-6
    fd = np.empty_like(flat)
    for i in range(len(flat)):
        up, dn = flat.copy(), flat.copy()
        up[i] += eps
        dn[i] -= eps
        fd[i] = (float(loss(mem)(up.reshape(xs.shape))) -
                 float(loss(mem)(dn.reshape(xs.shape)))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(got).reshape(-1), fd, rtol=1e-6, atol=1e-8)


def test_the_result_is_charged_to_the_host_budget_while_it_lives(tmp_path):
    rp, ci = _ring(500, 2)
    store_of(tmp_path / "s", rp, ci, 500)
    g = tg.Graph.open(tmp_path / "s")
    with tg.scope(budgets={"host": "1MB"}):
        deg = g.degrees("dst")
        assert tg.memory.report()["host"]["bytes"] == 500 * 8
        assert tg.memory.report()["host"]["peak"] == 500 * 8 + 501 * 8     # + the read buffer
        del deg
        assert tg.memory.report()["host"]["bytes"] == 0
    with tg.scope(budgets={"host": "1KB"}):
        with pytest.raises(tg.StorageError, match="host budget .* degrees of a paged"):
            g.degrees("src")
        assert tg.memory.report()["host"]["bytes"] == 0


def test_a_decreasing_row_ptr_range_is_a_storage_error(tmp_path, monkeypatch):
    rp, ci = _ring(40, 2)
    store_of(tmp_path / "s", rp, ci, 40)
    g = tg.Graph.open(tmp_path / "s")
    rows = g.params["reader"]._row_ptr
    real = rows.read_rows

    def corrupt(start, stop, out=None):
        part = real(start, stop, out).copy()
        if start <= 20 < stop:
            part[20 - start] = 0
        return part
    monkeypatch.setattr(rows, "read_rows", corrupt)
    monkeypatch.setattr(pd, "STEP_ROWS", 8)
    with pytest.raises(tg.StorageError, match=r"row_ptr check failed in rows \[16:24\)"):
        g.degrees("dst")
