"""Caches keyed by the id of an object a function closes over must check the object is still
the same one: CPython reuses a dead object's id at once, so a loop body rebuilt per call (a
new lambda over new operands, often at the dead one's address) must never reuse the trace of
the old one. Oracle: numpy."""
from __future__ import annotations

import numpy as np

import tiga as tg


class Mean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def test_an_eager_loop_body_rebuilt_per_call_never_reuses_a_stale_trace():
    rng = np.random.default_rng(0)
    layer = Mean()
    n = 30
    for trial in range(12):
        src, dst = rng.integers(0, n, 120), rng.integers(0, n, 120)
        g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
        w = rng.standard_normal((120, 1))
        x = rng.standard_normal((n, 3))

        def step(graph, weights):
            return lambda s: 0.5 * layer(graph=graph, src={"x": s}, edge={"w": weights})

        got = np.asarray(tg.repeat(2, step(g, w), x))
        want = x
        for _ in range(2):
            msg = want[src] * w
            total = np.zeros((n, 3))
            np.add.at(total, dst, msg)
            count = np.bincount(dst, minlength=n)[:, None]
            want = 0.5 * np.where(count > 0, total / np.maximum(count, 1), 0.0)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"trial {trial}")
        del g, w, x, step
