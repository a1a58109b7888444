"""A paged run reads the few rows it needs of a chunk alone and owes the chunk's crc32c check
to the run (issue 28 item 1): the run pays the debt with a whole read (the neighbouring
page's) or settles it at its end, so a damaged chunk read only in part is still a
tg.StorageError naming the chunk file, never a result. A chunk the page cache does not
hold is read past it (O_DIRECT), checked the same way. Oracles: the numpy rows written, a
numpy gather-sum over the stored relation, the chunk files themselves (a flipped byte), and
the page cache's own count of a file's cached pages (cachestat)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.memory.tiers import chunk_checks
from tiga.xla_free_runtime.memory.tiers import disk as disk_mod
from tiga.xla_free_runtime.memory.tiers import files as files_mod
from tiga.xla_free_runtime.paging import pages as pages_mod

pytest.importorskip("zarr", minversion="3.1")


def flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(bytes(raw))


def test_part_reads_are_exact_and_settle_checks_what_is_owed(stored, monkeypatch):
    d, x = stored
    checked = []
    real = d.check_chunk
    monkeypatch.setattr(d, "check_chunk", lambda k: (checked.append(k), real(k)))
    with chunk_checks.checking() as checks:
        np.testing.assert_array_equal(d.read_rows(120, 300), x[120:300])   # chunks 0, 2 in part
        rows = np.array([5, 7, 900, 901])
        np.testing.assert_array_equal(d.take_rows(rows), x[rows])      # chunks 0, 7 in part
        np.testing.assert_array_equal(d.read_rows(256, 384), x[256:384])   # chunk 2 whole
        checks.settle()
    assert sorted(checked) == [0, 7]       # chunk 2's debt was paid by the whole read


@pytest.mark.parametrize("at", [0, -1], ids=["a row not read", "the checksum trailer"])
def test_a_damaged_chunk_read_in_part_fails_at_settle(stored, at):
    d, x = stored
    flip(d._chunk_file(3), at)                 # chunk 3: rows [384, 512)
    with chunk_checks.checking() as checks:
        got = d.read_rows(500, 600)            # rows 500..511 of chunk 3, read alone
        np.testing.assert_array_equal(got[:12], x[500:512]) if at else None
        with pytest.raises(tg.StorageError, match=r"c/3/0: checksum check \(crc32c\) failed"):
            checks.settle()
    with pytest.raises(tg.StorageError, match=r"c/3/0: checksum check"):
        d.read_rows(500, 600)                  # outside a run: checked at once


def band_store(path: Path, n: int, k: int = 3):
    rp = np.arange(n + 1, dtype=np.int64) * 2 * k
    ci = ((np.arange(n)[:, None] + np.r_[-k:0, 1:k + 1]) % n).reshape(-1).astype(np.int32)
    x = np.random.default_rng(2).random((n, 32)).astype(np.float32)
    with tg.store.create(path, num_src=n, num_dst=n, index_dtype="int32") as w:
        w.append_csr_chunk(rp, ci)
        w.append_field("x", x, role="src")
    return rp, ci, x


def paged_sum(path: Path):
    g = tg.Graph.open(path)
    with tg.scope(budgets={"host": "256KB"}, page_rows=256, spill_dir=path.parent / "sp"), \
            tg.profile() as prof:
        got = tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                           src={"x": tg.store.open(path)["x"]}).numpy()
    assert "paged" in str(prof)
    return got


@pytest.mark.parametrize("mapped", [False, True], ids=["pages read", "pages mapped"])
def test_a_paged_run_settles_its_part_reads(tmp_path, monkeypatch, mapped):
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", 16 << 10)    # 128 rows of 32 float32
    if not mapped:           # (mapped pages check whole chunks: test_mapped_pages.py)
        monkeypatch.setattr(disk_mod.DiskStorage, "can_map", lambda self: False)
    n = 900         # the field's last chunk holds rows 896..899, read in part by two pages
    rp, ci, x = band_store(tmp_path / "s", n)
    want = x[ci.reshape(n, -1)].sum(axis=1)
    np.testing.assert_allclose(paged_sum(tmp_path / "s"), want, rtol=1e-6)
    last = tmp_path / "s" / "v000001" / "fields" / "x" / "c" / "7" / "0"
    flip(last, -1)                           # its checksum: only the run's settle reads it
    with pytest.raises(tg.StorageError, match=r"fields/x/c/7/0: checksum check"):
        paged_sum(tmp_path / "s")
    flip(last, -1)
    np.testing.assert_allclose(paged_sum(tmp_path / "s"), want, rtol=1e-6)


def cached(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return not files_mod._cold(fd, os.path.getsize(path) // 4096 * 4096)
    finally:
        os.close(fd)


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(files_mod._cachestat() is None, reason="no cachestat(2) to observe the "
                    "page cache with (Linux 6.5+)")
def test_a_cold_chunk_is_read_past_the_page_cache_and_checked(stored):
    d, x = stored
    chunk, other, third = d._chunk_file(2), d._chunk_file(3), d._chunk_file(4)
    for f in (chunk, other, third):
        drop(f)
    assert not cached(chunk)
    out = files_mod.aligned_empty((128, 32), np.float32, 4096)
    with chunk_checks.checking(direct=True):
        np.testing.assert_array_equal(d.read_rows(256, 384, out), x[256:384])
        assert not cached(chunk)         # O_DIRECT: the body never entered the cache
        unaligned = files_mod.aligned_empty((128 * 32 * 4 + 64,), np.uint8, 4096)[64:] \
            .view(np.float32).reshape(128, 32)
        np.testing.assert_array_equal(d.read_rows(384, 512, unaligned), x[384:512])
        assert not cached(other)         # a buffer O_DIRECT cannot take: staged, then copied
    np.testing.assert_array_equal(d.read_rows(512, 640, out), x[512:640])
    assert cached(third)                 # outside a run that reads past the cache: through it
    flip(chunk, 100)
    drop(chunk)
    with chunk_checks.checking(direct=True), \
            pytest.raises(tg.StorageError, match=r"c/2/0: checksum check"):
        d.check_chunk(2)                 # (into a scratch chunk: read direct too)


@pytest.mark.skipif(files_mod._cachestat() is None, reason="no cachestat(2)")
@pytest.mark.parametrize("room", [1 << 40, 1 << 10], ids=["fits the cache", "exceeds it"])
def test_a_run_larger_than_the_page_cache_reads_past_it(tmp_path, monkeypatch, room):
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(pages_mod, "page_cache_room", lambda: room)
    rp, ci, x = band_store(tmp_path / "s", 900)
    field = sorted((tmp_path / "s" / "v000001" / "fields" / "x" / "c").iterdir())
    for f in field:
        drop(f / "0")
    np.testing.assert_allclose(paged_sum(tmp_path / "s"), x[ci.reshape(900, -1)].sum(axis=1),
                               rtol=1e-6)
    # chunk 3 is read whole by a page (rows 384..511 inside page [256, 512))
    assert cached(field[3] / "0") == (room > 1 << 20)


def test_reads_where_the_platform_has_no_preadv(stored, monkeypatch):
    d, x = stored                            # (macOS: a seek and a readv instead)
    monkeypatch.delattr(os, "preadv")
    with chunk_checks.checking() as checks:
        np.testing.assert_array_equal(d.read_rows(120, 300), x[120:300])   # parts and a whole
        checks.settle()
    np.testing.assert_array_equal(d.read_rows(1000, 1400), x[1000:1400])


STRAY_IDS = """
import sys, os, numpy as np, tiga as tg
from tiga.xla_free_runtime.memory.tiers import disk
disk.CHUNK_BYTES = 4096                        # (1024 ids a chunk: pages read them in part)
disk.DiskStorage.can_map = lambda self: False  # (the read path: pages into buffers)
path, at, field = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n, k = 2000, 8
rp = np.arange(n + 1, dtype=np.int64) * k
ci = ((np.arange(n)[:, None] + np.arange(1, k + 1)) % n).reshape(-1).astype(np.int32)
x = np.random.default_rng(0).random((n, 4))
with tg.store.create(path, num_src=n, num_dst=n, index_dtype="int32") as w:
    w.append_csr_chunk(rp, ci)
    w.append_field("x", x, role="src")
