"""Edge MLPs under triton-interpreter: a concatenation and two small dot_generals per edge,
whose vector-matrix products reshape (1, K) -> (K,) around a padded row (K = 6 pads to 8:
only unit axes move), forward and gradients against the reference interpreter; and the
lowering a warm call reuses (the Kernel stage runs once per kernel structure and relation
type)."""
import weakref

import numpy as np

import tiga as tg
from tiga.testing import reference_grad
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime.backends.triton import launch as triton_launch
from tiga.xla_free_runtime.caches import equations as equation_cache
from tiga.xla_free_runtime.caches import programs as program_cache


class EdgeConv(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge, w1, w2):
        hidden = tg.math.relu(tg.math.concatenate([src.x, dst.x - src.x], axis=-1) @ w1)
        return hidden @ w2


def operands(seed=7):
    rng = np.random.default_rng(seed)
    n, deg = 12, 3
    g = tg.Graph.from_csr(np.arange(n + 1) * deg, rng.integers(0, n, n * deg), num_src=n)
    return g, rng.normal(size=(n, 5)), rng.normal(size=(10, 16)) / 3, \
        rng.normal(size=(16, 6)) / 4


def call(g, x, w1, w2, reference=False):
    layer = EdgeConv()
    fn = layer.reference if reference else layer
    return fn(graph=g, src={"x": x}, dst={"x": x}, w1=w1, w2=w2)


def test_two_layer_edge_mlp_forward_and_grad(interpreter):
    g, x, w1, w2 = operands()
    np.testing.assert_allclose(np.asarray(call(g, x, w1, w2)),
                               np.asarray(call(g, x, w1, w2, reference=True)),
                               rtol=1e-10, atol=1e-12)
    got = tg.grad(lambda *a: call(g, *a).sum(), argnums=(0, 1, 2))(x, w1, w2)
    want = reference_grad(lambda *a: call(g, *a, reference=True).sum(),
                          argnums=(0, 1, 2))(x, w1, w2)
    for a, b, name in zip(got, want, ("x", "w1", "w2")):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-8, atol=1e-10,
                                   err_msg=name)


def test_a_warm_call_reuses_its_lowering(interpreter, monkeypatch):
    g, x, w1, w2 = operands(3)
    lowered = []
    lower = executor.pipeline.lower_call   # (the executor lowers the call for its target)

    def counted(*args, **kwargs):
        if kwargs.get("target") == "triton":
            lowered.append(args[0])
        return lower(*args, **kwargs)

    monkeypatch.setattr(executor.pipeline, "lower_call", counted)
    monkeypatch.setattr(equation_cache, "_MEMOS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(program_cache, "_MEMOS", {})     # (walks: lowered afresh)
    monkeypatch.setattr(triton_launch, "_PLANS", {})
    layer = EdgeConv()
    # (jit: one program, whose walk is kept; a bare layer call whose trace captures an array
    # is traced, and lowered, again each call: trace/call_cache stores no captured arrays)
    f = tg.jit(lambda g, x: layer(graph=g, src={"x": x}, dst={"x": x}, w1=w1, w2=w2))
    f(g, x)
    n = len(lowered)
    assert n == 1                                           # the call, lowered whole
    again = np.asarray(f(g, 2.0 * x))
    assert len(lowered) == n                                # lowered once, reused
    np.testing.assert_allclose(again, np.asarray(call(g, x * 2.0, w1, w2, reference=True)),
                               rtol=1e-10, atol=1e-12)
    rp, ci = g.resolve_csr()
    other = tg.Graph.from_csr(rp, ci.astype(np.int32), num_src=g.num_src)   # another type
    np.testing.assert_allclose(np.asarray(f(other, x)),
                               np.asarray(call(other, x, w1, w2, reference=True)),
                               rtol=1e-10, atol=1e-12)
    assert len(lowered) == n + 1                            # lowered for it anew
