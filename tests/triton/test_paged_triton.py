"""A paged (stored) relation under a Triton backend pages (issue 28 item 3): its pages run the
Triton kernel rendered once for the page-local CSR, forward and gradient, in Triton's
interpreter on CPU. Two routes are checked: pages on the host (no device tier here: the
interpreter reads the host page buffers), and pages streamed host -> device through the device
tier, double-buffered, under the "device" budget, against the stand-in CUDA runtime of
test_device_tier (its "device memory" is host memory, so the interpreter reads it in place).
Oracle: the reference interpreter on the same relation held in memory."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tiga as tg
from tiga.lower.ir.task import TaskLaunchOp, TransferOp, parse_task

pytest.importorskip("zarr", minversion="3.1")

N, K, F = 300, 4, 3


class Mix(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.b


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    rng = np.random.default_rng(3)
    rp = np.arange(N + 1, dtype=np.int64) * K
    ci = rng.integers(0, N, N * K).astype(np.int32)
    x = rng.normal(size=(N, F)).astype(np.float32)
    b = rng.normal(size=(N, F)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, size=(N * K, 1)).astype(np.float32)
    path = tmp_path_factory.mktemp("paged_triton") / "s"
    with tg.store.create(path, num_src=N, num_dst=N, overwrite=True) as wr:
        wr.append_csr_chunk(rp[:151], ci[:rp[150]])
        wr.append_csr_chunk(rp[150:] - rp[150], ci[rp[150]:])
        wr.append_field("x", x, role="src")
    mem = tg.Graph.from_csr(rp, ci, num_src=N)
    return path, mem, x, b, w


def call(g, x, b, w):
    return dict(graph=g, src={"x": x}, dst={"b": b}, edge={"w": w})


def test_a_paged_relation_pages_under_the_triton_interpreter(stored, interpreter):
    path, mem, x, b, w = stored
    g = tg.Graph.open(path)
    want = np.asarray(Mix().reference(**call(mem, x, b, w)))
    with tg.scope(page_rows=64), tg.profile() as prof:
        got = np.asarray(Mix()(**call(g, tg.store.open(path)["x"], b, w)))
    (stats,) = prof.measured("paged")
    assert stats.pages == -(-N // 64) and stats.edges == N * K
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
