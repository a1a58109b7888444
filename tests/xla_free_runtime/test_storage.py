"""Storage tiers (host / disk / device), tg.save / tg.load, scopes, budgets and LRU eviction
(API.md section 7). Oracles: the numpy arrays the tensors were made from and the nbytes of
the buffers actually allocated."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.memory import scope as sc
from tiga.xla_free_runtime.memory import tensor as tensor_mod
from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
from tiga.xla_free_runtime.memory.tiers import files as files_mod

pytest.importorskip("zarr", minversion="3.1")


@pytest.fixture()
def spill(tmp_path):
    with tg.scope(spill_dir=tmp_path / "spill") as s:
        yield s, tmp_path / "spill"


@pytest.fixture()
def small_chunks(monkeypatch):
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", 256)   # many chunks on small arrays


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16",
                                   "bfloat16", "bool"])
def test_disk_round_trip_keeps_values_dtype_and_shape(spill, dtype):
    rng = np.random.default_rng(0)
    x = (rng.random((37, 3)) * 10).astype(tg.bool_.np if dtype == "bool" else
                                          getattr(tg, dtype).np)
    d = tg.asarray(x).to("disk")
    assert d.tier == "disk" and d.shape == x.shape and d.dtype == getattr(tg, dtype if
                                                                          dtype != "bool"
                                                                          else "bool_")
    h = d.to("host")
    assert h.tier == "host"
    np.testing.assert_array_equal(h.numpy(), x)
    assert h.numpy().dtype == x.dtype


@pytest.mark.parametrize("shape", [(), (0,), (0, 4), (5,), (3, 2, 2)])
def test_disk_round_trip_of_edge_shapes(spill, shape):
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    d = tg.asarray(x).to("disk")
    np.testing.assert_array_equal(np.asarray(d), x)
    assert np.asarray(d).shape == shape


def test_row_slice_reads_only_the_chunks_it_needs(spill, small_chunks):
    x = np.arange(400, dtype=np.float32).reshape(100, 4)      # 16 rows per 256-byte chunk
    d = tg.asarray(x).to("disk")
    path = d._storage.path
    assert d._storage.chunk_rows == 16
    os.remove(path / "c" / "5" / "0")                      # rows 80..95
    np.testing.assert_array_equal(d[3:40].numpy(), x[3:40])
    assert d[3:40].tier == "host"
    with pytest.raises(tg.StorageError, match=r"c/5/0: chunk file missing"):
        d[70:85]
    with pytest.raises(tg.StorageError, match="chunk file missing"):
        d.numpy()


def test_flipped_byte_is_a_storage_error_naming_the_file(spill, small_chunks):
    x = np.arange(400, dtype=np.float32).reshape(100, 4)
    d = tg.asarray(x).to("disk")
    chunk = d._storage.path / "c" / "2" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[7] ^= 0x10
    chunk.write_bytes(bytes(raw))
    np.testing.assert_array_equal(d[0:32].numpy(), x[0:32])     # other chunks still read
    with pytest.raises(tg.StorageError, match=r"c/2/0: checksum check \(crc32c\) failed"):
        d[30:40]


def test_device_tier_is_unsupported_without_cuda():
    with pytest.raises(tg.UnsupportedError, match="CUDA"):
        tg.asarray(np.ones(3)).to("cuda")
    with pytest.raises(tg.UnsupportedError, match="tier 'gpu0' is unknown"):
        tg.asarray(np.ones(3)).to("gpu0")


def test_spill_and_restore_move_the_value_and_the_bytes(spill):
    _, spill_dir = spill
    x = np.random.default_rng(1).random((64, 8))
    t = tg.asarray(x).to("disk").to("host")        # a buffer Tiga allocated
    assert tg.memory.report()["host"]["bytes"] == x.nbytes
    t.spill()
    assert t.tier == "disk"
    assert tg.memory.report()["host"]["bytes"] == 0
    assert tg.memory.report()["disk"]["bytes"] == x.nbytes
    assert len(list(spill_dir.iterdir())) == 1        # the spill (the to("disk") copy died)
    t.restore()
    assert t.tier == "host" and tg.memory.report()["disk"]["bytes"] == 0
    np.testing.assert_array_equal(t.numpy(), x)
    t.spill()
    np.testing.assert_array_equal(np.asarray(t), x)   # a read restores a spilled tensor
    assert t.tier == "host"


def test_report_counts_what_was_allocated_and_gives_it_back(spill):
    xs = [np.ones((n, 3), np.float32) for n in (10, 200, 33)]
    disks = [tg.asarray(x).to("disk") for x in xs]
    with tg.scope() as inner:
        hosts = [d.to("host") for d in disks]
        want = sum(h.numpy().nbytes for h in hosts)
        assert tg.memory.report()["host"] == {"bytes": want, "peak": want, "budget": None}
        assert inner.report()["disk"]["bytes"] == 0     # the disk copies came before
        del hosts
        assert tg.memory.report()["host"]["bytes"] == 0
        assert tg.memory.report()["host"]["peak"] == want
    assert tg.memory.report()["disk"]["bytes"] == sum(x.nbytes for x in xs)


def test_budget_that_cannot_be_met_names_tier_budget_and_request(spill):
    d = tg.asarray(np.ones((1000, 4))).to("disk")         # 32000 bytes
    with tg.scope(budgets={"host": "30KB"}):
        with pytest.raises(tg.StorageError, match=r"host budget 29\.30 KiB \(30000 bytes\) "
                                                  r"cannot hold a request of .*32000 bytes"):
            d.to("host")
        assert tg.memory.report()["host"]["bytes"] == 0


@pytest.mark.parametrize("rows", [1000, 40000], ids=["small", "large"])
def test_lru_spills_the_least_recently_used_idle_tensor(spill, rows):
    # (32000 bytes each, or 1.28 MB)
    d = tg.asarray(np.arange(rows * 4.0).reshape(rows, 4)).to("disk")
    budget = 70 * rows
    with tg.scope(budgets={"host": budget}, eviction="lru"):
        a, b = d.to("host"), d.to("host")
        a.numpy()                                     # a is now more recent than b
        c = d.to("host")
        assert (a.tier, b.tier, c.tier) == ("host", "disk", "host")
        assert tg.memory.report()["host"]["bytes"] == 64 * rows
        held = c.numpy()                              # a view is out: c is not idle
        a.numpy()
        np.testing.assert_array_equal(b.numpy(), d.numpy())   # restores b: c is the least
        assert (a.tier, b.tier, c.tier) == ("disk", "host", "host")   # recent, but held
        assert tg.memory.report()["host"]["peak"] <= budget
        del held


def test_scopes_nest_and_the_innermost_option_wins(tmp_path):
    assert sc.page_rows() == sc.DEFAULT_PAGE_ROWS and sc.eviction() == "none"
    with tg.scope(budgets={"host": "1GiB", "disk": 10}, page_rows=100, spill_dir=tmp_path):
        with tg.scope(budgets={"host": "512MiB"}, eviction="lru"):
            assert sc.page_rows() == 100 and sc.eviction() == "lru"
            assert tg.memory.report()["host"]["budget"] == 512 << 20
            assert tg.memory.report()["disk"]["budget"] == 10
            assert sc.spill_dir() == tmp_path
            seen = []
            t = threading.Thread(target=lambda: seen.append(sc.page_rows()))
            t.start()
            t.join()
            assert seen == [sc.DEFAULT_PAGE_ROWS]      # a new thread starts at the root
        assert sc.eviction() == "none" and tg.memory.report()["host"]["budget"] == 1 << 30
    assert tg.memory.report()["host"]["budget"] is None


@pytest.mark.parametrize("text,n", [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1.5KB", 1500),
                                    (" 12 ", 12), ("3b", 3), (7, 7)])
def test_budget_strings(text, n):
    assert sc.parse_bytes(text, "b") == n


@pytest.mark.parametrize("bad", ["4 parsecs", "-1", -5, True, 1.5, "GiB"])
def test_bad_budget_names_the_tier(bad):
    with pytest.raises(tg.StorageError, match=r"budgets\['host'\]"):
        tg.scope(budgets={"host": bad})


def test_bad_scope_options():
    with pytest.raises(tg.StorageError, match="tier 'gpu' is unknown"):
        tg.scope(budgets={"gpu": 1})
    with pytest.raises(tg.StorageError, match="page_rows: is 0"):
        tg.scope(page_rows=0)
    with pytest.raises(tg.StorageError, match="eviction: is 'fifo'"):
        tg.scope(eviction="fifo")


def test_save_and_load_replace_atomically(tmp_path):
    path = tmp_path / "x.zarr"
    x = np.random.default_rng(2).random((50, 3))
    tg.save(x, path)
    tg.save(tg.asarray(2 * x), path)
    lazy = tg.load(path)
    assert lazy.tier == "disk"
    np.testing.assert_array_equal(lazy[10:20].numpy(), 2 * x[10:20])
    host = tg.load(path, tier="host")
    assert host.tier == "host"
    np.testing.assert_array_equal(host.numpy(), 2 * x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.zarr"]   # no temp left


def test_save_that_crashes_before_the_rename_keeps_the_old_array(tmp_path, monkeypatch):
    path = tmp_path / "x.zarr"
    x = np.arange(12.0).reshape(4, 3)
    tg.save(x, path)

    def crash(new, old):
        raise KeyboardInterrupt
    monkeypatch.setattr(tensor_mod, "_replace_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        tg.save(-x, path)
    np.testing.assert_array_equal(tg.load(path, tier="host").numpy(), x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.zarr"]


def test_load_of_a_missing_or_broken_array(tmp_path):
    with pytest.raises(tg.StorageError, match="zarr.json: not found"):
        tg.load(tmp_path / "nothing")
    tg.save(np.ones(3), tmp_path / "a")
    (tmp_path / "a" / "zarr.json").write_text("{not json")
    with pytest.raises(tg.StorageError, match="metadata check failed"):
        tg.load(tmp_path / "a")
    with pytest.raises(tg.UnsupportedError, match="tier 'cuda'"):
        tg.load(tmp_path / "a", tier="cuda")


def test_loaded_arrays_are_read_only(tmp_path):
    tg.save(np.ones((4, 2)), tmp_path / "a")
    t = tg.load(tmp_path / "a")
    with pytest.raises(tg.StorageError, match="read-only"):
        t._storage.write_rows(0, np.zeros((1, 2)))


def test_disk_tensors_feed_programs(spill):
    g = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
    x = np.array([2.0, 3.0])
    y = tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": tg.asarray(x).to("disk")})
    np.testing.assert_array_equal(np.asarray(y), [5.0, 3.0, 0.0])


def test_spill_files_are_removed_when_tensors_die(spill):
    _, spill_dir = spill
    d = tg.asarray(np.ones((10, 2))).to("disk")
    assert len(list(Path(spill_dir).iterdir())) == 1
    del d
    assert list(Path(spill_dir).iterdir()) == []


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranges=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 40)), min_size=1,
                       max_size=8), reuse=st.booleans())
def test_direct_chunk_reads_match_zarr_across_ranges_and_writes(spill, small_chunks, ranges,
                                                                reuse):
    x = np.arange(400, dtype=np.float32).reshape(100, 4)
    t = tg.asarray(x).to("disk")
    d = t._storage                                          # 16-row chunks
    assert d._direct and d.chunk_rows == 16
    buf = files_mod.aligned_empty((100, 4), np.float32) if reuse else None
    for k, (a, n) in enumerate(ranges):                    # overlapping sweeps hit the cache
        got = d.read_rows(a, a + n, buf)
        np.testing.assert_array_equal(got, x[a:a + n])
        assert got.ctypes.data % 64 == 0 or not len(got)
        rows = np.unique(np.random.default_rng(k).integers(0, 100, n + 1))
        np.testing.assert_array_equal(d.take_rows(rows, buf), x[rows])
        if k % 2:                                           # a write drops decoded chunks
            x[a:a + n] += 1000
            d.write_rows(a, x[a:a + n])
    d._direct = False                                       # zarr's own decode agrees
    np.testing.assert_array_equal(d.read_rows(0, 100), x)


@pytest.mark.parametrize("shape,dtype,align,mapped", [
    ((3, 5), np.float64, 64, False), ((1 << 18, 3), np.float32, 4096, False),
    ((3, 5), np.float64, 64, True), ((1 << 18, 3), np.float32, 4096, True),
    ((1 << 21,), np.uint8, 64, True)])
def test_aligned_buffers_and_mapped_ones_given_back_when_dropped(shape, dtype, align, mapped):
    """aligned_empty: the shape, dtype and alignment asked for, writable; one asked
    `mapped` of MAPPED_MIN bytes or more has a mapping of its own, unmapped when it goes
    (malloc's arenas would keep it resident)."""
    import gc
    import mmap
    buf = files_mod.aligned_empty(shape, dtype, align, mapped=mapped)
    assert buf.shape == shape and buf.dtype == dtype and buf.ctypes.data % align == 0
    buf[...] = 7
    assert buf.flags.writeable and (buf == 7).all()
    base = buf
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    owner = base.base.obj if isinstance(base.base, memoryview) else base.base
    own = mapped and buf.nbytes >= files_mod.MAPPED_MIN
    assert isinstance(owner, mmap.mmap) == own
    if own:
        start = buf.ctypes.data

        def mapped_now() -> bool:
            with open("/proc/self/maps") as f:
                return any(int(line.split("-")[0], 16) <= start <
                           int(line.split()[0].split("-")[1], 16) for line in f)
        assert mapped_now()
        del buf, base, owner
        gc.collect()
        assert not mapped_now(), "the buffer's mapping outlived it"
