"""Paged execution over stored relations (API.md section 7): every reducer, page sizes 1..N,
fields on the host and disk tiers, results on disk past the host budget, explain(), grads,
Ctrl-C. Oracle: the reference interpreter on the same relation held in memory."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
from tiga.xla_free_runtime.paging import handlers
from tiga.xla_free_runtime.paging import pages as paging
from tiga.xla_free_runtime.paging import run as paging_run
from tiga.xla_free_runtime.paging.distinct import distinct
from tiga.xla_free_runtime.reports.progress import progress_bar

pytest.importorskip("zarr", minversion="3.1")

REDUCERS = {"sum": tg.sum, "mean": tg.mean, "max": tg.max, "min": tg.min, "prod": tg.prod}


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.b


class Softmax(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((edge.w * dst.b).sum(), src.x)


def _combine(a, b):
    return a + 2.0 * b


def store_of(path, rp, ci, n_src, fields=()):
    n = len(rp) - 1
    with tg.store.create(path, num_src=n_src, num_dst=n, overwrite=True) as w:
        half = n // 2
        w.append_csr_chunk(rp[:half + 1], ci[:rp[half]])
        w.append_csr_chunk(rp[half:] - rp[half], ci[rp[half]:])
        for name, rows, role in fields:
            w.append_field(name, rows, role=role)
    return tg.store.open(path)


@st.composite
def graphs(draw):
    n_dst = draw(st.integers(0, 24))
    n_src = draw(st.integers(1, 30))
    skew = draw(st.sampled_from([0, 3, 12]))
    deg = draw(st.lists(st.integers(0, skew), min_size=n_dst, max_size=n_dst))
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    seed = draw(st.integers(0, 2**16))
    ci = np.random.default_rng(seed).integers(0, n_src, rp[-1]).astype(np.int32)
    page = draw(st.integers(1, max(n_dst, 1)))
    return rp, ci, n_src, page, seed


@settings(max_examples=14, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=graphs(), reducer=st.sampled_from(sorted(REDUCERS) + ["softmax", "user"]),
       tiers=st.tuples(*[st.sampled_from(["host", "disk", "store"])] * 3))
def test_paged_equals_in_memory(tmp_path_factory, case, reducer, tiers):
    rp, ci, n_src, page, seed = case
    rng = np.random.default_rng(seed)
    x = rng.random((n_src, 2)) + 0.5
    b = rng.random((len(rp) - 1, 1))
    w = rng.random((len(ci), 1)) + 0.5
    path = tmp_path_factory.mktemp("paged")
    store = store_of(path / "s", rp, ci, n_src,
                     [("x", x, "src"), ("b", b, "dst"), ("w", w, "edge")])
    fields = {}
    for (name, arr), tier in zip((("x", x), ("b", b), ("w", w)), tiers):
        fields[name] = arr if tier == "host" else tg.asarray(arr).to("disk") \
            if tier == "disk" else store[name]
    model = Softmax() if reducer == "softmax" else Weighted()
    if reducer == "user":
        model.reducer = tg.Reducer("twice", 0.0, combine=_combine)
    elif reducer != "softmax":
        model.reducer = REDUCERS[reducer]()
    mem = tg.Graph.from_csr(rp, ci, num_src=n_src)
    want = model.reference(graph=mem, src={"x": x}, dst={"b": b}, edge={"w": w})
    with tg.scope(page_rows=page, spill_dir=path / "spill"):
        got = model(graph=tg.Graph.open(path / "s"), src={"x": fields["x"]},
                    dst={"b": fields["b"]}, edge={"w": fields["w"]})
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def ring(n, k=4):
    """Destination i reads i+1..i+k mod n (the benchmark's periodic CSR, smaller)."""
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    return rp, ci


class Gather(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x


def test_result_goes_to_disk_past_the_host_budget_and_the_budget_holds(tmp_path):
    rp, ci = ring(4000)
    x = np.arange(4000 * 8, dtype=np.float32).reshape(4000, 8) % 97
    store = store_of(tmp_path / "s", rp, ci, 4000, [("x", x, "src")])
    g = tg.Graph.open(tmp_path / "s")
    want = np.asarray(Gather().reference(graph=tg.Graph.from_csr(rp, ci), src={"x": x}))
    with tg.scope(budgets={"host": "100KB"}, page_rows=500, spill_dir=tmp_path / "sp"), \
            tg.profile() as prof:
        y = Gather()(graph=g, src={"x": store["x"]})       # the result is 128000 bytes
        assert y.tier == "disk"
        rep = tg.memory.report()
        assert 0 < rep["host"]["peak"] <= 100_000
        assert rep["disk"]["bytes"] == 4000 * 8 * 4
        np.testing.assert_array_equal(y[1000:1500].numpy(), want[1000:1500])
        stats = prof.measured("paged")[-1]
        assert stats.pages == 8 and stats.result_tier == "disk"
        assert stats.bytes_written == {"host": 0, "disk": 128000}
    with tg.scope(budgets={"host": "1MB"}, page_rows=500):
        y = Gather()(graph=g, src={"x": x})
        assert y.tier == "host"
        np.testing.assert_array_equal(y.numpy(), want)
        assert tg.memory.report()["host"]["bytes"] == 128000     # the result, counted
    with tg.scope(budgets={"host": "1KB"}, page_rows=500):
        with pytest.raises(tg.StorageError, match="host budget .* for page 0 buffers"):
            Gather()(graph=g, src={"x": x})


def test_each_distinct_source_is_gathered_once(tmp_path, monkeypatch):
    # (pages read into buffers; a run that maps them reads sources in place, no gather)
    monkeypatch.setattr(disk_mod.DiskStorage, "can_map", lambda self: False)
    rp, ci = ring(1000, k=8)
    x = np.ones((1000, 4), np.float32)
    store_of(tmp_path / "s", rp, ci, 1000)
    g = tg.Graph.open(tmp_path / "s")
    with tg.scope(page_rows=100), tg.profile() as prof:
        Gather()(graph=g, src={"x": x})
    s = prof.measured("paged")[-1]
    assert (s.pages, s.page_rows, s.edges) == (10, 100, 8000)
    assert s.distinct_sources == 10 * 107                 # rows i+1 .. i+107 per page
    assert s.bytes_read["host"] == 10 * 107 * 16
    assert s.bytes_read["disk"] == 10 * (101 * 8 + 800 * 4)


def test_explain_reports_the_page_plan_and_what_its_run_measured(tmp_path):
    rp, ci = ring(300)
    x = np.ones((300, 2))
    store_of(tmp_path / "s", rp, ci, 300)
    g = tg.Graph.open(tmp_path / "s")
    with tg.scope(page_rows=64):
        before = str(Gather().explain(graph=g, src={"x": x}))
        Gather()(graph=g, src={"x": x})
        plain = str(Gather().explain(graph=g, src={"x": x}))
        after = str(Gather().explain(run=True, graph=g, src={"x": x}))
    assert "paged (5 page(s) of 64 destination rows" in before
    assert "run not measured: explain(..., run=True)" in before
    assert "last run" not in plain          # a call leaves nothing on the relation
    assert "last run 5 page(s) x 64 rows, 1200 edges, distinct-source ratio" in after
    for word in ("read host", "disk", "written host", "overlapped", "gather", "compute"):
        assert word in after


def test_grad_through_a_paged_program_matches_in_memory(tmp_path):
    rp, ci = ring(50, k=3)
    rng = np.random.default_rng(0)
    x, w = rng.random((50, 2)), rng.random((150, 1))
    store_of(tmp_path / "s", rp, ci, 50)
    g, mem = tg.Graph.open(tmp_path / "s"), tg.Graph.from_csr(rp, ci)

    def loss(graph):
        def f(x, w):
            return tg.math.sum(Weighted()(graph=graph, src={"x": x}, dst={"b": np.zeros(
                (50, 1))}, edge={"w": w}) ** 2)
        return f
    with tg.scope(page_rows=7):
        got = tg.grad(loss(g), argnums=(0, 1))(x, w)
    want = tg.grad(loss(mem), argnums=(0, 1))(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)


@pytest.mark.parametrize("result_chunk_rows", [None, 100],
                         ids=["one writer", "two writers (whole chunks)"])
def test_ctrl_c_stops_cleanly(tmp_path, monkeypatch, result_chunk_rows):
    from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
    rp, ci = ring(2000)
    x = np.ones((2000, 2))
    store_of(tmp_path / "s", rp, ci, 2000)
    g = tg.Graph.open(tmp_path / "s")
    if result_chunk_rows:           # (the result's chunks: one a page)
        monkeypatch.setattr(disk_mod, "CHUNK_BYTES", result_chunk_rows * 2 * 8)
    calls = []
    real = handlers.run_propagate

    def interrupted(*a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(handlers, "run_propagate", interrupted)
    spill = tmp_path / "spill"
    with tg.scope(page_rows=100, spill_dir=spill, budgets={"host": "20KB"}):
        with pytest.raises(KeyboardInterrupt):
            Gather()(graph=g, src={"x": x})                  # the result would go to disk
        assert tg.memory.report()["host"]["bytes"] == 0     # page buffers given back
    assert list(spill.iterdir()) == []
    monkeypatch.setattr(handlers, "run_propagate", real)
    np.testing.assert_array_equal(tg.store.open(tmp_path / "s").read_csr()[1], ci)
    with tg.scope(page_rows=100):
        y = Gather()(graph=g, src={"x": x})
    np.testing.assert_array_equal(np.asarray(y), np.full((2000, 2), 4.0))


def test_field_with_the_wrong_length_is_a_shape_error(tmp_path):
    rp, ci = ring(30)
    store_of(tmp_path / "s", rp, ci, 30)
    with pytest.raises(tg.ShapeError, match="src.x"):
        Gather()(graph=tg.Graph.open(tmp_path / "s"), src={"x": np.ones((29, 2))})


def test_page_tasks_cover_the_rows():
    tasks = paging.page_tasks(10, np.array([0, 3, 9, 12]), 4)
    assert [(t.rows, t.edges) for t in tasks] == [((0, 4), (0, 3)), ((4, 8), (3, 9)),
                                                  ((8, 10), (9, 12))]


def test_progress_bars_follow_the_config_flag(monkeypatch):
    monkeypatch.setattr(tg.config, "progress", False)
    assert progress_bar(100, "tg paged run", "pages") is None
    monkeypatch.setattr(tg.config, "progress", True)
    bar = progress_bar(100, "tg paged run", "pages")
    assert bar is not None and bar.total == 100     # shown only after ~2 s (tqdm delay)
    bar.close()


@pytest.mark.parametrize("reducer", sorted(REDUCERS) + ["softmax"])
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=graphs(), src_tier=st.sampled_from(["host", "store"]))
def test_paged_grad_equals_in_memory_grad(tmp_path_factory, case, reducer, src_tier):
    rp, ci, n_src, page, seed = case
    rng = np.random.default_rng(seed)
    x = rng.random((n_src, 2)) + 0.5
    b = rng.random((len(rp) - 1, 1)) + 0.5
    w = rng.random((len(ci), 1)) + 0.5
    path = tmp_path_factory.mktemp("pgrad") / "s"
    store = store_of(path, rp, ci, n_src, [("x", x, "src")])
    model = Softmax() if reducer == "softmax" else Weighted()
    if reducer != "softmax":
        model.reducer = REDUCERS[reducer]()

    def loss(graph, xs):
        def f(x, b, w):
            y = model(graph=graph, src={"x": xs if xs is not None else x}, dst={"b": b},
                      edge={"w": w})
            return tg.math.sum(y * y)
        return f
    mem = tg.Graph.from_csr(rp, ci, num_src=n_src)
    want = tg.grad(loss(mem, None), argnums=(0, 1, 2))(x, b, w)
    g = tg.Graph.open(path)
    with tg.scope(page_rows=page):
        got = tg.grad(loss(g, None), argnums=(0, 1, 2))(x, b, w)
    for a, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-10, atol=1e-12)
    if len(ci):        # source cotangents walked the transposed CSR, stored in the store
        assert tg.store.open(path).transposed is not None
    if src_tier == "store":     # the source field itself on disk: grad w.r.t. b and w
        with tg.scope(page_rows=page):
            got = tg.grad(loss(g, store["x"]), argnums=(1, 2))(x, b, w)
        for a, e in zip(got, want[1:]):
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-10, atol=1e-12)


