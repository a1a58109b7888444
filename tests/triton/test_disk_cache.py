"""Triton modules in the one artifact cache: stored as `$TIGA_CACHE_DIR/<xx>/<key>.tga` beside
the cpu-llvm libraries (one entry format), read back by a fresh process (simulated by
clearing the in-memory caches), a garbled, truncated or old-format entry discarded and
rewritten, never imported; the module imported once however many threads ask."""
import threading
import weakref

import numpy as np
import pytest

import tiga as tg
from tiga.lower.abi import KernelSource
from tiga.xla_free_runtime.backends.triton import compile as triton_compile
from tiga.xla_free_runtime.backends.triton import launch as triton_launch
from tiga.xla_free_runtime.caches import artifacts
from tiga.xla_free_runtime.caches import equations as equation_cache
from tiga.xla_free_runtime.caches import executables as cache_mod

CACHE = cache_mod.CACHE
G = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
X = np.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
W = np.array([4.0, 5.0, 2.0])


class WeightedMax(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x * edge.w - 1.0


def run():
    return np.asarray(WeightedMax()(graph=G, src={"x": X}, dst={}, edge={"w": W}))


def want():
    return np.asarray(WeightedMax().reference(graph=G, src={"x": X}, dst={}, edge={"w": W}))


def forget(monkeypatch):
    """A new process: no plan, artifact or imported module in memory."""
    CACHE.clear_memory()
    monkeypatch.setattr(triton_launch, "_PLANS", {})
    monkeypatch.setattr(equation_cache, "_MEMOS", weakref.WeakKeyDictionary())


def entries(root, kinds):
    """{path: kind} of the whole entries under `root` of these kinds."""
    out = {}
    for path in root.rglob("*" + artifacts.SUFFIX):
        found = artifacts.read_entry(path, path.stem, kinds)
        if found is not None:
            out[path] = found[0]
    return out


GARBLE = [lambda t: t[: len(t) // 2],                      # truncated
          lambda t: t.replace("tl.", "tl .", 1),           # body changed: hash mismatch
          lambda t: "\x00\xff garbage",                    # not an entry at all
          lambda t: t.replace('"sha256": "', '"sha256": "0', 1),
          # the previous format (header comment lines, then the body)
          lambda t: "# tiga triton module v1\n# key: k\n# sha256: 0\n" + t.split("\n", 1)[1]]


@pytest.mark.parametrize("garble", GARBLE)
def test_entry_reused_and_corrupt_entry_rewritten(interpreter, monkeypatch, tmp_path, garble):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    forget(monkeypatch)
    np.testing.assert_allclose(run(), want())
    (path,) = entries(tmp_path, (triton_compile.KIND,))
    good = path.read_text()
    assert path.stem in good and "@triton.jit" in good

    forget(monkeypatch)
    hits, misses = CACHE.stats.disk_hits, CACHE.stats.misses
    np.testing.assert_allclose(run(), want())
    assert CACHE.stats.disk_hits == hits + 1                 # read back, not rendered
    assert CACHE.stats.misses == misses

    forget(monkeypatch)
    path.write_text(garble(good))
    corrupt, writes = CACHE.stats.corrupt_discarded, CACHE.stats.writes
    np.testing.assert_allclose(run(), want())
    assert CACHE.stats.corrupt_discarded == corrupt + 1
    assert CACHE.stats.writes == writes + 1
    assert path.read_text() == good                          # discarded and rewritten


def test_old_layout_files_are_ignored(interpreter, monkeypatch, tmp_path):
    """The previous layout's files ($TIGA_CACHE_DIR/triton/<key>.py, garbled here) are
    neither read nor trusted: the kernel is rendered into the new layout."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "0123.py").write_text("raise SystemExit('imported')\n")
    forget(monkeypatch)
    misses = CACHE.stats.misses
    np.testing.assert_allclose(run(), want())
    assert CACHE.stats.misses == misses + 1
    assert list(entries(tmp_path, (triton_compile.KIND,)).values()) == [triton_compile.KIND]


def test_cpu_library_and_triton_module_share_the_store(interpreter, monkeypatch, tmp_path):
    """One store, one entry format: the cpu-llvm kernel and the Triton module of the same
    propagate lie side by side as <xx>/<key>.tga, under different keys of one function."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    forget(monkeypatch)
    np.testing.assert_allclose(run(), want())
    tg.config.backend = "cpu-llvm"
    np.testing.assert_allclose(run(), want())
    found = entries(tmp_path, (triton_compile.KIND,) + cache_mod.KINDS)
    assert sorted(found.values()) in (["so", triton_compile.KIND], ["obj", triton_compile.KIND])
    for path in found:
        assert path == artifacts.entry_path(path.stem)
        assert path.read_bytes().startswith(artifacts.FORMAT)
    keys = {kind: path.stem for path, kind in found.items()}
    assert len(set(keys.values())) == 2


def test_key_names_the_backend_and_versions():
    a = triton_compile.module_key("op", "triton", ("csr",))
    assert a != triton_compile.module_key("op", "triton-interpreter", ("csr",))
    assert a != triton_compile.module_key("op2", "triton", ("csr",))
    assert a != triton_compile.module_key("op", "triton", ("stencil",))
    assert a == triton_compile.module_key("op", "triton", ("csr",))
    version = (triton_compile.triton_version(),)
    assert a == artifacts.artifact_key("op", "triton", version, ("csr",))
    assert a != artifacts.artifact_key("op", "triton", ("0.0.0-other",), ("csr",))


SOURCE = "import triton\n\n\n@triton.jit\ndef {name}(x):\n    pass\n"


def test_module_imported_once_from_eight_threads(interpreter, monkeypatch, tmp_path):
    """8 threads asking for a new Triton module get one render, one import, one object."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    renders = []

    def render(symbol):
        renders.append(symbol)
        return KernelSource(SOURCE.format(name=symbol), None)

    key = triton_compile.module_key(f"threads-{tmp_path}", "triton-interpreter")
    kind = triton_compile.TritonArtifact("triton-interpreter", render)
    start, got = threading.Barrier(8), []

    def ask():
        start.wait()
        got.append(CACHE.get(key, kind).module())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(renders) == 1 and len(got) == 8 and all(m is got[0] for m in got)
    assert hasattr(got[0], triton_compile.symbol_for(key))
    assert list(entries(tmp_path, (triton_compile.KIND,))) == [artifacts.entry_path(key)]
