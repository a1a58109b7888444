"""Attention in the program route under triton-interpreter: an online_softmax attention
MessagePassing layer (forward with its row statistics, fused dk/dv/dq VJP) runs the Triton
attention kernels: multi-head, head widths that are not powers of two, a value width other
than the key width, non-square dense relations, float32 and float64. Oracles: the reference
interpreter (forward) and a float64 torch masked-softmax (tg.grad and torch autograd)."""
import numpy as np
import pytest
import torch

import tiga as tg
from tiga.xla_free_runtime.backends.triton import attention as triton_attention


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


def relation(kind, n, m):
    if kind == "dense":
        return tg.Graph.dense(m, n)        # m sources, n destinations
    if kind == "triangular":
        return tg.Graph.triangular(n)
    return tg.Graph.cu_seqlens([0, 4, 4, n], causal=kind == "causal")


def mask_of(g) -> torch.Tensor:
    rp, ci = g.resolve_csr()
    m = np.zeros((g.num_dst, g.num_src), bool)
    m[np.repeat(np.arange(g.num_dst), np.diff(rp)), ci] = True
    return torch.from_numpy(m)


def oracle(q, k, v, mask, scale):
    """Masked softmax attention in float64 torch, (N, H, D) or (N, D); empty rows give 0."""
    single = q.dim() == 2
    if single:
        q, k, v = (x.unsqueeze(1) for x in (q, k, v))
    s = (q.transpose(0, 1) @ k.transpose(0, 1).transpose(-1, -2)) * scale
    w = torch.softmax(s.masked_fill(~mask, -torch.inf), -1).nan_to_num(0.0)
    y = (w @ v.transpose(0, 1)).transpose(0, 1)
    return y.squeeze(1) if single else y


@pytest.fixture
def counted(monkeypatch):
    """The kinds of attention propagates the Triton attention kernels ran."""
    calls = []
    run = triton_attention.TritonAttentionPlan.run

    def spy(self, *args):
        calls.append(self.kind)
        return run(self, *args)

    monkeypatch.setattr(triton_attention.TritonAttentionPlan, "run", spy)
    return calls


CASES = [("dense", 19, 23, 2, 12, 5, np.float64), ("triangular", 20, 20, 0, 16, 16, np.float32),
         ("causal", 18, 18, 3, 7, 7, np.float64), ("full", 17, 17, 1, 20, 9, np.float32)]


@pytest.mark.parametrize("kind,n,m,heads,d,dv,dtype", CASES)
def test_grad_through_attention_layer(interpreter, counted, kind, n, m, heads, d, dv, dtype):
    g = relation(kind, n, m)
    rng = np.random.default_rng(n * d + heads)
    lead = (heads,) if heads else ()
    q = rng.standard_normal((n,) + lead + (d,)).astype(dtype)
    k = rng.standard_normal((m,) + lead + (d,)).astype(dtype)
    v = rng.standard_normal((m,) + lead + (dv,)).astype(dtype)
    ct = rng.standard_normal((n,) + lead + (dv,)).astype(dtype)
    layer, scale = Attention(), 0.4

    def loss(q, k, v):
        y = layer(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=scale)
        return (y * ct).sum()

    y = layer(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=scale)
    want_y = layer.reference(graph=g, src={"key": k, "value": v}, dst={"query": q},
                             scale=scale)
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), **tol)
    got = tg.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert counted == ["forward", "forward", "dkdvq"]
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    want = torch.autograd.grad(oracle(*ts, mask_of(g), scale), ts, torch.tensor(ct).double())
    for name, a, b in zip("qkv", got, want):
        np.testing.assert_allclose(np.asarray(a), b.numpy(), err_msg=f"d{name}", **tol)


def test_torch_autograd_and_explain(interpreter, counted):
    n, heads, d = 21, 2, 24
    g = relation("triangular", n, n)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, heads, d, generator=gen).requires_grad_() for _ in range(3))
    ct = torch.randn(n, heads, d, generator=gen)
    layer = Attention()
    ops = dict(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=d ** -0.5)
    text = str(layer.explain(**ops))
    assert "route:      triton-interpreter" in text and "tiled Triton attention" in text
    assert "block_rows=16, block_neighbors=16, num_warps=4, num_stages=1" in text
    y = layer(**ops)
    grads = torch.autograd.grad(y, (q, k, v), ct)
    assert "forward" in counted and any(c in ("dkdv", "dkdvq", "dq") for c in counted)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want_y = oracle(*ref, mask_of(g), d ** -0.5)
    want = torch.autograd.grad(want_y, ref, ct.double())
    torch.testing.assert_close(y.detach().double(), want_y.detach(), rtol=2e-4, atol=2e-5)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-5)
