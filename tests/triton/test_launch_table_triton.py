"""Triton propagate kernels launch through the runtime's backend table: a recording backend
registered for target "triton" sees every launch of a cold call (TritonPlan.run), of warm
calls (the prepared launch list) and of the split path (rows above the split degree: two
more kernels in one launch), each with the Kernel op the plan rendered. Then the fixed
kernels (attention forward and backward, kNN selection, tile matmul) launch through the table
too, as FixedKernels named by their source. Oracle: the reference interpreter (numpy for the
matmul)."""
from __future__ import annotations

import threading

import numpy as np

import tiga as tg
from tiga.lower import pipeline
from tiga.testing import recording, reference_grad
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


# ---- one lowering per call signature -------------------------------------------------------

def _lowerings(monkeypatch) -> list:
    """The names of the outermost calls into tiga.lower.pipeline's functions from now on
    (appended to the list returned; nested calls are the same lowering)."""
    calls, depth = [], threading.local()

    def wrap(name, fn):
        def counted(*args, **kwargs):
            outer = getattr(depth, "n", 0)
            if outer == 0:
                calls.append(name)
            depth.n = outer + 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.n = outer
        return counted

    for name, fn in list(vars(pipeline).items()):
        if (callable(fn) and getattr(fn, "__module__", None) == pipeline.__name__
                and not isinstance(fn, type) and name not in ("quiet_dumps", "module_name")):
            monkeypatch.setattr(pipeline, name, wrap(name, fn))
    return calls


def test_a_triton_call_lowers_once_for_its_target_and_warm_calls_never(interpreter,
                                                                         monkeypatch):
    """The call's binding (the relation's index dtype, a CSR walk) is lowered with the whole
    program for target triton: the kernels render the Kernel ops of that one lowering, and
    the gradient's transposed walks come from its own (at most two: forward and backward)."""
    rng = np.random.default_rng(3)
    kw, layer = _call(rng, 60, 240), Weighted()
    want = np.asarray(layer.reference(**kw))
    calls = _lowerings(monkeypatch)
    with recording("triton") as rec:
        np.testing.assert_allclose(np.asarray(layer(**kw)), want, rtol=1e-5, atol=1e-6)
        layer(**kw)
    assert calls == ["lower_call"]
    assert {op.target for op in rec.launched} == {"triton"}

    def loss(x):
        return tg.math.sum(layer(graph=kw["graph"], src={"x": x}, edge=kw["edge"]) ** 2)

    x = kw["src"]["x"]
    step = tg.jit(tg.grad(loss))
    calls.clear()
    got = np.asarray(step(x))
    assert 1 <= len(calls) <= 2 and set(calls) == {"lower_call"}, calls
    calls.clear()
    step(x)
    assert calls == []
    np.testing.assert_allclose(got, np.asarray(reference_grad(loss)(x)), rtol=1e-4,
                               atol=1e-4)


# ---- the fixed kernels: attention, kNN selection, tile matmul ------------------------------

class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((dst.query * src.key).sum(dim=-1), src.value)


def _fixed(rec) -> list:
    return sorted({op.name for op in rec.launched if type(op).__name__ == "FixedKernel"})


def test_attention_forward_and_gradient_launch_through_the_table(interpreter):
    rng = np.random.default_rng(2)
    n, d = 24, 8
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    g = tg.Graph.triangular(n)

    def loss(q, k, v):
        y = Attention()(graph=g, src={"key": k, "value": v}, dst={"query": q})
        return tg.math.sum(y * y)

    with recording("triton") as rec:
        got = tg.grad(loss, argnums=(0, 1, 2))(q, k, v)
    want = reference_grad(loss, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10)
    assert {"triton_attention.attn_fwd", "triton_attention.attn_bwd_kv",
            "triton_attention.attn_bwd_q"} <= set(_fixed(rec)), _fixed(rec)


def test_knn_selection_launches_through_the_table(interpreter):
    rng = np.random.default_rng(3)
    pos, x = rng.random((40, 2)), rng.standard_normal((40, 3))

    class Near(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x

    kw = dict(graph=tg.Graph.knn(pos, 5), src={"x": x}, dst={}, edge={})
    with recording("triton") as rec:
        got = np.asarray(Near()(**kw))
    np.testing.assert_allclose(got, np.asarray(Near().reference(**kw)), rtol=1e-12)
    assert any(name.startswith("triton_knn") for name in _fixed(rec)), _fixed(rec)


def test_tile_matmul_launches_through_the_table():
    from tiga.xla_free_runtime.backends.triton import linear

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((37, 5)), rng.standard_normal((5, 9))
    with recording("triton") as rec:
        got = linear.matmul(x, y, (1, 0), "float64", "triton-interpreter")
    np.testing.assert_allclose(got, x @ y, rtol=1e-12)
    assert _fixed(rec) == ["triton_linear.tile_matmul"]
