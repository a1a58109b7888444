"""The tl.dot kernels (issue 29 item 1) compiled for the CUDA device: attention in float16
(tensor cores, float32 accumulation) and float32 (exact ieee; TF32 only with TIGA_TF32=1),
forward and backward kernels against float64 SDPA; the entity-level linear layer
(tile_matmul) against float64 torch matmul; an EdgeNN layer with that product in the
executor's overrides and a max-reduced edge MLP whose per-edge layer is one tl.dot, forward
and torch-autograd backward against the reference interpreter. Strict: nothing falls back.

Marked gpu; skipped without CUDA and in a process whose triton was imported for the
interpreter (as tests/gpu/test_cuda_kernels.py); TIGA_GPU_TESTS_ON_CPU=1 runs them on CPU
tensors through triton-interpreter."""

import numpy as np
import pytest
from gpu_env import BACKEND, DEVICE, MARKS, ON_CPU, WHY, torch  # noqa: E402,F401  (before tiga)

import tiga as tg  # noqa: E402
from tiga.core.prims.linalg import dot_general_p  # noqa: E402
from tiga.testing import reference_grad  # noqa: E402
from tiga.xla_free_runtime import executor
from tiga.xla_free_runtime.backends.triton import attention as triton_attention  # noqa: E402
from tiga.xla_free_runtime.backends.triton import linear  # noqa: E402
from tiga.xla_free_runtime.caches import programs as program_cache
from tiga.xla_free_runtime.reports.runs import COUNTERS

pytestmark = MARKS


def sdpa64(q, k, v, g, scale, do):
    rp, ci = g.resolve_csr()
    mask = np.zeros((g.num_dst, g.num_src), bool)
    mask[np.repeat(np.arange(g.num_dst), np.diff(rp)), ci] = True
    ts = [x.detach().double().transpose(0, 1).requires_grad_() for x in (q, k, v)]
    y = torch.nn.functional.scaled_dot_product_attention(
        *ts, attn_mask=torch.from_numpy(mask).to(q.device)[None], scale=scale)
    grads = torch.autograd.grad(y, ts, do.double().transpose(0, 1))
    return y.detach().transpose(0, 1), [x.transpose(0, 1) for x in grads]


@pytest.mark.parametrize("kind", ["dense", "triangular", "cu_seqlens"])
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.float32, 2e-5)])
def test_attention_kernels_in_float16_and_float32(kind, dtype, tol):
    """Forward (one program per 128 queries at float16) and both backward kernels at the
    GPU check's head width (its attention workloads reuse these compiled kernels), against
    float64 SDPA on the same device."""
    n, heads, dim = 260, 2, 64
    g = {"dense": tg.Graph.dense(n), "triangular": tg.Graph.triangular(n),
         "cu_seqlens": tg.Graph.cu_seqlens([0, 17, 17, 160, n], causal=True)}[kind]
    gen = torch.Generator().manual_seed(n)
    q, k, v, do = (torch.randn(n, heads, dim, generator=gen).to(DEVICE, dtype)
                   for _ in range(4))
    o, lse = triton_attention.attention_forward(q, k, v, g, dim ** -0.5, BACKEND)
    grads = triton_attention.attention_backward(q, k, v, o, lse, do, g, dim ** -0.5, BACKEND)
    want, want_grads = sdpa64(q, k, v, g, dim ** -0.5, do)
    assert o.dtype == dtype and o.device.type == DEVICE
    torch.testing.assert_close(o.double(), want, rtol=tol, atol=tol)
    for name, got, ref in zip("qkv", grads, want_grads):
        torch.testing.assert_close(got.double(), ref, rtol=5 * tol, atol=5 * tol,
                                   msg=f"d{name}")


def test_attention_layer_float16_forward_runs_the_tiled_kernels():
    n, heads, dim = 300, 4, 64

    class Attention(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge, scale):
            return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)

    g = tg.Graph.dense(n)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, heads, dim, generator=gen).to(DEVICE, torch.float16)
               for _ in range(3))
    ops = dict(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=dim ** -0.5)
    assert "tensor cores" in str(Attention().explain(**ops))
    y = Attention()(**ops)
    want, _ = sdpa64(q, k, v, g, dim ** -0.5, torch.zeros_like(q))
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize("form", [(1, 0), (1, 1), (0, 0)])
def test_tile_matmul(dtype, tol, form):
    gen = torch.Generator().manual_seed(5)
    m, k, n = 1000, 40, 24
    x = torch.randn((m, k) if form[0] == 1 else (k, m), generator=gen).to(DEVICE, dtype)
    y = torch.randn((k, n) if form[1] == 0 else (n, k), generator=gen).to(DEVICE, dtype)
    got = linear.matmul(x, y, form, str(dtype).split(".")[1], BACKEND)
    a = x.double() if form[0] == 1 else x.double().T
    b = y.double() if form[1] == 0 else y.double().T
    torch.testing.assert_close(torch.as_tensor(got).to(DEVICE).double(), a @ b,
                               rtol=tol, atol=tol * k ** 0.5)


@pytest.fixture
def tile_products(monkeypatch):
    monkeypatch.setitem(executor.OVERRIDES, dot_general_p, linear.dot_rule)
    program_cache.forget()      # (walks' rules and launch lists made before the override)
    before = COUNTERS["tile_matmuls"]
    return lambda: COUNTERS["tile_matmuls"] - before


def _edge_graph(n=500, deg=6, seed=2):
    rng = np.random.default_rng(seed)
    rp = np.arange(n + 1) * deg
    return tg.Graph.from_csr(rp, rng.integers(0, n, n * deg).astype(np.int32), num_src=n), rng


def _check_layer(layer, g, x, w, tol):
    xt, wt = (torch.tensor(a, device=DEVICE, requires_grad=True) for a in (x, w))
    y = layer(graph=g, src={"x": xt}, dst={"x": xt}, w=wt)
    want = np.asarray(layer.reference(graph=g, src={"x": x}, dst={"x": x}, w=w))
    np.testing.assert_allclose(y.detach().cpu().numpy(), want, rtol=tol, atol=tol)
    y.sum().backward()
    refs = reference_grad(lambda a, b: layer.reference(
        graph=g, src={"x": a}, dst={"x": a}, w=b).sum(), argnums=(0, 1))(x, w)
    for t, ref, name in zip((xt, wt), refs, ("x", "w")):
        np.testing.assert_allclose(t.grad.cpu().numpy(), np.asarray(ref), rtol=tol,
                                   atol=tol, err_msg=name)


def test_edgenn_hoisted_layer_as_tile_matmul(tile_products):
    class EdgeNN(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge, w):
            return tg.math.relu(tg.math.concatenate([dst.x, src.x - dst.x], axis=-1) @ w)

    g, rng = _edge_graph()
    x = rng.normal(size=(g.num_src, 32)).astype(np.float32)
    w = (rng.normal(size=(64, 32)) / 8).astype(np.float32)
    _check_layer(EdgeNN(), g, x, w, 1e-4)
    assert tile_products() >= 4


def test_per_edge_layer_as_tile_dot():
    class MaxMLP(tg.MessagePassing):
        reducer = tg.max()

        def edge(self, src, dst, edge, w):
            return tg.math.relu(src.x - dst.x) @ w

    g, rng = _edge_graph(seed=3)
    x = rng.normal(size=(g.num_src, 20)).astype(np.float64)
    w = rng.normal(size=(20, 24)) / 4
    _check_layer(MaxMLP(), g, x, w, 1e-9)
