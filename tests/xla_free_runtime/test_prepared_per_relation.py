"""A program keeps a warm launch list per relation it is called on (up to
interpreter.PREPARED_PER_PROGRAM), so calls alternating between relations (the batches of an
epoch, a train and a test graph) stay warm instead of preparing their list again every call.
Oracle: the reference interpreter."""
from __future__ import annotations

import numpy as np

import tiga as tg
from tiga.xla_free_runtime import executor, interpreter
from tiga.xla_free_runtime.caches import programs as program_cache


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _relations(count: int, n: int = 40, e: int = 160):
    rng = np.random.default_rng(5)
    return [tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n,
                              num_dst=n) for _ in range(count)]


def _counting(monkeypatch) -> list:
    made, real = [], executor.prepare_walk

    def counted(*a, **k):
        made.append(1)
        return real(*a, **k)
    monkeypatch.setattr(executor, "prepare_walk", counted)
    return made


def test_alternating_relations_stay_warm(monkeypatch):
    layer, graphs = Weighted(), _relations(3)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 4))
    w = rng.standard_normal((160, 1))
    made = _counting(monkeypatch)
    for _ in range(3):
        for g in graphs:
            got = np.asarray(layer(graph=g, src={"x": x}, edge={"w": w}))
            want = np.asarray(layer.reference(graph=g, src={"x": x}, edge={"w": w}))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert len(made) == len(graphs)      # one list per relation, made on its first call


def test_at_most_a_few_lists_are_kept(monkeypatch):
    layer = Weighted()
    count = interpreter.PREPARED_PER_PROGRAM + 3
    graphs = _relations(count)
    x, w = np.ones((40, 2)), np.ones((160, 1))
    made = _counting(monkeypatch)
    for _ in range(2):
        for g in graphs:
            layer(graph=g, src={"x": x}, edge={"w": w})
    # more relations than lists: the oldest are pushed out, so round two prepares again
    assert len(made) == 2 * count
    kept = [preps for _, preps in program_cache.entries("prepared")]
    assert max(len(p) for p in kept) == interpreter.PREPARED_PER_PROGRAM
