"""opt/hoist_linear: a field read at several offsets of the first Linear's input
(`[x_dst; x_src - x_dst] W`) is one entity-level product, `x_dst (W_a - W_b)`, so the hoisted
program multiplies each field once per role. Oracles: the reference interpreter on the
program as staged, and torch (float64, an explicit edge list) for the cpu-llvm forward and
tg.grad; float32 against float64 at float32 tolerance."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tiga as tg
from tiga.core.eval import eval_program
from tiga.opt import hoist_linear_projections

N, F, H = 23, 6, 10


class DiffMLP(tg.MessagePassing):
    """EdgeConv's first layer: [x_i; x_j - x_i] W, tanh, summed at the destination."""

    reducer = tg.sum()

    def edge(self, src, dst, edge, w1):
        return tg.math.tanh(tg.math.concatenate([dst.x, src.x - dst.x], axis=-1) @ w1)


class SwapMLP(tg.MessagePassing):
    """Both fields read twice, with both signs: [x_j - x_i; x_i - x_j] W."""

    reducer = tg.sum()

    def edge(self, src, dst, edge, w1):
        return tg.math.tanh(tg.math.concatenate([src.x - dst.x, dst.x - src.x], axis=-1) @ w1)


class DispMLP(tg.MessagePassing):
    """EdgeNN's first layer over a displacement: [p_j - p_i; x_j] W (the positions of a
    radius relation, read once per role)."""

    reducer = tg.sum()

    def edge(self, src, dst, edge, w1):
        return tg.math.tanh(tg.math.concatenate([edge.displacement, src.x], axis=-1) @ w1)


def test_a_displacement_multiplies_its_field_once_for_both_roles(monkeypatch):
    """`(p_src - p_dst) W_a` reads p once per role with opposite signs: the hoisted program
    multiplies p by the same block for both (the negation on the product), so common
    subexpressions share it: a call runs two products (p and x), not three."""
    from tiga.xla_free_runtime import interpreter
    rng = np.random.default_rng(4)
    p, x = torch.tensor(rng.random((N, 3))), torch.tensor(rng.standard_normal((N, F)))
    g = tg.Graph.radius(p, cutoff=0.5)      # (torch operands: the bridge's staged program)
    w = torch.tensor(rng.standard_normal((3 + F, H)))
    layer, ran = DispMLP(), []
    real = interpreter.run_eqn

    def counted(eqn, *rest):
        ran.append(eqn.primitive.name)
        return real(eqn, *rest)
    monkeypatch.setattr(interpreter, "run_eqn", counted)
    got = layer(graph=g, src={"x": x}, w1=w)
    assert ran.count("dot_general") == 2
    want = layer.reference(graph=g, src={"x": x.numpy()}, w1=w.numpy())
    np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-12, atol=1e-12)


def torch_oracle(kind, x, w1, col, dst):
    xs, xd = x[col], x[dst]
    parts = [xd, xs - xd] if kind is DiffMLP else [xs - xd, xd - xs]
    msg = torch.tanh(torch.cat(parts, dim=1) @ w1)
    return torch.zeros(N, w1.shape[1], dtype=x.dtype).index_add_(0, dst, msg)


def problem(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 5, N)
    deg[3] = 0
    rp = np.concatenate([[0], np.cumsum(deg)])
    col = rng.integers(0, N, int(rp[-1])).astype(np.int32)
    g = tg.Graph.from_csr(rp, col, num_src=N)
    x = rng.standard_normal((N, F)).astype(dtype)
    w1 = (rng.standard_normal((2 * F, H)) / 3).astype(dtype)
    return g, x, w1, torch.as_tensor(col.astype(np.int64)), \
        torch.as_tensor(np.repeat(np.arange(N), deg))


def dots(program) -> int:
    return sum(e.primitive.name == "dot_general" for e in program.eqns)


@pytest.mark.parametrize("kind", [DiffMLP, SwapMLP])
def test_one_product_per_field_and_role_exact_on_the_interpreter(kind):
    g, x, w1, _, _ = problem(1)
    program, args = kind()._call(g, {"x": x}, {"x": x}, None, {"w1": w1}).staged_program()
    rewritten, notes = hoist_linear_projections(program)
    assert any("hoisted the first Linear" in n for n in notes)
    assert dots(rewritten) == 2                      # Z_src and Z_dst: one matmul each
    for got, want in zip(eval_program(rewritten, *args), eval_program(program, *args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind", [DiffMLP, SwapMLP])
def test_cpu_llvm_forward_and_grad_match_torch(kind):
    g, x, w1, col, dst = problem(2)
    layer = kind()

    def loss(x, w1):
        out = layer(graph=g, src={"x": x}, dst={"x": x}, w1=w1)
        return tg.math.sum(out * out)

    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w1, requires_grad=True)
    want = torch_oracle(kind, tx, tw, col, dst)
    (want * want).sum().backward()
    got = layer(graph=g, src={"x": x}, dst={"x": x}, w1=w1)
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    gx, gw = tg.grad(loss, argnums=(0, 1))(x, w1)
    np.testing.assert_allclose(np.asarray(gx), tx.grad.numpy(), rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(np.asarray(gw), tw.grad.numpy(), rtol=1e-10, atol=1e-11)


def test_float32_within_float32_rounding_of_float64():
    g, x, w1, col, dst = problem(3, np.float32)
    got = DiffMLP()(graph=g, src={"x": x}, dst={"x": x}, w1=w1)
    assert np.asarray(got).dtype == np.float32
    want = torch_oracle(DiffMLP, torch.tensor(x, dtype=torch.float64),
                        torch.tensor(w1, dtype=torch.float64), col, dst)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=2e-5, atol=2e-5)
