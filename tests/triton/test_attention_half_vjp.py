"""A float16 attention layer's VJP on the Triton route runs the tiled (tl.dot) attention
backward kernels: traced for a Triton backend, its gradient is the canonical dq / dk, dv
propagates (autodiff.rules.attention.vjp_dtypes), which the Triton attention plan claims,
and its forward is paired with the row statistics they read (opt.attention_pairing).
Traced for cpu-llvm it keeps the generic VJP (that route has no 16-bit attention kernels).

Oracles: float64 torch masked-softmax attention and its autograd (float16 tolerances: the
operands carry 11 bits), the explain() of the gradient program, and the kernels that ran."""
import numpy as np
import pytest
import torch

import tiga as tg
from tiga.xla_free_runtime.backends.triton import attention as triton_attention


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(axis=-1) * scale, src.value)


def oracle_grads(q, k, v, ct, g, scale):
    """d(sum(y * ct))/d(q, k, v) of float64 masked-softmax attention over g's edges."""
    rp, ci = g.resolve_csr()
    mask = np.zeros((g.num_dst, g.num_src), bool)
    mask[np.repeat(np.arange(g.num_dst), np.diff(rp)), ci] = True
    ts = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v)]
    s = torch.einsum("nhd,mhd->hnm", ts[0], ts[1]) * scale
    w = torch.softmax(s.masked_fill(~torch.from_numpy(mask), -torch.inf), -1).nan_to_num(0.0)
    y = torch.einsum("hnm,mhd->nhd", w, ts[2])
    return [t.numpy() for t in torch.autograd.grad((y * torch.tensor(ct).double()).sum(), ts)]


def problem(kind, n, heads, d, seed):
    g = tg.Graph.dense(n) if kind == "dense" else tg.Graph.triangular(n)
    rng = np.random.default_rng(seed)
    q, k, v, ct = (rng.standard_normal((n, heads, d)).astype(np.float16) for _ in range(4))
    return g, q, k, v, ct


def loss_of(g, ct, scale):
    layer = Attention()

    def loss(q, k, v):
        y = layer(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=scale)
        return tg.math.sum(tg.math.convert(y, tg.float32) * ct.astype(np.float32))
    return loss


@pytest.fixture
def kernels(monkeypatch):
    """The kinds of propagates the Triton attention kernels ran."""
    ran = []
    run = triton_attention.TritonAttentionPlan.run

    def spy(self, *args):
        ran.append(self.kind)
        return run(self, *args)

    monkeypatch.setattr(triton_attention.TritonAttentionPlan, "run", spy)
    return ran


@pytest.mark.parametrize("kind,n,heads,d", [("triangular", 27, 2, 16), ("dense", 20, 1, 12)])
def test_float16_grad_runs_the_tiled_backward(interpreter, kernels, kind, n, heads, d):
    g, q, k, v, ct = problem(kind, n, heads, d, seed=n + d)
    scale = d ** -0.5
    grad = tg.grad(loss_of(g, ct, scale), argnums=(0, 1, 2))
    text = str(tg.jit(grad).lower(q, k, v).compile().explain())
    assert "attention VJP dk, dv (by src) and dq (by dst)" in text
    assert "tl.dot on float16 operands (tensor cores" in text
    # the forward returns its row statistics (opt.attention_pairing): no generic row max /
    # mass walk, every propagate of the gradient is a tiled attention kernel
    assert "propagate[online_softmax(stats)]" in text
    assert "rendered as a fused Triton kernel" not in text and "reference" not in text
    got = grad(q, k, v)
    assert kernels == ["forward", "dkdvq"]
    for name, a, b in zip("qkv", got, oracle_grads(q, k, v, ct, g, scale)):
        a = np.asarray(a)
        assert a.dtype == np.float16
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=3e-2, atol=3e-2,
                                   err_msg=f"d{name}")


def test_cpu_llvm_keeps_the_generic_float16_vjp(kernels):
    """Traced for cpu-llvm: no canonical attention propagate, nothing falls back, and the
    gradient agrees with the oracle as before."""
    g, q, k, v, ct = problem("triangular", 22, 2, 16, seed=5)
    old = tg.config._backend
    tg.config.backend = "cpu-llvm"
    try:
        grad = tg.grad(loss_of(g, ct, 0.25), argnums=(0, 1, 2))
        text = str(tg.jit(grad).lower(q, k, v).compile().explain())
        assert "attn." not in str(tg.jit(grad).lower(q, k, v).ir("program"))
        assert "route:      cpu-llvm" in text and "reference" not in text
        got = grad(q, k, v)
    finally:
        tg.config.backend = old
    assert kernels == []
    for name, a, b in zip("qkv", got, oracle_grads(q, k, v, ct, g, 0.25)):
        np.testing.assert_allclose(np.asarray(a).astype(np.float64), b, rtol=3e-2,
                                   atol=3e-2, err_msg=f"d{name}")


def test_torch_autograd_float16_runs_the_tiled_backward(interpreter, kernels):
    """The torch bridge (its VJP traced at backward time, on the selected backend)."""
    n, heads, d = 21, 2, 16
    g = tg.Graph.triangular(n)
    gen = torch.Generator().manual_seed(0)
    q, k, v, ct = (torch.randn(n, heads, d, generator=gen).half() for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    y = Attention()(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=d ** -0.5)
    grads = torch.autograd.grad(y, (q, k, v), ct)
    assert kernels == ["forward", "dkdvq"] and y.dtype == torch.float16
    want = oracle_grads(*(t.detach().numpy() for t in (q, k, v)), ct.numpy(), g, d ** -0.5)
    for name, a, b in zip("qkv", grads, want):
        np.testing.assert_allclose(a.double().numpy(), b, rtol=3e-2, atol=3e-2,
                                   err_msg=f"d{name}")