store, g = tg.store.open(path), tg.Graph.open(path)
src = store["x"] if field == "store" else x
def run():
    for f in store.vdir.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    with tg.scope(page_rows=300):
        return np.asarray(tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": src}))
first = run()                                  # (pages learn their source windows)
np.testing.assert_allclose(first, x[ci].reshape(n, k, 4).sum(1))
chunk = store.vdir / "col_idx" / "c" / "2"
raw = bytearray(chunk.read_bytes()); raw[at] ^= 0x40; chunk.write_bytes(bytes(raw))
try:
    run()
except tg.StorageError as exc:
    print("refused:", exc)
else:
    print("no error")
"""


@pytest.mark.parametrize("field", ["host", "store"])
@pytest.mark.parametrize("at", [3, 1003, 4003], ids=["low id", "high id", "late id"])
def test_a_stray_column_id_read_in_part_is_refused_not_a_crash(tmp_path, at, field):
    """A column id whose chunk a page reads in part (its check owed to the run) indexes the
    page's rows before the run's checks settle: one damaged between two runs (its high byte
    flipped: far outside the sources) is a StorageError naming its chunk, not a crash."""
    import subprocess
    import sys
    import textwrap
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    got = subprocess.run([sys.executable, "-c", textwrap.dedent(STRAY_IDS),
                          str(tmp_path / "s"), str(at), field],
                         capture_output=True, text=True, timeout=300, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "refused:" in got.stdout and "col_idx/c/2" in got.stdout, got.stdout
