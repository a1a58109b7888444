"""Tiled online-softmax attention in Triton (forward and backward, no atomics) over dense,
triangular and cu_seqlens relations, in the interpreter, against torch SDPA (float64, with
the relation's mask) and its autograd gradients."""
import numpy as np
import pytest
import torch

import tiga as tg
from tiga.xla_free_runtime.backends.triton.attention import (
    attention_backward,
    attention_forward,
)

CASES = [("dense", 37, 16), ("triangular", 40, 32), ("cu_seqlens", 45, 16),
         ("cu_seqlens_full", 33, 32)]


def relation(kind, n):
    if kind == "dense":
        return tg.Graph.dense(n)
    if kind == "triangular":
        return tg.Graph.triangular(n)
    cu = [0, 7, 7, 20, n]       # an empty sequence, a sequence across query blocks
    return tg.Graph.cu_seqlens(cu, causal=kind == "cu_seqlens")


def mask_of(g):
    rp, ci = g.resolve_csr()
    m = np.zeros((g.num_dst, g.num_src), bool)
    m[np.repeat(np.arange(g.num_dst), np.diff(rp)), ci] = True
    return torch.from_numpy(m)


@pytest.mark.parametrize("kind,n,d", CASES)
def test_forward_and_backward_match_sdpa(kind, n, d):
    g = relation(kind, n)
    gen = torch.Generator().manual_seed(n * d)
    q, k, v, do = (torch.randn(n, d, generator=gen, dtype=torch.float32) for _ in range(4))
    scale = d ** -0.5
    o, lse = attention_forward(q, k, v, g, scale)
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, g, scale)

    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(
        q64[None], k64[None], v64[None], attn_mask=mask_of(g)[None], scale=scale)[0]
    want.backward(do.double())
    np.testing.assert_allclose(o.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for got, ref in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
