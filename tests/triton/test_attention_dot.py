"""The attention kernels' tile products as tl.dot on the fields' own dtype (in Triton's
interpreter): float16 and bfloat16 operands (tensor cores on a GPU) accumulate in float32,
float32 stays exact float32 unless TIGA_TF32=1 asks for TF32. Head widths that are not
multiples of 16, several heads, and sequences that leave a query block half empty.

Oracles: torch SDPA in float64 with the relation's mask (forward and backward kernels), the
reference interpreter (the program route). float16 is compared loosely (its operands carry
11 bits), float32 tightly."""
import numpy as np
import pytest
import torch

import tiga as tg
from tiga.lower.schedule import triton_attention_blocks, triton_dot_precision
from tiga.xla_free_runtime.backends.triton import attention as triton_attention
from tiga.xla_free_runtime.backends.triton.attention import (
    attention_backward,
    attention_forward,
)


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


def relation(kind, n):
    if kind == "dense":
        return tg.Graph.dense(n)
    if kind == "triangular":
        return tg.Graph.triangular(n)
    return tg.Graph.cu_seqlens([0, 5, 5, n], causal=True)   # (an empty sequence)


def sdpa(q, k, v, g, scale, do):
    """float64 SDPA over the relation's mask, its output and (dq, dk, dv) for cotangent do."""
    rp, ci = g.resolve_csr()
    mask = np.zeros((g.num_dst, g.num_src), bool)
    mask[np.repeat(np.arange(g.num_dst), np.diff(rp)), ci] = True
    ts = [x.double().transpose(0, 1).requires_grad_() for x in (q, k, v)]
    y = torch.nn.functional.scaled_dot_product_attention(
        *ts, attn_mask=torch.from_numpy(mask)[None], scale=scale)
    grads = torch.autograd.grad(y, ts, do.double().transpose(0, 1))
    return y.detach().transpose(0, 1), [x.transpose(0, 1) for x in grads]


TOL = {torch.float16: dict(rtol=2e-2, atol=2e-2), torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
       torch.float32: dict(rtol=1e-5, atol=1e-5)}
CASES = [("dense", 23, 2, 12, torch.float16), ("triangular", 35, 1, 24, torch.float16),
         ("cu_seqlens", 30, 2, 16, torch.bfloat16), ("triangular", 19, 2, 40, torch.float32)]


@pytest.mark.parametrize("kind,n,heads,d,dtype", CASES)
def test_kernels_forward_and_backward_match_float64_sdpa(kind, n, heads, d, dtype):
    g = relation(kind, n)
    gen = torch.Generator().manual_seed(n + d)
    q, k, v, do = (torch.randn(n, heads, d, generator=gen).to(dtype) for _ in range(4))
    scale = d ** -0.5
    o, lse = attention_forward(q, k, v, g, scale)
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, g, scale)
    assert o.dtype == dq.dtype == dtype and lse.dtype == torch.float32
    want, grads = sdpa(q, k, v, g, scale, do)
    torch.testing.assert_close(o.double(), want, **TOL[dtype])
    for name, got, ref in zip("qkv", (dq, dk, dv), grads):
        torch.testing.assert_close(got.double(), ref, **TOL[dtype], msg=f"d{name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_program_route_runs_the_tiled_kernels_in_the_fields_dtype(interpreter, dtype):
    n, heads, d = 21, 2, 20
    g = relation("cu_seqlens", n)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, heads, d, generator=gen).to(dtype) for _ in range(3))
    layer = Attention()
    ops = dict(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.3)
    text = str(layer.explain(**ops))
    assert "tiled Triton attention kernels" in text
    assert ("tensor cores" in text) == (dtype == torch.float16)
    y = layer(**ops)
    assert y.dtype == dtype
    ref = layer.reference(graph=g, src={"key": k.numpy(), "value": v.numpy()},
                          dst={"query": q.numpy()}, scale=0.3)
    want, _ = sdpa(q, k, v, g, 0.3, torch.zeros(n, heads, d))
    torch.testing.assert_close(y.double(), want, **TOL[dtype])
    # the reference interpreter computes float16 in float16: within its rounding too
    np.testing.assert_allclose(y.double().numpy(), np.asarray(ref, np.float64),
                               **({"rtol": 2e-2, "atol": 2e-2} if dtype == torch.float16
                                  else {"rtol": 1e-5, "atol": 1e-6}))


def test_tf32_only_when_asked(monkeypatch):
    g = relation("dense", 17)
    x32 = torch.zeros(17, 16)
    monkeypatch.delenv("TIGA_TF32", raising=False)
    launch = triton_attention._Launch(x32, x32, x32, g, 1.0, "triton-interpreter")
    assert launch.const["PREC"] == "ieee" and str(launch.const["IT"]) == "fp32"
    monkeypatch.setenv("TIGA_TF32", "1")
    launch = triton_attention._Launch(x32, x32, x32, g, 1.0, "triton-interpreter")
    assert launch.const["PREC"] == "tf32"
    x16 = x32.half()
    launch = triton_attention._Launch(x16, x16, x16, g, 1.0, "triton-interpreter")
    assert str(launch.const["IT"]) == "fp16" and str(launch.const["CT"]) == "fp32"
    x64 = x32.double()
    launch = triton_attention._Launch(x64, x64, x64, g, 1.0, "triton-interpreter")
    assert launch.const["PREC"] == "ieee" and str(launch.const["CT"]) == "fp64"
    mixed = triton_attention._Launch(x16, x32, x16, g, 1.0, "triton-interpreter")
    assert str(mixed.const["IT"]) == "fp32"   # (mixed fields multiply in float32)


def test_gpu_blocks_fit_the_head_width():
    assert triton_attention_blocks(2, 64, interpreter=True) == (16, 16, 4, 1)
    for itemsize in (2, 4, 8):
        for width in (16, 64, 128, 256):
            bm, bn, warps, stages = triton_attention_blocks(itemsize, width, False)
            assert bm >= 32 and bn >= 16 and (bm * width <= 8192 or bm == 32)
    assert triton_dot_precision("float16", True) == "ieee"   # (no TF32 for half operands)
    assert triton_dot_precision("float32", False) == "ieee"