def test_transposed_csr_is_built_once_into_a_new_store_version(tmp_path, monkeypatch):
    rp, ci = ring(300, k=5)
    x = np.random.default_rng(3).random((300, 3))
    store_of(tmp_path / "s", rp, ci, 300)
    builds = []
    real = paging.store_transpose.build
    monkeypatch.setattr(paging.store_transpose, "build",
                        lambda s: builds.append(s.version) or real(s))
    g = tg.Graph.open(tmp_path / "s")
    v0 = g.params["version"]

    def f(x):
        return tg.math.sum(Gather()(graph=g, src={"x": x}) ** 2)
    with tg.scope(page_rows=64), tg.profile() as prof:
        g1 = tg.grad(f)(x)
        stats = prof.measured("paged")[-1]
        g2 = tg.grad(f)(x)
        again = tg.grad(lambda x: tg.math.sum(Gather()(graph=tg.Graph.open(tmp_path / "s"),
                                                       src={"x": x}) ** 2))(x)
    assert builds == [v0]
    s = tg.store.open(tmp_path / "s")
    assert s.version == v0 + 1 and g.params["version"] == v0 + 1
    # the transposed relation is the oracle's: sources' out-edges, edge ids in stored order
    t = s.transposed
    trp, tci, _ = t.read_rows(0, 300)
    order = np.argsort(ci, kind="stable")
    np.testing.assert_array_equal(trp[1:], np.cumsum(np.bincount(ci, minlength=300)))
    np.testing.assert_array_equal(t.edge_perm.read(), order)
    np.testing.assert_array_equal(tci, np.repeat(np.arange(300), 5)[order])
    np.testing.assert_array_equal(s.read_csr()[1], ci)        # the relation is unchanged
    mem = tg.Graph.from_csr(rp, ci)
    want = tg.grad(lambda x: tg.math.sum(Gather()(graph=mem, src={"x": x}) ** 2))(x)
    for got in (g1, g2, again):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    assert stats.pages == 5 and stats.edges == 1500     # the source walk, paged


