"""Fields over the host budget on a relation held in memory run by pages (API.md section 7:
"a program called on a paged graph (or on fields whose bytes exceed the host budget) runs
page by page"). Oracle: the reference interpreter on the same relation and numpy fields."""
from __future__ import annotations

import contextvars
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.paging.buffers import PageBuffers

pytest.importorskip("zarr", minversion="3.1")

REDUCERS = {"sum": tg.sum, "mean": tg.mean, "max": tg.max, "min": tg.min, "prod": tg.prod}
WIDTH = 32      # float64 features: the disk fields dominate a page's bookkeeping


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.b


class Softmax(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((edge.w * dst.b).sum(), src.x)


class Gather(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x


def _model(reducer):
    model = Softmax() if reducer == "softmax" else Weighted()
    if reducer not in ("softmax",):
        model.reducer = REDUCERS[reducer]()
    return model


@st.composite
def relations(draw):
    """(relation held in memory, its numpy fields): CSR order, or an edge list in shuffled
    order (the relation stores its edges out of id order: edge_perm)."""
    n_dst, n_src = draw(st.integers(1, 20)), draw(st.integers(1, 24))
    deg = draw(st.lists(st.integers(0, 6), min_size=n_dst, max_size=n_dst))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    ci = rng.integers(0, n_src, rp[-1]).astype(np.int32)
    if draw(st.booleans()):
        g = tg.Graph.from_csr(rp, ci, num_src=n_src)
    else:
        dst = np.repeat(np.arange(n_dst), deg)
        order = rng.permutation(len(ci))
        g = tg.Graph.from_coo(ci[order], dst[order], num_src=n_src, num_dst=n_dst)
    x = rng.random((n_src, WIDTH)) + 0.5
    b = rng.random((n_dst, WIDTH))
    w = rng.random((g.num_edges, WIDTH)) + 0.5
    return g, x, b, w


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(case=relations(), reducer=st.sampled_from(sorted(REDUCERS) + ["softmax"]),
       page=st.integers(1, 3))
def test_fields_over_the_budget_run_by_pages_and_equal_the_reference(tmp_path_factory, case,
                                                                      reducer, page):
    g, x, b, w = case
    model = _model(reducer)
    want = np.asarray(model.reference(graph=g, src={"x": x}, dst={"b": b}, edge={"w": w}))
    spill = tmp_path_factory.mktemp("spill")
    with tg.scope(spill_dir=spill):
        fields = [tg.asarray(a).to("disk") for a in (x, b, w)]
    over = sum(a.nbytes for a in (x, b, w)) + want.nbytes - 1      # one byte short
    with tg.scope(budgets={"host": over}, page_rows=page, spill_dir=spill), \
            tg.profile() as prof:
        try:
            got = model(graph=g, src={"x": fields[0]}, dst={"b": fields[1]},
                        edge={"w": fields[2]})
        except tg.StorageError as exc:       # a page of this relation needs more than that
            assert "for page" in str(exc)
            reject()
        assert tg.memory.report()["host"]["peak"] <= over
    stats = prof.measured("paged")[-1]
    assert stats.pages == -(-g.num_dst // page)
    assert stats.bytes_read["disk"] > 0
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def ring(n, k=4):
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    return rp, ci


def test_result_past_the_budget_goes_to_disk_and_a_roomy_budget_runs_in_memory(tmp_path):
    rp, ci = ring(4000)
    g = tg.Graph.from_csr(rp, ci)
    x = np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8) % 97
    want = np.asarray(Gather().reference(graph=g, src={"x": x}))
    with tg.scope(spill_dir=tmp_path):
        xd = tg.asarray(x).to("disk")
    with tg.scope(budgets={"host": "100KB"}, page_rows=500, spill_dir=tmp_path), \
            tg.profile() as prof:
        y = Gather()(graph=g, src={"x": xd})       # x and the result: 128000 bytes each
        assert y.tier == "disk"
        assert 0 < tg.memory.report()["host"]["peak"] <= 100_000
        np.testing.assert_array_equal(y.numpy(), want)
    stats = prof.measured("paged")[-1]
    assert stats.pages == 8 and stats.result_tier == "disk"
    assert stats.bytes_read["disk"] >= x.nbytes and stats.bytes_read["host"] > 0   # (the CSR)
    assert "8 page(s) x 500 rows" not in str(Gather().explain(graph=g, src={"x": xd}))
    with tg.scope(budgets={"host": "100KB"}, page_rows=500, spill_dir=tmp_path):
        text = str(Gather().explain(run=True, graph=g, src={"x": xd}))
    assert "exceed the host budget" in text and "8 page(s) x 500 rows" in text
    g2 = tg.Graph.from_csr(rp, ci)
    with tg.scope(budgets={"host": "1MB"}, page_rows=500, spill_dir=tmp_path), \
            tg.profile() as prof:
        y = Gather()(graph=g2, src={"x": xd})      # fits: the in-memory route
        np.testing.assert_array_equal(np.asarray(y), want)
    assert prof.measured("paged") == []


@pytest.mark.parametrize("shuffled", [False, True])
def test_grad_with_disk_fields_over_the_budget_matches_in_memory(tmp_path, shuffled):
    """vjp with the source field on disk past the budget: the forward runs by pages, and
    every cotangent equals the in-memory one, over a relation storing its edges in id order
    or not (edge-grouped cotangents of the latter stay in memory: pages write edge rows in
    stored order)."""
    rp, ci = ring(600, 3)
    g = tg.Graph.from_csr(rp, ci)
    if shuffled:
        order = np.random.default_rng(1).permutation(len(ci))
        g = tg.Graph.from_coo(ci[order], np.repeat(np.arange(600), 3)[order], num_src=600,
                              num_dst=600)
        assert g.edge_perm is not None
    rng = np.random.default_rng(5)
    x, b, w = rng.random((600, 16)), rng.random((600, 16)), rng.random((1800, 16)) + 0.5

    def f(x, b, w):
        return Weighted()(graph=g, src={"x": x}, dst={"b": b}, edge={"w": w})
    want_y, want_back = tg.vjp(f, x, b, w)
    with tg.scope(spill_dir=tmp_path):
        xd = tg.asarray(x).to("disk")
    with tg.scope(budgets={"host": "150KB"}, page_rows=64, spill_dir=tmp_path), \
            tg.profile() as prof:
        y, back = tg.vjp(f, xd, b, w)
        assert prof.measured("paged")[-1].pages == -(-600 // 64)     # the forward
        got = back(np.asarray(want_y))
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-12, atol=1e-12)
    for a, e in zip(got, want_back(want_y)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-12, atol=1e-12)


def test_sets_growing_at_once_never_count_on_the_same_free_bytes():
    """Two loaders making sets at once would both count on the same free bytes: a growing
    set reserves its page's estimate, so the second waits until the first has made its
    buffers and given back what it did not use; with room for both, both go at once."""
    stop = threading.Event()
    with tg.scope(budgets={"host": 10_000}):
        bufs = PageBuffers(4)
        first = bufs.acquire(6000, stop, 0)           # 6000 reserved: 4000 left
        got = []
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(lambda: got.append(
            bufs.acquire(6000, stop, 1)),))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not got
        first.get("x", 300, (1,), np.float64, "x")    # 2696 bytes with slack, drawn
        assert tg.memory.report()["host"]["bytes"] == 6000     # counted once
        bufs.settled(first)                           # the unused reservation goes back
        t.join(5)
        assert got and got[0] is not first
        assert tg.memory.report()["host"]["peak"] <= 10_000
        bufs.settled(got[0])
        bufs.close()
    bufs = PageBuffers(4)                             # no budget: nothing waits
    a, b = bufs.acquire(100, stop, 0), bufs.acquire(100, stop, 1)
    assert a is not b
    bufs.close()


def test_buffer_sets_are_taken_in_launch_order():
    """The page the computing thread waits for next is never starved by later pages: a set
    for launch position 1 is handed out only after position 0 has taken one."""
    bufs = PageBuffers(4)
    stop = threading.Event()
    got = []
    t = threading.Thread(target=lambda: got.append(bufs.acquire(100, stop, 1)))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not got          # position 0 has not asked yet
    first = bufs.acquire(100, stop, 0)
    bufs.settled(first)
    t.join(5)
    assert got and got[0] is not first
    stop.set()
    assert bufs.acquire(100, stop, 5) is None      # a stopping run is never kept waiting
    bufs.close()


def test_a_free_set_grows_only_within_the_budget():
    """A free set too small for the next page grows only while the budget has room (other
    idle sets give theirs back first); meanwhile a busy set's bytes are never counted twice,
    so two loaders reusing sets cannot overrun the budget together (the race that made a
    paged VJP fail now and then with 'cannot hold a request ... for page N results')."""
    stop = threading.Event()
    with tg.scope(budgets={"host": 10_000}):
        bufs = PageBuffers(3)
        a = bufs.acquire(4000, stop, 0)
        a.get("x", 400, (1,), np.float64, "x")            # 3600 bytes with slack
        bufs.settled(a)
        b = bufs.acquire(4000, stop, 1)
        b.get("x", 400, (1,), np.float64, "x")
        bufs.settled(b)
        bufs.release(a)                                   # `a` idle, `b` busy: 7200 held
        got = []
        ctx = contextvars.copy_context()    # (the scope, as the paged run's loaders see it)
        t = threading.Thread(target=ctx.run, args=(lambda: got.append(bufs.acquire(7000, stop,
                                                                                 2)),))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not got     # growing `a` by 3400 needs `b`'s bytes back
        bufs.release(b)                     # `b` idle: it gives its buffers back, `a` grows
        t.join(5)
        assert got and got[0] is a and b.held() == 0
        a.get("x", 800, (1,), np.float64, "x")            # 7200 bytes: fits now
        bufs.settled(a)
        assert tg.memory.report()["host"]["peak"] <= 10_000
        bufs.close()
