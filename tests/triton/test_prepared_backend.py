"""A warm call's prepared launch list belongs to the backend it was prepared on: after
tg.config.backend changes, calls run on the new backend (a cpu-llvm list must not answer a
triton call), and the triton route's own warm calls run its held plan (the first through
TritonPlan.run, the next through its prepared launch, backends/triton/prepared.py). Oracle:
the reference interpreter."""
from __future__ import annotations

import numpy as np

import tiga as tg
from tiga.xla_free_runtime.backends.triton import launch as triton_launch
from tiga.xla_free_runtime.backends.triton import prepared as triton_prepared


class Weighted(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def test_a_backend_switch_takes_the_new_backend(monkeypatch):
    rng = np.random.default_rng(4)
    n, e = 40, 200
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    kw = dict(graph=g, src={"x": rng.standard_normal((n, 4)).astype(np.float32)},
              edge={"w": rng.standard_normal((e, 1)).astype(np.float32)})
    layer = Weighted()
    want = np.asarray(layer.reference(**kw))
    for _ in range(2):                                 # the cpu-llvm list is prepared
        np.testing.assert_allclose(np.asarray(layer(**kw)), want, rtol=1e-6)
    ran, warm = [], []
    real, real_warm = triton_launch.TritonPlan.run, triton_prepared.PreparedTritonLaunch.run
    monkeypatch.setattr(triton_launch.TritonPlan, "run",
                        lambda self, *a: ran.append(1) or real(self, *a))
    monkeypatch.setattr(triton_prepared.PreparedTritonLaunch, "run",
                        lambda self, *a: warm.append(1) or real_warm(self, *a))
    monkeypatch.setattr(tg.config, "backend", "triton-interpreter")
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(layer(**kw)), want, rtol=1e-6)
    assert (len(ran), len(warm)) == (1, 2)
