"""opt/hoist_linear on the numpy / tg.Tensor path: MessagePassing calls, tg.jit and tg.grad
run the edge-loop rewrites (parameter-only work hoisted, first Linear on entity rows, last
Linear after the sum) and still compute the same values and gradients.

Oracles: numpy on an explicit edge list, the reference interpreter on the program as
staged (rewrites off), float64 central finite differences for gradients.
"""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.core.eval import eval_program
from tiga.opt import PROGRAM_PASSES, hoist_linear_projections
from tiga.trace import call_cache

N, F, H, OUT = 18, 4, 12, 3


def relation(seed=0):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 6, N)
    deg[2] = 0
    row_ptr = np.concatenate([[0], np.cumsum(deg)])
    col = rng.integers(0, N, int(deg.sum()))
    return tg.Graph.from_csr(row_ptr, col, num_src=N), col, np.repeat(np.arange(N), deg)


def weights(seed=1):
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(size=(H, 3 + F)) / 3, "b1": rng.normal(size=H),
            "w2": rng.normal(size=(H, OUT)) / 3, "b2": rng.normal(size=OUT)}


class EdgeMLP(tg.MessagePassing):
    """[p_j - p_i; x_j] W1^T + b1 -> tanh -> W2 + b2, weights as keyword params; W1 stored
    (out, in) and transposed inside the edge function (parameter-only work)."""

    reducer = tg.sum()

    def edge(self, src, dst, edge, w1, b1, w2, b2):
        h = tg.math.concatenate([src.pos - dst.pos, src.x], axis=-1)
        h = tg.math.tanh(tg.math.add(tg.math.matmul(h, tg.math.transpose(w1)), b1))
        return tg.math.add(tg.math.matmul(h, w2), b2)


def numpy_oracle(pos, x, col, dst, w1, b1, w2, b2):
    h = np.tanh(np.concatenate([pos[col] - pos[dst], x[col]], axis=-1) @ w1.T + b1)
    out = np.zeros((N, OUT))
    np.add.at(out, dst, h @ w2 + b2)
    return out


def data(seed=2):
    rng = np.random.default_rng(seed)
    return rng.random((N, 3)), rng.normal(size=(N, F))


def test_message_passing_call_is_rewritten_and_matches_numpy():
    graph, col, dst = relation()
    pos, x = data()
    w = weights()
    layer = EdgeMLP()
    kw = dict(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos}, **w)
    text = "\n".join(layer.explain(**kw).traversal)
    assert "parameter-only operation(s) of the edge function (transpose)" in text
    assert "hoisted the first Linear (7 -> 12)" in text
    assert "moved the last Linear (12 -> 3) after the sum" in text
    np.testing.assert_allclose(np.asarray(layer(**kw)), numpy_oracle(pos, x, col, dst, **w),
                               rtol=1e-10, atol=1e-12)


def test_rewritten_program_matches_the_reference_interpreter_on_the_staged_one():
    graph, _, _ = relation(seed=4)
    pos, x = data(seed=5)
    call = EdgeMLP()._call(graph, {"pos": pos, "x": x}, {"pos": pos}, None, weights(seed=6))
    program, args = call.staged_program()
    rewritten, notes = hoist_linear_projections(program)
    assert len(notes) == 3 and rewritten is not program
    want = eval_program(program, *args)
    got = eval_program(rewritten, *args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)


def loss_fn(pos, x, w1, b1, w2, b2, graph):
    out = EdgeMLP()(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos},
                    w1=w1, b1=b1, w2=w2, b2=b2)
    return tg.math.sum(out * out)


@pytest.mark.parametrize("rewrite", [True, False])
def test_grad_through_rewritten_calls_matches_finite_differences(rewrite, monkeypatch):
    applied = []
    if rewrite:
        def spy(program, facts):
            out = hoist_linear_projections(program)
            applied.extend(out[1])
            return out
        monkeypatch.setitem(PROGRAM_PASSES, "hoist_linear", spy)
    else:   # the same run with the rewrites off: both must agree with the oracle
        monkeypatch.setitem(PROGRAM_PASSES, "hoist_linear", lambda p, facts: (p, []))
    graph, col, dst = relation(seed=7)
    pos, x = data(seed=8)
    w = weights(seed=9)
    args = [pos, x, w["w1"], w["b1"], w["w2"], w["b2"]]
    grads = tg.grad(lambda *a: loss_fn(*a, graph), argnums=(0, 1, 2, 3, 4, 5))(*args)
    assert len(applied) == (3 if rewrite else 0)   # the relation is a literal here

    def oracle(*a):
        out = numpy_oracle(a[0], a[1], col, dst, *a[2:])
        return float((out * out).sum())

    rng = np.random.default_rng(0)
    eps = 1e-6
    for k, (a, g) in enumerate(zip(args, grads)):
        g = np.asarray(g)
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in a.shape)
            plus = [b.copy() for b in args]
            minus = [b.copy() for b in args]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            fd = (oracle(*plus) - oracle(*minus)) / (2 * eps)
            np.testing.assert_allclose(g[idx], fd, rtol=1e-5, atol=1e-7)


def test_jit_runs_the_rewritten_program():
    graph, col, dst = relation(seed=10)
    pos, x = data(seed=11)
    w = weights(seed=12)

    @tg.jit
    def f(graph, pos, x, w1, b1, w2, b2):
        return EdgeMLP()(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos},
                         w1=w1, b1=b1, w2=w2, b2=b2)

    text = f.lower(graph, pos, x, *w.values()).ir("program")
    assert "degrees" in text   # the last layer's bias became degree x b2 after the sum
    np.testing.assert_allclose(np.asarray(f(graph, pos, x, *w.values())),
                               numpy_oracle(pos, x, col, dst, **w), rtol=1e-10, atol=1e-12)


def test_cached_calls_reuse_the_rewritten_program():
    graph, col, dst = relation(seed=13)
    pos, x = data(seed=14)
    layer = EdgeMLP()
    for seed in (15, 16):   # new weight values through the same cached program
        w = weights(seed=seed)
        out = layer(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos}, **w)
        np.testing.assert_allclose(np.asarray(out), numpy_oracle(pos, x, col, dst, **w),
                                   rtol=1e-10, atol=1e-12)
    hits = call_cache.STATS["hits"]
    layer(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos}, **weights())
    assert call_cache.STATS["hits"] == hits + 1