def test_transpose_build_in_small_buckets_matches_a_sort(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    deg = rng.integers(0, 9, 400)
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    ci = rng.integers(0, 250, rp[-1]).astype(np.int32)
    ci[:40] = 7                          # one source with more edges than a bucket holds
    store_of(tmp_path / "s", rp, ci, 250)
    monkeypatch.setattr(paging.store_transpose, "BUCKET_EDGES", 32)
    t = tg.store.open(tmp_path / "s").transpose()
    order = np.argsort(ci, kind="stable")
    trp, tci, _ = t.read_rows(0, 250)
    np.testing.assert_array_equal(trp[1:], np.cumsum(np.bincount(ci, minlength=250)))
    np.testing.assert_array_equal(t.edge_perm.read(), order)
    np.testing.assert_array_equal(tci, np.repeat(np.arange(400), deg)[order])
    assert not (t.vdir / "transpose" / "runs").exists()


def test_distinct_matches_np_unique():
    rng = np.random.default_rng(11)
    for case in range(60):
        n = int(rng.integers(1, 100_000))
        e = int(rng.integers(1, 3000))
        if case % 3 == 0:
            ci = rng.integers(0, n, e)
        elif case % 3 == 1:            # a band
            ci = (rng.integers(-40, 40, e) + int(rng.integers(0, n))) % n
        else:                          # a band that wraps around: two far windows
            ci = np.concatenate([rng.integers(0, 20, e), rng.integers(max(n - 20, 0), n, e)])
        ci = ci.astype(np.int32)
        u, inv = distinct(ci, np.int32)
        uu, ii = np.unique(ci, return_inverse=True)
        np.testing.assert_array_equal(u, uu)
        np.testing.assert_array_equal(inv, ii.reshape(-1))
        assert inv.dtype == np.int32


def test_task_ir_of_a_paged_call_is_the_page_plan_that_runs(tmp_path):
    from tiga.lower.ir.task import TaskLaunchOp, TransferOp, parse_task
    rp, ci = ring(300, k=3)
    x = np.random.default_rng(2).random((300, 2))
    store = store_of(tmp_path / "s", rp, ci, 300, [("x", x, "src"), ("w", np.ones((900, 1)),
                                                                       "edge")])
    g = tg.Graph.open(tmp_path / "s")
    with tg.scope(page_rows=128), tg.profile() as prof:
        kw = dict(graph=g, src={"x": store["x"]}, dst={"b": np.zeros((300, 1))},
                  edge={"w": store["w"]})
        text = Weighted().ir("task", **kw)
        y = Weighted()(**kw)
    np.testing.assert_allclose(np.asarray(y), np.asarray(Weighted().reference(
        graph=tg.Graph.from_csr(rp, ci), src={"x": x}, dst={"b": np.zeros((300, 1))},
        edge={"w": np.ones((900, 1))})), rtol=1e-12)
    assert str(prof.measured("paged")[-1].module) == text      # printed == interpreted
    module = parse_task(text)
    module.verify()
    assert str(module) == text                                # round trip
    ops = module.body.ops
    launches = [op for op in ops if isinstance(op, TaskLaunchOp)]
    assert [(t.page, t.num_pages, t.page_rows, t.task_kind) for t in launches] == \
        [(0, 3, (0, 128), "page"), (1, 3, (128, 256), "page"), (2, 3, (256, 300), "page")]
    moves = {(op.value.name, op.page): op for op in ops if isinstance(op, TransferOp)}
    assert (moves["graph", 1].kind, moves["graph", 1].src_tier) == ("page", "disk")
    assert (moves["x", 1].kind, moves["x", 1].src_tier, moves["x", 1].rows) == \
        ("gather", "disk", (128, 256))
    assert (moves["b", 2].kind, moves["b", 2].src_tier, moves["b", 2].rows) == \
        ("page", "host", (256, 300))
    assert (moves["w", 1].kind, moves["w", 1].rows) == ("page", (384, 768))  # edge offsets
    writes = [op for op in ops if isinstance(op, TransferOp) and op.kind == "write"]
    assert [(w.page, w.rows, w.dst_tier) for w in writes] == \
        [(0, (0, 128), "host"), (1, (128, 256), "host"), (2, (256, 300), "host")]


class Scaled(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge, scale):
        return src.x * scale


def test_parameter_cotangents_sum_over_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(paging_run, "_materialised", None)      # every propagate pages
    rp, ci = ring(200, k=3)
    x = np.random.default_rng(4).random((200, 2))
    scale = np.array([0.5, 2.0])
    store_of(tmp_path / "s", rp, ci, 200)
    g, mem = tg.Graph.open(tmp_path / "s"), tg.Graph.from_csr(rp, ci)

    def loss(graph):
        return lambda x, scale: tg.math.sum(Scaled()(graph=graph, src={"x": x},
                                                     scale=scale) ** 2)
    with tg.scope(page_rows=30), tg.profile() as prof:
        got = tg.grad(loss(g), argnums=(0, 1))(x, scale)
    stats = prof.measured("paged")[-1]
    want = tg.grad(loss(mem), argnums=(0, 1))(x, scale)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)
    assert stats.pages == 7             # the cotangent propagates ran paged


