"""A paged run over a store its page cache can keep reads its arrays mapped (paging/mapped.py):
the same results as the in-memory route and as the pages read into buffers, every chunk
checked (a damaged one is a StorageError, never a crash or a result), a checked chunk not
checked again while it stays mapped and unchanged, and a chunk file changed or cut short
between runs mapped anew or refused."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.memory.tiers import chunk_checks
from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
from tiga.xla_free_runtime.memory.tiers import files as files_mod
from tiga.xla_free_runtime.paging import pages as pages_mod

pytest.importorskip("zarr", minversion="3.1")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mapped pages: Linux")

CHUNK = 4096            # one memory page a chunk: every store array below maps


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.b


def store_of(path: Path, rp, ci, n_src: int, fields) -> None:
    with tg.store.create(path, num_src=n_src, num_dst=len(rp) - 1, index_dtype="int32",
                         overwrite=True) as w:
        w.append_csr_chunk(rp, ci)
        for name, arr, role in fields:
            w.append_field(name, arr, role=role)


def warm(path: Path) -> None:
    """Every file of the store read once: the page cache holds it (a cold run reads its
    pages into buffers, mapped.WARM)."""
    for f in path.rglob("*"):
        if f.is_file():
            f.read_bytes()


def run(path: Path, page_rows: int, reducer, tiers: dict, arrays: dict, mapped: bool = True):
    """(result, the run's PageStats) of Weighted over the store at `path`, each field from
    the store or the host (`tiers`); `mapped=False`: pages read into buffers as before."""
    warm(path)
    store = tg.store.open(path)
    fields = {k: store[k] if tiers[k] == "store" else arrays[k] for k in ("x", "b", "w")}
    model = Weighted()
    model.reducer = reducer
    with pytest.MonkeyPatch.context() as mp:
        if not mapped:
            mp.setattr(disk_mod.DiskStorage, "can_map", lambda self: False)
        with tg.scope(page_rows=page_rows), tg.profile() as prof:
            y = model(graph=tg.Graph.open(path), src={"x": fields["x"]},
                      dst={"b": fields["b"]}, edge={"w": fields["w"]})
    return np.asarray(y), prof.measured("paged")[-1]


@st.composite
def graphs(draw):
    n_dst, n_src = draw(st.integers(1, 700)), draw(st.integers(1, 900))
    deg = np.asarray(draw(st.lists(st.integers(0, 9), min_size=n_dst, max_size=n_dst)))
    seed = draw(st.integers(0, 2**16))
    band = draw(st.booleans())         # ids near the row (pages read windows) or anywhere
    rng = np.random.default_rng(seed)
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    rows = np.repeat(np.arange(n_dst), deg)
    ci = (rows * n_src // n_dst + rng.integers(-3, 4, len(rows))) % n_src if band else \
        rng.integers(0, n_src, len(rows))
    return rp, ci.astype(np.int32), n_src, draw(st.integers(1, n_dst)), seed


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=graphs(), reducer=st.sampled_from(["sum", "max", "mean"]),
       tiers=st.fixed_dictionaries({k: st.sampled_from(["store", "host"]) for k in "xbw"}))
def test_mapped_pages_equal_in_memory_and_read_pages(tmp_path_factory, monkeypatch, case,
                                                     reducer, tiers):
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", CHUNK)
    rp, ci, n_src, page, seed = case
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.random((n_src, 2)) - 0.5, "b": rng.random((len(rp) - 1, 1)),
              "w": rng.random((len(ci), 1)) + 0.5}
    path = tmp_path_factory.mktemp("mapped") / "s"
    store_of(path, rp, ci, n_src, [("x", arrays["x"], "src"), ("b", arrays["b"], "dst"),
                                   ("w", arrays["w"], "edge")])
    red = getattr(tg, reducer)()
    got, stats = run(path, page, red, tiers, arrays)
    assert stats.mapped == (len(ci) > 0) and stats.edges == len(ci)   # (no ids: nothing maps)
    model = Weighted()
    model.reducer = red
    want = model(graph=tg.Graph.from_csr(rp, ci, num_src=n_src), src={"x": arrays["x"]},
                 dst={"b": arrays["b"]}, edge={"w": arrays["w"]})
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-12, atol=1e-12)
    read, stats = run(path, page, red, tiers, arrays, mapped=False)
    assert not stats.mapped
    np.testing.assert_array_equal(got, read)     # the same kernel, rows in the same order


@pytest.fixture
def ring(tmp_path, monkeypatch):
    """(store path, arrays, the result): 2000 rows, 8 neighbours each, chunks of a page."""
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", CHUNK)
    n, k = 2000, 8
    rp = np.arange(n + 1, dtype=np.int64) * k
    ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
    rng = np.random.default_rng(1)
    arrays = {"x": rng.random((n, 4)), "b": rng.random((n, 1)), "w": rng.random((n * k, 1))}
    path = tmp_path / "s"
    store_of(path, rp, ci, n, [("x", arrays["x"], "src"), ("b", arrays["b"], "dst"),
                               ("w", arrays["w"], "edge")])
    want = (arrays["x"][ci] * arrays["w"] + np.repeat(arrays["b"], k, 0)).reshape(n, k, 4)
    return path, arrays, want.sum(1)


def flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x40
    path.write_bytes(bytes(raw))


STORE = {"x": "store", "b": "store", "w": "store"}


@pytest.mark.parametrize("array,at", [
    ("fields/x/c/5/0", 100), ("fields/x/c/5/0", -1), ("fields/w/c/3/0", 8),
    ("col_idx/c/2", 3),              # an id's high byte: out of range unless checked first
    ("row_ptr/c/1", 7)], ids=["field row", "field trailer", "edge field", "column id",
                              "row offset"])
@pytest.mark.parametrize("cold", [False, True], ids=["mapped", "read through the mapping"])
def test_a_damaged_chunk_fails_the_mapped_run(ring, monkeypatch, array, at, cold):
    path, arrays, want = ring
    got, stats = run(path, 300, tg.sum(), STORE, arrays)
    assert stats.mapped
    np.testing.assert_allclose(got, want, rtol=1e-12)
    flip(path / "v000001" / array, at)
    if cold:              # (the run finds the store out of the cache: it reads through)
        monkeypatch.setitem(globals(), "warm", drop_cache)
    with pytest.raises(tg.StorageError, match=rf"{array}: (checksum|row_ptr|.*check)"):
        run(path, 300, tg.sum(), STORE, arrays)


def test_checked_chunks_are_checked_again_only_when_they_may_have_changed(ring, monkeypatch):
    path, arrays, want = ring
    checked = counting_checks(monkeypatch)
    store, g = tg.store.open(path), tg.Graph.open(path)
    x, b, w = store["x"], store["b"], store["w"]
    model = Weighted()

    def call():
        warm(path)
        checked.clear()
        with tg.scope(page_rows=300), tg.profile() as prof:
            got = model(graph=g, src={"x": x}, dst={"b": b}, edge={"w": w})
        assert prof.measured("paged")[-1].mapped
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
        return sorted(checked)

    first = call()
    chunks = sum(len(files) for _, _, files in os.walk(path / "v000001")
                 if not any(f.endswith(".json") for f in files))
    # every chunk (a chunk two pages share may be checked by both loaders at once)
    assert len(set(first)) == chunks
    assert call() == []                               # still mapped, unchanged: none
    x_storage = x._storage
    _, fmap, _ = x_storage._mapping
    assert fmap.resident(x_storage.num_chunks).all()
    # a chunk's pages leave this process (as eviction would take them): checked again
    libc = files_mod._libc()
    assert libc.madvise(fmap.base + 2 * CHUNK, CHUNK, 4) == 0          # MADV_DONTNEED
    assert list(np.flatnonzero(~fmap.resident(x_storage.num_chunks))) == [2]
    assert call() == [str(path / "v000001/fields/x/c/2/0")]
    # a chunk file written to (its change time moves): the array is mapped anew
    f = path / "v000001/fields/x/c/4/0"
    f.write_bytes(f.read_bytes())
    again = call()
    assert str(f) in again and all("fields/x/" in p for p in again)
    assert x_storage._mapping[1] is not fmap


def drop_cache(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def counting_checks(monkeypatch) -> list:
    """The chunk files checked through a mapping (DiskStorage._check_body), as they are."""
    checked = []
    real = disk_mod.DiskStorage._check_body
    monkeypatch.setattr(disk_mod.DiskStorage, "_check_body",
                        lambda self, k, body, f: (checked.append(str(f)), real(self, k, body, f)))
    return checked


def chunk_files(path: Path) -> set:
    return {str(path / d / f) for d, _, files in os.walk(path)
            for f in files if not f.endswith(".json") and "c" in Path(d).parts}


def test_a_cold_run_reads_through_the_mapping_the_next_one_maps(ring, monkeypatch):
    """A cold run reads its pages into buffers, each chunk read in and checked through the
    mapping its storage keeps: the next run maps them and checks none again."""
    path, arrays, want = ring
    checked = counting_checks(monkeypatch)
    drop_cache(path)
    store, g = tg.store.open(path), tg.Graph.open(path)
    call = dict(graph=g, src={"x": store["x"]}, dst={"b": store["b"]}, edge={"w": store["w"]})
    got, seen = [], []
    with tg.scope(page_rows=300), tg.profile() as prof:
        for _ in range(2):
            checked.clear()
            got.append(np.asarray(Weighted()(**call)))
            seen.append(set(checked))
    assert [s.mapped for s in prof.measured("paged")] == [False, True]
    for y in got:
        np.testing.assert_allclose(y, want, rtol=1e-12)
    assert seen == [chunk_files(store.vdir), set()]


@pytest.mark.parametrize("room", [0, 24 << 10, 1 << 30])
def test_reading_through_the_mapping_stays_in_the_host_budget(ring, monkeypatch, room):
    """A cold run reads a chunk through the kept mapping only while the host budget holds it
    beside the largest page's buffers, and maps the rest once its buffers are gone: the
    budget holds throughout and gets every byte back, and the next run checks nothing
    (`room`: budget bytes beyond the result and the mapped arrays, which the warm run
    needs)."""
    path, arrays, want = ring
    checked, through = counting_checks(monkeypatch), []
    real = disk_mod.DiskStorage.load_mapped

    def spy(self, k, fmap):     # (while the pages read, or after them: map_rest)
        through.append(chunk_checks.current() is not None)
        return real(self, k, fmap)
    monkeypatch.setattr(disk_mod.DiskStorage, "load_mapped", spy)
    drop_cache(path)
    store, g = tg.store.open(path), tg.Graph.open(path)
    mapped = 2 * store.row_ptr.nbytes + store.col_idx.nbytes + \
        sum(store[k]._storage.nbytes for k in ("x", "b", "w"))
    result, budget = want.nbytes, want.nbytes + mapped + room
    call = dict(graph=g, src={"x": store["x"]}, dst={"b": store["b"]}, edge={"w": store["w"]})
    seen, during = [], []
    with tg.scope(budgets={"host": budget}, page_rows=300), tg.profile() as prof:
        for _ in range(2):
            checked.clear()
            through.clear()
            y = Weighted()(**call)
            rep = tg.memory.report()["host"]
            assert rep["bytes"] == result and rep["peak"] <= budget   # (charges credited)
            np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12)
            seen.append(set(checked))
            during.append(list(through))
            del y
    assert [s.mapped for s in prof.measured("paged")] == [False, True]
    assert seen == [chunk_files(store.vdir), set()]
    # a tight budget: some chunks read as before, then mapped after the pages
    assert all(during[0]) == (room >= 1 << 20)


def test_a_run_past_the_page_cache_reads_its_pages(ring, monkeypatch):
    path, arrays, want = ring
    monkeypatch.setattr(pages_mod, "page_cache_room", lambda: 1 << 10)
    got, stats = run(path, 300, tg.sum(), STORE, arrays)
    assert not stats.mapped
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_explain_and_the_plan_say_the_pages_are_mapped(ring):
    path, arrays, _ = ring
    store = tg.store.open(path)
    call = dict(graph=tg.Graph.open(path), src={"x": store["x"]}, dst={"b": store["b"]},
                edge={"w": store["w"]})
    warm(path)
    with tg.scope(page_rows=300):
        text = str(Weighted().explain(run=True, **call))
    assert "map the CSR rows and disk fields from the page cache" in text
    assert "read mapped from the page cache" in text


CUT_SHORT = """
import sys, numpy as np, tiga as tg
path = sys.argv[1]
store, g = tg.store.open(path), tg.Graph.open(path)
x = store["x"]
run = lambda: np.asarray(tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x}))
for f in store.vdir.rglob("*"):
    if f.is_file():
        f.read_bytes()                                # (warm: the run maps its arrays)
