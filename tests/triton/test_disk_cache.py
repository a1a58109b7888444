"""The disk cache of rendered Triton modules: $TIGA_CACHE_DIR/triton/<key>.py, read back by
a fresh process (simulated by clearing the in-memory caches), a garbled or truncated entry
discarded and rewritten, never imported."""
import weakref

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.backends.triton import (
    cache as triton_cache,
)
from tiga.xla_free_runtime.backends.triton import (
    launch as triton_launch,
)

G = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
X = np.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
W = np.array([4.0, 5.0, 2.0])


class WeightedMax(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x * edge.w - 1.0


def run():
    return np.asarray(WeightedMax()(graph=G, src={"x": X}, dst={}, edge={"w": W}))


def forget(monkeypatch):
    """A new process: no plan, rendered source or imported module in memory."""
    monkeypatch.setattr(triton_launch, "_SOURCES", {})
    monkeypatch.setattr(triton_launch, "_MODULES", {})
    monkeypatch.setattr(triton_launch, "_PLANS", {})
    monkeypatch.setattr(triton_launch, "_WARM", weakref.WeakKeyDictionary())


GARBLE = [lambda t: t[: len(t) // 2],                      # truncated
          lambda t: t.replace("tl.", "tl .", 1),           # body changed: hash mismatch
          lambda t: "\x00\xff garbage",                    # not a module at all
          lambda t: t.replace("# sha256: ", "# sha256: 0", 1)]


@pytest.mark.parametrize("garble", GARBLE)
def test_entry_reused_and_corrupt_entry_rewritten(interpreter, monkeypatch, tmp_path, garble):
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    forget(monkeypatch)
    want = np.asarray(WeightedMax().reference(graph=G, src={"x": X}, dst={}, edge={"w": W}))
    np.testing.assert_allclose(run(), want)
    (path,) = (tmp_path / "triton").glob("*.py")
    good = path.read_text()
    assert path.stem in good and "@triton.jit" in good

    forget(monkeypatch)
    hits = triton_cache.STATS["disk_hits"]
    np.testing.assert_allclose(run(), want)
    assert triton_cache.STATS["disk_hits"] == hits + 1       # read back, not rendered

    forget(monkeypatch)
    path.write_text(garble(good))
    corrupt = triton_cache.STATS["corrupt"]
    np.testing.assert_allclose(run(), want)
    assert triton_cache.STATS["corrupt"] == corrupt + 1
    assert path.read_text() == good                          # discarded and rewritten


def test_key_names_the_backend_and_versions():
    a = triton_cache.module_key("op", ("csr",), "triton", "3.8.0")
    assert a != triton_cache.module_key("op", ("csr",), "triton-interpreter", "3.8.0")
    assert a != triton_cache.module_key("op", ("csr",), "triton", "3.9.0")
    assert a != triton_cache.module_key("op2", ("csr",), "triton", "3.8.0")
    assert a == triton_cache.module_key("op", ("csr",), "triton", "3.8.0")