def test_interrupted_transpose_build_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    rp, ci = ring(100)
    store_of(tmp_path / "s", rp, ci, 100)

    def interrupted(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(paging.store_transpose, "_distribute", interrupted)
    g = tg.Graph.open(tmp_path / "s")
    held = tg.memory.report()["host"]["bytes"]      # (values earlier tests still hold)
    with pytest.raises(KeyboardInterrupt):
        tg.grad(lambda x: tg.math.sum(Gather()(graph=g, src={"x": x})))(np.ones((100, 2)))
    s = tg.store.open(tmp_path / "s")
    assert s.version == 1 and s.transposed is None
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["CURRENT", "v000001"]
    assert tg.memory.report()["host"]["bytes"] == held


def test_disk_inputs_stay_lazy_through_programs_and_vjp(tmp_path, monkeypatch):
    """A disk field reaches a paged propagate without being read whole; tensor code on it
    reads it where used; vjp_fn takes the forward's disk result as its cotangent. Values
    equal the in-memory program's."""
    n = 2000
    rp, ci = ring(n)
    x = np.random.default_rng(3).standard_normal((n, 8)).astype(np.float32)
    store = store_of(tmp_path / "s", rp, ci, n, [("x", x, "src")])
    store.transpose()       # (built outside the small budget below: its sort needs more)
    g, mem = tg.Graph.open(tmp_path / "s"), tg.Graph.from_csr(rp, ci, num_src=n)

    def f(g, x, scale):
        return tg.math.tanh(Gather()(graph=g, src={"x": x}) * scale)
    from tiga.xla_free_runtime.memory.tiers import DiskStorage
    spans, read_rows = [], DiskStorage.read_rows

    def spy(self, start, stop, out=None):
        if len(self.shape) == 2:        # a field (x, the cotangent), not the CSR arrays
            spans.append(min(stop, self.shape[0]) - start)
        return read_rows(self, start, stop, out)
    monkeypatch.setattr(DiskStorage, "read_rows", spy)
    with tg.scope(page_rows=250, budgets={"host": "60KB"}):   # the result (64 KB) on disk
        y, back = tg.vjp(lambda x: Gather()(graph=g, src={"x": x}), store["x"])
        assert y.tier == "disk"
        (dx,) = back(y)
    assert max(spans) < n           # x and the disk cotangent: page by page, never whole
    monkeypatch.undo()
    with tg.scope(page_rows=250):
        z = tg.jit(f)(g, store["x"], np.float32(0.5))
    want_y, want_back = tg.vjp(lambda x: Gather()(graph=mem, src={"x": x}), x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_back(want_y)[0]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(z), np.asarray(f(mem, x, np.float32(0.5))),
                               rtol=1e-6)


@pytest.mark.parametrize("page_rows,writers", [(500, 2), (300, 1)],
                         ids=["whole chunks: two writers", "chunks split: one writer"])
def test_result_pages_written_at_once_only_where_they_write_whole_chunks(
        tmp_path, monkeypatch, page_rows, writers):
    """Pages whose result rows are whole chunks are written by two threads at once; pages
    that split a chunk (each rewrites it whole) by one, in order. Both equal the in-memory
    result, row for row."""
    from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
    from tiga.xla_free_runtime.paging import writer as writer_mod
    n = 4000
    rp, ci = ring(n)
    x = np.arange(n * 8, dtype=np.float32).reshape(n, 8) % 97
    store = store_of(tmp_path / "s", rp, ci, n, [("x", x, "src")])
    g = tg.Graph.open(tmp_path / "s")
    want = np.asarray(Gather().reference(graph=tg.Graph.from_csr(rp, ci), src={"x": x}))
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", 500 * 8 * 4)     # result chunks: 500 rows
    made, real = [], writer_mod.PageWriter.__init__
    monkeypatch.setattr(writer_mod.PageWriter, "__init__", lambda self, *a, **k: (
        real(self, *a, **k), made.append(len(self.threads)))[0])
    with tg.scope(budgets={"host": "100KB"}, page_rows=page_rows, spill_dir=tmp_path / "sp"):
        y = Gather()(graph=g, src={"x": store["x"]})
        assert y.tier == "disk" and y._storage.chunk_rows == 500
        np.testing.assert_array_equal(y.numpy(), want)
    assert made == [writers]


def test_a_failed_result_write_is_raised_and_leaves_nothing(tmp_path, monkeypatch):
    """The writer thread's error reaches the caller; the spill dir and budget are clean."""
    from tiga.xla_free_runtime.memory.tiers import DiskStorage
    rp, ci = ring(2000)
    store_of(tmp_path / "s", rp, ci, 2000)
    g = tg.Graph.open(tmp_path / "s")
    real, calls = DiskStorage.write_rows, []

    def failing(self, start, rows):
        calls.append(start)
        if len(calls) == 2:
            raise tg.StorageError(f"{self.path}: write failed (disk full)")
        return real(self, start, rows)
    monkeypatch.setattr(DiskStorage, "write_rows", failing)
    spill = tmp_path / "spill"
    with tg.scope(page_rows=100, spill_dir=spill, budgets={"host": "20KB"}):
        with pytest.raises(tg.StorageError, match="disk full"):
            Gather()(graph=g, src={"x": np.ones((2000, 2))})   # the result goes to disk
        assert tg.memory.report()["host"]["bytes"] == 0
    assert list(spill.iterdir()) == []


def test_strict_mode_refuses_pages_that_would_run_on_the_reference_interpreter(tmp_path,
                                                                                 monkeypatch):
    rp, ci = ring(300, k=3)
    x = (np.arange(300 * 2).reshape(300, 2) % 7).astype(np.uint8)   # no cpu-llvm kernel
    store = store_of(tmp_path / "s", rp, ci, 300, [("x", x, "src")])
    g = tg.Graph.open(tmp_path / "s")
    with tg.scope(page_rows=128):
        got = Gather()(graph=g, src={"x": store["x"]})           # falls back, correctly
        np.testing.assert_array_equal(np.asarray(got), np.asarray(Gather().reference(
            graph=tg.Graph.from_csr(rp, ci), src={"x": x})))
        monkeypatch.setattr(tg.config, "strict", True)
        with pytest.raises(tg.UnsupportedError, match="strict mode: a paged propagate"):
            Gather()(graph=g, src={"x": store["x"]})
