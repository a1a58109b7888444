"""A layer's warm call (trace/warm_calls.py) re-reads TIGA_BACKEND: a signature warm on
cpu-llvm moves to the triton interpreter when the variable changes between calls (planned
once there, then warm on its prepared Triton launch), and back; an unknown name raises as
on a cold call. Oracle: numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.trace import call_cache
from tiga.xla_free_runtime.backends.triton import prepared as triton_prepared
from tiga.xla_free_runtime.caches import programs as program_cache

N, E = 40, 160


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _want(s, d, x, w) -> np.ndarray:
    out = np.zeros((N, x.shape[1]))
    np.add.at(out, d, x[s].astype(np.float64) * w.astype(np.float64))
    return out


def test_backend_change_between_warm_calls(monkeypatch):
    rng = np.random.default_rng(0)
    s, d = rng.integers(0, N, E), rng.integers(0, N, E)
    g = tg.Graph.from_coo(s, d, num_src=N, num_dst=N)
    x = rng.standard_normal((N, 3)).astype(np.float32)
    w = rng.standard_normal((E, 1)).astype(np.float32)
    layer = Weighted()
    monkeypatch.setattr(tg.config, "_backend", None)   # (TIGA_BACKEND decides, not a setting)
    staged, launched = [], []
    real_stage, real_run = call_cache.staged_program, triton_prepared.PreparedTritonLaunch.run
    monkeypatch.setattr(call_cache, "staged_program",
                        lambda *a, **k: staged.append(1) or real_stage(*a, **k))
    monkeypatch.setattr(triton_prepared.PreparedTritonLaunch, "run",
                        lambda self, v: launched.append(1) or real_run(self, v))

    def check():
        got = np.asarray(layer(graph=g, src={"x": x}, edge={"w": w}))
        np.testing.assert_allclose(got, _want(s, d, x, w), rtol=1e-5, atol=1e-5)

    for backend, planned in (("cpu-llvm", 1), ("triton-interpreter", 2), ("cpu-llvm", 3)):
        monkeypatch.setenv("TIGA_BACKEND", backend)
        for _ in range(3):
            check()
        assert len(staged) == planned      # each switch: the full path once, then warm
    assert len(launched) == 2              # the two warm calls on triton's prepared launch
    backends = {p.backend for _, preps in program_cache.entries("prepared") for p in preps}
    assert "cpu-llvm" in backends
    monkeypatch.setenv("TIGA_BACKEND", "no-such-backend")
    with pytest.raises(tg.UnsupportedError, match="TIGA_BACKEND"):
        layer(graph=g, src={"x": x}, edge={"w": w})