with tg.scope(page_rows=300):
    first = run()
    chunk = store.vdir / "fields" / "x" / "c" / "5" / "0"
    chunk.write_bytes(chunk.read_bytes()[:1000])      # cut short between two runs
    try:
        run()
    except tg.StorageError as exc:
        print("refused:", exc)
    else:
        print("no error")
"""


def test_a_chunk_file_cut_short_between_runs_is_an_error_not_a_crash(ring):
    path, _, _ = ring
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    got = subprocess.run([sys.executable, "-c", textwrap.dedent(CUT_SHORT), str(path)],
                         capture_output=True,
                         text=True, timeout=300, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "refused:" in got.stdout and "fields/x/c/5/0" in got.stdout, got.stdout


class Plain(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * dst.b


def test_gradients_through_mapped_pages_match_in_memory(ring):
    path, arrays, _ = ring
    g, x, b = tg.Graph.open(path), arrays["x"], arrays["b"]
    n = len(x)
    mem = tg.Graph.from_csr(np.arange(n + 1) * 8, ((np.arange(n)[:, None] +
                            np.arange(1, 9)) % n).reshape(-1), num_src=n)

    def loss(graph):
        return lambda x, b: tg.math.sum(Plain()(graph=graph, src={"x": x}, dst={"b": b}) ** 2)
    want = tg.grad(loss(mem), argnums=(0, 1))(x, b)
    with tg.scope(page_rows=300):
        tg.grad(loss(g), argnums=(0, 1))(x, b)       # (builds the transpose; cold: read)
        warm(path)
        with tg.profile() as prof:
            got = tg.grad(loss(g), argnums=(0, 1))(x, b)
    runs = prof.measured("paged")
    # the source cotangent walks the transposed relation, mapped like the stored one
    assert len(runs) >= 2 and all(s.mapped for s in runs)
    for a, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-10, atol=1e-12)


def test_ctrl_c_in_a_mapped_run_stops_cleanly(ring, monkeypatch):
    """A mapped run interrupted between pages (its transfers inline: every chunk checked
    before) gives its budget back and leaves the store's mapping usable by the next call."""
    from tiga.xla_free_runtime.paging import handlers
    path, arrays, want = ring
    store, g = tg.store.open(path), tg.Graph.open(path)
    call = dict(graph=g, src={"x": store["x"]}, dst={"b": store["b"]}, edge={"w": store["w"]})
    warm(path)
    real, calls = handlers.run_propagate, []

    def interrupted(*a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a)
    with tg.scope(budgets={"host": "64MiB"}, page_rows=300), tg.profile() as prof:
        np.testing.assert_allclose(np.asarray(Weighted()(**call)), want, rtol=1e-12)
        monkeypatch.setattr(handlers, "run_propagate", interrupted)
        with pytest.raises(KeyboardInterrupt):
            Weighted()(**call)
        assert tg.memory.report()["host"]["bytes"] == 0
        monkeypatch.setattr(handlers, "run_propagate", real)
        np.testing.assert_allclose(np.asarray(Weighted()(**call)), want, rtol=1e-12)
    assert [s.mapped for s in prof.measured("paged")] == [True, True]
