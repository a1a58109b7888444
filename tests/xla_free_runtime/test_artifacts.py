"""The one artifact cache (artifacts.py): one key function for every backend, one memory
layer safe under threads, one disk entry format; corrupt, foreign, old-format and
non-regular entries discarded and counted, never handed to a loader."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tiga as tg
from tiga.trace.message_passing import PropagateCall
from tiga.xla_free_runtime.caches import artifacts
from tiga.xla_free_runtime.caches import executables as cache_mod
from tiga.xla_free_runtime.caches.artifacts import ArtifactCache, Built, CorruptEntry
from tiga.xla_free_runtime.executor import execute

OP = "gf_kernel.launch @k {tiles = {block_rows = 4}} ..."


def test_one_key_function_serves_every_backend(monkeypatch):
    key = artifacts.artifact_key
    tools = cache_mod.toolchain()
    assert cache_mod.llvm_key(OP, ("csr",)) == key(OP, "cpu-llvm", tools, ("csr",))
    cpu = key(OP, "cpu-llvm", ("3.8.0",), ("csr",))
    assert cpu != key(OP, "triton", ("3.8.0",), ("csr",))             # the target
    assert cpu != key(OP, "cpu-llvm", ("3.9.0",), ("csr",))           # a toolchain version
    assert cpu != key(OP + " ", "cpu-llvm", ("3.8.0",), ("csr",))     # the printed op
    assert cpu != key(OP, "cpu-llvm", ("3.8.0",), ("stencil",))       # the render's extra
    assert cpu == key(OP, "cpu-llvm", ("3.8.0",), ("csr",))
    monkeypatch.setattr(artifacts, "tiga_key", lambda: "another tiga source tree")
    assert cpu != key(OP, "cpu-llvm", ("3.8.0",), ("csr",))           # Tiga's sources


class Kind:
    """A test artifact kind: its payload is the key's bytes; builds are counted and slow,
    so concurrent requests overlap."""

    kinds = ("test",)

    def __init__(self, delay=0.0, loadable=True):
        self.builds, self.loads, self.delay, self.loadable = [], [], delay, loadable

    def build(self, key):
        self.builds.append(key)
        time.sleep(self.delay)
        return Built(("built", key), "test", key.encode() * 3, {"n": 3})

    def load(self, key, kind, payload, meta, path):
        self.loads.append(key)
        if payload != key.encode() * meta["n"]:
            raise CorruptEntry("payload of another key")
        return ("loaded", key) if self.loadable else None


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    return ArtifactCache()


def test_eight_threads_build_a_new_artifact_once(store):
    kind, got, start = Kind(delay=0.2), [], threading.Barrier(8)
    key = artifacts.artifact_key("threads", "test", ())

    def ask():
        start.wait()
        got.append(store.get(key, kind))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kind.builds == [key] and len(got) == 8 and all(v is got[0] for v in got)
    stats = store.stats.as_dict()
    assert stats["misses"] == 1 and stats["memory_hits"] == 7 and stats["writes"] == 1
    assert artifacts.read_entry(artifacts.entry_path(key), key, ("test",))[1] == key.encode() * 3


def test_disk_hit_then_memory_hit(store):
    key = artifacts.artifact_key("disk", "test", ())
    store.get(key, Kind())
    store.clear_memory()
    kind = Kind()
    assert store.get(key, kind) == ("loaded", key) and store.status(key) == "memory"
    assert store.get(key, kind) == ("loaded", key)
    assert kind.builds == [] and kind.loads == [key]
    assert (store.stats.disk_hits, store.stats.memory_hits, store.stats.misses) == (1, 1, 1)


def _entries(key: str) -> dict:
    """Entries that must be refused under `key`, by what is wrong with them."""
    other = artifacts.artifact_key("other", "test", ())
    good = artifacts.encode_entry(key, "test", key.encode() * 3, {"n": 3})
    return {
        "foreign key": artifacts.encode_entry(other, "test", key.encode() * 3, {"n": 3}),
        "foreign kind": artifacts.encode_entry(key, "so", key.encode() * 3, {"n": 3}),
        "payload that fails its load": artifacts.encode_entry(key, "test", b"x", {"n": 3}),
        "checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "truncated": good[:-5],
        "old cpu format": b"TIGAOBJ1\n{\"key\": \"" + key.encode() + b"\"}\nobj",
        "old so format": b"\x7fELF" + b"\0" * 64 + b"{}" + b"\2\0\0\0\0\0\0\0TIGASO01",
        "empty": b"",
    }


@pytest.mark.parametrize("what", list(_entries("k")))
def test_bad_entry_is_discarded_counted_and_rebuilt(store, what):
    key = artifacts.artifact_key("bad", "test", ())
    path = artifacts.entry_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(_entries(key)[what])
    kind = Kind()
    assert store.get(key, kind) == ("built", key)
    assert kind.builds == [key]
    assert store.stats.corrupt_discarded == 1 and store.stats.disk_hits == 0
    store.clear_memory()
    assert store.get(key, Kind()) == ("loaded", key)      # the rebuilt entry is whole
    assert store.stats.disk_hits == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX special files")
def test_fifo_entry_is_refused_without_blocking(store):
    key = artifacts.artifact_key("fifo", "test", ())
    path = artifacts.entry_path(key)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    got = []
    reader = threading.Thread(target=lambda: got.append(store.get(key, Kind())), daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert got == [("built", key)], "reading a FIFO entry blocked"
    assert store.stats.corrupt_discarded == 1


def test_whole_entry_this_host_cannot_load_is_rebuilt_not_counted_corrupt(store):
    key = artifacts.artifact_key("unloadable", "test", ())
    store.get(key, Kind())
    store.clear_memory()
    kind = Kind(loadable=False)
    assert store.get(key, kind) == ("built", key)
    assert kind.loads == [key] and kind.builds == [key]
    assert store.stats.corrupt_discarded == 0 and store.stats.disk_hits == 0


def test_failed_build_caches_nothing_and_unwritable_dir_is_counted(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TIGA_CACHE_DIR", str(blocker / "cache"))
    store, key = ArtifactCache(), artifacts.artifact_key("fails", "test", ())

    class Fails(Kind):
        def build(self, key):
            raise RuntimeError("render failed")

    with pytest.raises(RuntimeError, match="render failed"):
        store.get(key, Fails())
    assert store.status(key) == "miss" and store.stats.misses == 0
    assert store.get(key, Kind()) == ("built", key)
    assert store.stats.disk_write_errors == 1 and store.stats.writes == 0


def test_eight_threads_run_a_new_cpu_kernel_compiled_once(tmp_path, monkeypatch):
    """A cpu-llvm kernel nobody compiled yet, requested by 8 threads at once: one LLVM
    build, one whole entry on disk, and every thread's result equal to scipy's."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    cache = cache_mod.CACHE
    cache.clear_memory()
    cache.reset_stats()
    rng = np.random.default_rng(7)
    n, e = 300, 2000
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    x, w = rng.standard_normal(n), rng.standard_normal(e)
    scale = float(rng.random()) + 0.5         # a constant no other test's kernel has
    call = PropagateCall(g, lambda s, d, ed: s.x * ed.w * scale, tg.sum(), {"x": x}, {},
                         {"w": w}, None, {})
    program, args = call.staged_program()
    want = sp.csr_matrix((w * scale, (dst, src)), shape=(n, n)) @ x
    got, start = [None] * 8, threading.Barrier(8)

    def run(i):
        start.wait()
        got[i] = np.asarray(execute(program, args)[0])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for y in got:
            np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
        assert cache.stats.misses == 1 and cache.stats.corrupt_discarded == 0
        (entry,) = tmp_path.rglob("*" + artifacts.SUFFIX)
        assert artifacts.read_entry(entry, entry.stem, cache_mod.KINDS) is not None
    finally:
        cache.clear_memory()


def test_backend_table_names_each_target_s_artifact_kind():
    """Every backend names the artifact kind it keeps in the one cache; the
    kinds' entry kinds are disjoint, so one backend's entry is never loaded by another."""
    from tiga.xla_free_runtime.backends import BACKENDS

    kinds = {name: b.artifact for name, b in BACKENDS.items()}
    assert kinds["cpu-llvm"] is cache_mod.LLVMArtifact
    assert kinds["triton"] is not kinds["cpu-llvm"]
    for kind in kinds.values():
        assert callable(kind.build) and callable(kind.load)
    assert not set(kinds["cpu-llvm"].kinds) & set(kinds["triton"].kinds)
