"""Persistent graph stores (API.md section 7): chunked ingest, validation per chunk, counts
at commit, atomic versioned commits (a SIGKILLed ingest keeps the previous version),
checksums, tg.Graph.open. Oracles: the arrays the store was written from."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tiga as tg

pytest.importorskip("zarr", minversion="3.1")


def random_csr(n_dst, n_src, seed, max_deg=5):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg + 1, n_dst)
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    ci = rng.integers(0, max(n_src, 1), rp[-1]).astype(np.int32) if n_src else \
        np.zeros(0, np.int32)
    return rp, ci


def write_store(path, rp, ci, n_src, chunk_rows=7, fields=(), overwrite=False):
    n = len(rp) - 1
    with tg.store.create(path, num_src=n_src, num_dst=n, overwrite=overwrite) as w:
        for a in range(0, n, chunk_rows):
            b = min(n, a + chunk_rows)
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
        for name, rows, role in fields:
            for a in range(0, len(rows), 11):
                w.append_field(name, rows[a:a + 11], role=role)
    return w


def test_ingest_round_trip(tmp_path):
    rp, ci = random_csr(50, 40, 0)
    x = np.random.default_rng(1).random((40, 3)).astype(np.float32)
    e = np.arange(len(ci), dtype=np.float64)
    w = write_store(tmp_path / "s", rp, ci, 40, fields=[("x", x, "src"), ("w", e, "edge")])
    assert w.version == 1
    store = tg.store.open(tmp_path / "s")
    assert store.version == 1 and (store.num_src, store.num_dst) == (40, 50)
    assert store.fields == {"x": {"role": "src", "dtype": "float32", "shape": (40, 3)},
                            "w": {"role": "edge", "dtype": "float64", "shape": (len(ci),)}}
    assert store["x"].tier == "disk"
    np.testing.assert_array_equal(store["x"].numpy(), x)
    np.testing.assert_array_equal(store["w"][5:9].numpy(), e[5:9])
    g = tg.Graph.open(tmp_path / "s")
    assert g.kind == "paged" and (g.num_src, g.num_dst, g.num_edges) == (40, 50, len(ci))
    assert g.index_dtype == tg.int32
    got_rp, got_ci = g.resolve_csr()
    np.testing.assert_array_equal(got_rp, rp)
    np.testing.assert_array_equal(got_ci, ci)
    lrp, lci, lo = store.read_rows(10, 20)
    np.testing.assert_array_equal(lrp, rp[10:21] - rp[10])
    np.testing.assert_array_equal(lci, ci[rp[10]:rp[20]])
    assert lo == rp[10]


def test_ingest_with_several_zarr_chunks(tmp_path, monkeypatch):
    from tiga.xla_free_runtime.memory.tiers import disk
    monkeypatch.setattr(disk, "CHUNK_BYTES", 64)         # 16 int32 ids per chunk
    rp, ci = random_csr(300, 300, 2, max_deg=9)
    write_store(tmp_path / "s", rp, ci, 300, chunk_rows=13)
    store = tg.store.open(tmp_path / "s")
    assert store._col.chunk_rows == 16
    np.testing.assert_array_equal(store.read_csr()[1], ci)
    np.testing.assert_array_equal(store.page_bounds(37), rp[list(range(0, 300, 37)) + [300]])


def test_empty_and_edgeless_stores(tmp_path):
    write_store(tmp_path / "a", np.zeros(1, np.int64), np.zeros(0, np.int32), 0)
    assert tg.store.open(tmp_path / "a").num_edges == 0
    write_store(tmp_path / "b", np.zeros(6, np.int64), np.zeros(0, np.int32), 3)
    g = tg.Graph.open(tmp_path / "b")
    np.testing.assert_array_equal(g.resolve_csr()[0], np.zeros(6))


@pytest.mark.parametrize("rp,ci,match", [
    ([1, 2], [0], r"chunk 0: row_ptr_chunk\[0\] is 1, expected 0"),
    ([0, 2, 1], [0, 1], r"chunk 0: row_ptr_chunk\[2\] = 1 is less than row_ptr_chunk\[1\]"),
    ([0, 1], [0, 1], r"chunk 0: row_ptr_chunk\[-1\] is 1, expected len\(col_chunk\) = 2"),
    ([0, 2], [0, 9], r"chunk 0: col_chunk\[1\] = 9 is outside \[0, num_src = 4\)"),
    ([0, 1], [-1], r"chunk 0: col_chunk\[0\] = -1 is outside"),
    ([], [], r"chunk 0: row_ptr_chunk is empty"),
    ([0, 1.5], [0], r"chunk 0: row_ptr_chunk must be a 1-D integer array"),
    ([[0, 1]], [0], r"chunk 0: row_ptr_chunk must be a 1-D integer array"),
    (list(range(5)), [0, 0, 0, 0], r"chunk 0: brings the rows to 4, more than num_dst = 3"),
])
def test_bad_chunk_names_chunk_position_and_rule(tmp_path, rp, ci, match):
    w = tg.store.create(tmp_path / "s", num_src=4, num_dst=3)
    with pytest.raises(tg.GraphValidationError, match=match):
        w.append_csr_chunk(np.array(rp), np.array(ci))
    w.abort()


def test_bad_later_chunk_is_named(tmp_path):
    w = tg.store.create(tmp_path / "s", num_src=4, num_dst=5)
    w.append_csr_chunk([0, 1], [3])
    with pytest.raises(tg.GraphValidationError, match=r"chunk 1: col_chunk\[2\] = 4"):
        w.append_csr_chunk([0, 2, 3], [0, 1, 4])
    w.abort()


def test_counts_are_checked_at_commit(tmp_path):
    w = tg.store.create(tmp_path / "s", num_src=4, num_dst=3)
    w.append_csr_chunk([0, 1, 2], [0, 1])
    with pytest.raises(tg.GraphValidationError, match=r"cover 2 destination rows, expected "
                                                      r"num_dst=3"):
        w.commit()
    w.append_csr_chunk([0, 1], [2])
    w.append_field("x", np.ones((3, 2)), role="src")
    with pytest.raises(tg.GraphValidationError, match=r"field 'x' \(role src\) has 3 rows, "
                                                      r"expected 4"):
        w.commit()
    w.append_field("x", np.ones((1, 2)), role="src")
    assert w.commit() == 1


def test_field_rules(tmp_path):
    w = tg.store.create(tmp_path / "s", num_src=4, num_dst=3)
    with pytest.raises(tg.GraphValidationError, match="role of field 'x' is 'node'"):
        w.append_field("x", np.ones(4), role="node")
    with pytest.raises(tg.GraphValidationError, match="name '1x' must be an identifier"):
        w.append_field("1x", np.ones(4))
    w.append_field("x", np.ones((2, 3)))
    with pytest.raises(tg.GraphValidationError, match=r"rows of shape \(2,\) dtype float64 "
                                                      r"differ"):
        w.append_field("x", np.ones((2, 2)))
    with pytest.raises(tg.GraphValidationError, match="role is 'dst', earlier rows had"):
        w.append_field("x", np.ones((2, 3)), role="dst")
    w.abort()


def test_with_block_aborts_on_exception_and_keeps_the_previous_version(tmp_path):
    rp, ci = random_csr(20, 20, 3)
    write_store(tmp_path / "s", rp, ci, 20)
    with pytest.raises(RuntimeError, match="boom"):
        with tg.store.create(tmp_path / "s", num_src=20, num_dst=20, overwrite=True) as w:
            w.append_csr_chunk([0, 1], [0])
            raise RuntimeError("boom")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["CURRENT", "v000001"]
    store = tg.store.open(tmp_path / "s")
    assert store.version == 1
    np.testing.assert_array_equal(store.read_csr()[1], ci)


def test_versions_and_overwrite(tmp_path):
    rp, ci = random_csr(20, 20, 4)
    write_store(tmp_path / "s", rp, ci, 20)
    with pytest.raises(tg.StorageError, match="a committed store exists .*overwrite=True"):
        tg.store.create(tmp_path / "s", num_src=20, num_dst=20)
    old = tg.store.open(tmp_path / "s")
    rp2, ci2 = random_csr(20, 20, 5)
    write_store(tmp_path / "s", rp2, ci2, 20, overwrite=True)
    new = tg.store.open(tmp_path / "s")
    assert (old.version, new.version) == (1, 2)
    np.testing.assert_array_equal(old.read_csr()[1], ci)    # the previous version is kept
    np.testing.assert_array_equal(new.read_csr()[1], ci2)
    write_store(tmp_path / "s", rp, ci, 20, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["CURRENT", "v000002",
                                                                  "v000003"]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "mine.txt").write_text("x")
    with pytest.raises(tg.StorageError, match="not empty and holds no store"):
        tg.store.create(tmp_path / "t", num_src=1, num_dst=1, overwrite=True)


def test_corrupted_chunk_and_manifest_are_storage_errors(tmp_path):
    rp, ci = random_csr(30, 30, 6)
    x = np.random.default_rng(0).random((30, 2))
    write_store(tmp_path / "s", rp, ci, 30, fields=[("x", x, "src")])
    chunk = tmp_path / "s" / "v000001" / "fields" / "x" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[3] ^= 1
    chunk.write_bytes(bytes(raw))
    with pytest.raises(tg.StorageError, match=r"fields/x/c/0/0: checksum check"):
        tg.store.open(tmp_path / "s")["x"].numpy()
    col = tmp_path / "s" / "v000001" / "col_idx" / "c" / "0"
    raw = bytearray(col.read_bytes())
    raw[0] ^= 1
    col.write_bytes(bytes(raw))
    g = tg.Graph.open(tmp_path / "s")
    with pytest.raises(tg.StorageError, match=r"col_idx/c/0: checksum check"):
        tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})
    manifest = tmp_path / "s" / "v000001" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["num_edges"] += 1
    manifest.write_text(json.dumps(m))
    with pytest.raises(tg.StorageError, match="manifest.json: manifest checksum check failed"):
        tg.store.open(tmp_path / "s")


def test_open_without_a_store(tmp_path):
    with pytest.raises(tg.StorageError, match="CURRENT: not found"):
        tg.store.open(tmp_path)
    with pytest.raises(tg.StorageError, match="CURRENT: not found"):
        tg.Graph.open(tmp_path)


INGEST = textwrap.dedent("""
    import sys, time, numpy as np, tiga as tg
    path, n = sys.argv[1], 200000
    w = tg.store.create(path, num_src=n, num_dst=n, overwrite=True)
    rp = np.arange(1001, dtype=np.int64) * 4
    for k in range(n // 1000):
        w.append_csr_chunk(rp, (np.arange(4000) + k) % n)
        if k == 5:
            print("ingesting", flush=True)
        if k >= 5:
            time.sleep(0.01)     # (the appends alone finish before the kill could land)
    w.commit()
""")


def test_ingest_killed_midway_keeps_the_previous_version(tmp_path):
    rp, ci = random_csr(40, 40, 7)
    write_store(tmp_path / "s", rp, ci, 40)
    env = dict(os.environ, TIGA_PROGRESS="0")
    proc = subprocess.Popen([sys.executable, "-c", INGEST, str(tmp_path / "s")],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"ingesting"
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    store = tg.store.open(tmp_path / "s")
    assert store.version == 1
    np.testing.assert_array_equal(store.read_csr()[0], rp)
    np.testing.assert_array_equal(store.read_csr()[1], ci)
    assert (tmp_path / "s" / "v000002").exists()               # the unfinished version
    write_store(tmp_path / "s", rp, ci, 40, overwrite=True)    # is discarded by the next
    assert tg.store.open(tmp_path / "s").version == 2
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["CURRENT", "v000001",
                                                                  "v000002"]
