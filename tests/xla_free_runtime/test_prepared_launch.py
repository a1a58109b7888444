"""A warm call runs its prepared launch list (issue 25: "a warm call does no planning"): after
the first call over a relation, later calls with matching operands launch without asking the
planner table, and every operand the list does not take as it is (another dtype, a view, a
misaligned gathered field, another relation, a cleared cache) still gives the reference's
answer. Oracle: the reference interpreter (`Layer.reference`)."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime import backends, executor
from tiga.xla_free_runtime.caches.executables import CACHE
from tiga.xla_free_runtime.calls import routes


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.h


def _case(rng, n=50, e=300, f=4, dtype=np.float64):
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    kw = dict(graph=g, src={"x": rng.standard_normal((n, f)).astype(dtype)},
              dst={"h": rng.standard_normal((n, f)).astype(dtype)},
              edge={"w": rng.standard_normal((e, 1)).astype(dtype)})
    return g, kw


def _check(layer, kw):
    got = np.asarray(layer(**kw))
    want = np.asarray(layer.reference(**kw))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _refuse_planning(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a warm call planned its propagate")
    monkeypatch.setattr(executor, "plan", refuse)
    monkeypatch.setattr(routes, "plan", refuse)
    for target in ("cpu-llvm", "triton"):
        monkeypatch.setattr(backends.BACKENDS[target], "plan", refuse)


def test_warm_calls_launch_without_planning(monkeypatch):
    rng = np.random.default_rng(0)
    layer = Weighted()
    _, kw = _case(rng)
    _check(layer, kw)                                  # cold: plans, compiles, prepares
    _refuse_planning(monkeypatch)
    for _ in range(3):                                 # warm: new operand values, same types
        kw = {**kw, "src": {"x": rng.standard_normal(kw["src"]["x"].shape)},
              "edge": {"w": rng.standard_normal(kw["edge"]["w"].shape)}}
        _check(layer, kw)


def test_operands_the_list_does_not_take_still_agree():
    rng = np.random.default_rng(1)
    layer = Weighted()
    g, kw = _case(rng)
    _check(layer, kw)
    x = kw["src"]["x"]
    wide = np.zeros((x.shape[0], 2 * x.shape[1]))
    wide[:, ::2] = x
    views = [wide[:, ::2],                                   # a strided view
             np.frombuffer(np.concatenate([[0.0], x.ravel()]).tobytes()[8:],
                           dtype=np.float64).reshape(x.shape),   # misaligned, read-only
             x.astype(np.float32)]                           # another dtype
    for v in views:
        _check(layer, {**kw, "src": {"x": v}})
    _check(layer, kw)


def test_another_relation_and_a_cleared_cache():
    rng = np.random.default_rng(2)
    layer = Weighted()
    _, kw1 = _case(rng)
    _, kw2 = _case(rng, n=50, e=300)
    for _ in range(2):
        _check(layer, kw1)
        _check(layer, kw2)
    CACHE.clear_memory()
    _check(layer, kw1)
    _check(layer, kw2)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_pool_size_change_replans(monkeypatch, threads):
    rng = np.random.default_rng(3)
    layer = Weighted()
    _, kw = _case(rng, n=400, e=5000)
    _check(layer, kw)
    monkeypatch.setenv("TIGA_NUM_THREADS", threads)
    _check(layer, kw)
    _check(layer, kw)

