"""Triton propagate kernels launch through the runtime's backend table: a recording backend
registered for target "triton" sees every launch of a cold call (TritonPlan.run), of warm
calls (the prepared launch list) and of the split path (rows above the split degree: two
more kernels in one launch), each with the Kernel op the plan rendered. Oracle: the
reference interpreter."""
from __future__ import annotations

import numpy as np

import tiga as tg
from tiga.testing import recording
from tiga.xla_free_runtime.backends import BACKENDS


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _call(rng, n, e, heavy=0):
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if heavy:
        dst = np.concatenate([dst, np.zeros(heavy, dst.dtype)])   # row 0: a heavy row
        src = np.concatenate([src, rng.integers(0, n, heavy)])
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)
    return dict(graph=g, src={"x": rng.standard_normal((n, 3)).astype(np.float32)},
                edge={"w": rng.standard_normal((g.num_edges, 1)).astype(np.float32)})


def test_the_triton_backend_is_in_the_table():
    assert BACKENDS["triton"].target == "triton"
    assert all(callable(getattr(BACKENDS["triton"], a)) for a in ("render", "compile",
                                                                  "launch"))


def test_cold_and_warm_calls_launch_through_the_table(interpreter):
    rng = np.random.default_rng(0)
    kw, layer = _call(rng, 50, 300), Weighted()
    want = np.asarray(layer.reference(**kw))
    with recording("triton") as rec:
        for _ in range(3):
            np.testing.assert_allclose(np.asarray(layer(**kw)), want, rtol=1e-5, atol=1e-6)
    assert len(rec.launched) == 3
    assert {op.target for op in rec.launched} == {"triton"}
    assert len({str(op) for op in rec.launched}) == 1     # one kernel, launched each call


def test_the_split_path_launches_through_the_table(interpreter):
    rng = np.random.default_rng(1)
    kw, layer = _call(rng, 40, 120, heavy=5000), Weighted()
    want = np.asarray(layer.reference(**kw))
    with recording("triton") as rec:
        np.testing.assert_allclose(np.asarray(layer(**kw)), want, rtol=1e-4, atol=1e-5)
    assert len(rec.launched) >= 2 and {op.target for op in rec.launched} == {"triton"}
