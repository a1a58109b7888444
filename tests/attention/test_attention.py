"""Attention as message passing: the tiled streaming forward and the FlashAttention-2-style
VJP against an explicit dense oracle (masked softmax in float64), on every relation kind the
tiled route claims, plus the generic route for custom relations with empty rows."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.backends.cpu import attention as attention_route
from tiga.xla_free_runtime.reports.runs import COUNTERS

torch = pytest.importorskip("torch")


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        score = (dst.query * src.key).sum(dim=-1) * scale
        return self.reducer(score, src.value)


class AttentionLiteralScale(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((dst.query * src.key).sum(dim=-1) * 0.25, src.value)


class AttentionTanh(tg.MessagePassing):   # not plain dot-product attention: generic kernel
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer(tg.math.tanh((dst.query * src.key).sum(dim=-1) * scale), src.value)


def allowed_mask(graph) -> np.ndarray:
    """(num_dst, num_src) boolean mask of the relation, from its explicit CSR."""
    rp, ci = graph.resolve_csr()
    mask = np.zeros((graph.num_dst, graph.num_src), bool)
    for i in range(graph.num_dst):
        mask[i, ci[rp[i]:rp[i + 1]]] = True
    return mask


def oracle(q, k, v, mask, scale):
    """Explicit masked softmax attention in float64 torch; (N, H, D) or (N, D) fields."""
    single = q.dim() == 2
    if single:
        q, k, v = (x.unsqueeze(1) for x in (q, k, v))
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
    s = (qh @ kh.transpose(-1, -2)) * scale
    s = s.masked_fill(~torch.as_tensor(mask), -torch.inf)
    w = torch.softmax(s, -1).nan_to_num(0.0)         # empty rows: 0 by the reducer convention
    y = (w @ vh).transpose(0, 1)
    return y.squeeze(1) if single else y


def relation(kind, n):
    if kind == "triangular":
        return tg.Graph.triangular(n)
    if kind == "dense":
        return tg.Graph.dense(n)
    cu = np.array(sorted([0, n // 3, min(n, n // 3 + 1), max(n // 3 + 1, n - 7), n]))
    cu = np.minimum(cu, n)
    return tg.Graph.cu_seqlens(cu, causal=(kind == "cu_causal"))


def fields(n, heads, width, dtype, seed=0, amp=1.0):
    rng = np.random.default_rng(seed)
    shape = (n, heads, width) if heads else (n, width)
    return [(amp * rng.standard_normal(shape)).astype(dtype) for _ in range(3)]


def check(program, graph, q, k, v, scale, rtol, atol, **kw):
    f = (lambda q, k, v: program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                                 scale=scale)) if not kw.get("literal") else \
        (lambda q, k, v: program(graph=graph, src={"key": k, "value": v}, dst={"query": q}))
    out, vjp_fn = tg.vjp(f, q, k, v)
    ct = np.random.default_rng(1).standard_normal(np.shape(out)).astype(q.dtype)
    grads = vjp_fn(ct)
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v)]
    ref = oracle(*ts, allowed_mask(graph), scale)
    expected = torch.autograd.grad(ref, ts, torch.tensor(ct, dtype=torch.float64))
    np.testing.assert_allclose(np.asarray(out), ref.detach().numpy(), rtol=rtol, atol=atol)
    for name, a, b in zip("qkv", grads, expected):
        np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"d{name}")
    return out


def forward_statistics(program, graph, q, k, v, scale):
    """(y, row max, row mass) from the forward propagate returning its statistics, as
    opt.attention_pairing writes it for a VJP that reads them."""
    from tiga import opt
    from tiga.core.program import GraphProgram
    from tiga.xla_free_runtime.executor import execute
    prog = tg.make_program(lambda q, k, v: program(graph=graph, src={"key": k, "value": v},
                                                    dst={"query": q}, scale=scale))(q, k, v)
    prog = opt.optimize_program(prog, opt.ProgramFacts("staged", bridge=True))[0]
    (eqn,) = [e for e in prog.eqns if e.primitive.name == "propagate"]
    assert len(eqn.outputs) == 3
    return [np.asarray(o) for o in execute(GraphProgram(prog.in_binders, prog.eqns,
                                                        eqn.outputs), [q, k, v])]


def routes(program, graph, q, k, v, scale):
    ex = program.explain(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                         scale=scale)
    return ex


KINDS = ["triangular", "dense", "cu_causal", "cu_full"]
TOL = {np.float32: (2e-4, 2e-5), np.float64: (1e-10, 1e-12)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [65, 97, 200])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_and_gradients_match_oracle(kind, n, dtype):
    graph = relation(kind, n)
    q, k, v = fields(n, 3, 16, dtype)
    program = Attention()
    ex = routes(program, graph, q, k, v, 0.25)
    assert any(w == "tiled streaming attention" for _, _, w in ex.routes), str(ex)
    check(program, graph, q, k, v, 0.25, *TOL[dtype])


@pytest.mark.parametrize("kind", ["triangular", "cu_causal"])
def test_single_head_fields(kind):
    graph = relation(kind, 97)
    q, k, v = fields(97, None, 8, np.float64)
    check(Attention(), graph, q, k, v, 0.3, *TOL[np.float64])


def test_literal_scale_and_tile_sizes(monkeypatch):
    from tiga.xla_free_runtime.backends.cpu import attention_tiles as tiles
    monkeypatch.setattr(tiles, "BLOCK_M", 16)
    monkeypatch.setattr(tiles, "BLOCK_N", 32)    # many tiles, several boundary masks per row
    graph = relation("cu_causal", 200)
    q, k, v = fields(200, 2, 8, np.float64)
    check(AttentionLiteralScale(), graph, q, k, v, 0.25, *TOL[np.float64], literal=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_scores_are_stable(dtype):
    """Scores around 1e3: a naive exp overflows; the running max keeps everything finite."""
    n = 97
    graph = relation("triangular", n)
    q, k, v = fields(n, 2, 16, dtype, amp=8.0)   # |q.k| ~ 64 * 16 ... scaled below
    scale = 1000.0 / 256.0
    ts = [torch.tensor(x, dtype=torch.float64) for x in (q, k)]
    s = (ts[0] * ts[1][0]).sum(-1) * scale
    assert s.abs().max() > 300                    # the case is what it claims
    rtol, atol = (3e-3, 3e-3) if dtype == np.float32 else (1e-8, 1e-8)
    out = check(Attention(), graph, q, k, v, scale, rtol, atol)
    assert np.isfinite(np.asarray(out)).all()


def test_custom_relation_with_empty_rows_uses_generic_kernel():
    rng = np.random.default_rng(3)
    n_src, n_dst = 40, 30
    rows = []
    for i in range(n_dst):
        deg = 0 if i % 4 == 1 else int(rng.integers(1, 8))
        rows.append(np.sort(rng.choice(n_src, deg, replace=False)))
    rp = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    graph = tg.Graph.from_csr(rp, np.concatenate(rows), num_src=n_src)
    q = rng.standard_normal((n_dst, 2, 8))
    k, v = rng.standard_normal((2, n_src, 2, 8))
    program = Attention()
    ex = routes(program, graph, q, k, v, 0.5)
    assert not any(w == "tiled streaming attention" for _, _, w in ex.routes)
    out = check(program, graph, q, k, v, 0.5, 1e-10, 1e-12)
    assert np.all(np.asarray(out)[1::4] == 0)


def test_non_attention_edge_function_is_not_claimed():
    graph = relation("triangular", 65)
    q, k, v = fields(65, 2, 8, np.float64)
    program = AttentionTanh()
    ex = routes(program, graph, q, k, v, 0.5)
    assert not any(w == "tiled streaming attention" for _, _, w in ex.routes)
    y = program(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.5)
    ref = program.reference(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                            scale=0.5)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-10, atol=1e-12)


def test_torch_head_major_permuted_inputs_and_autograd():
    n, heads, width = 65, 2, 64
    torch.manual_seed(7)
    q, k, v = (torch.randn(heads, n, width, dtype=torch.float32).permute(1, 0, 2)
               .requires_grad_() for _ in range(3))
    graph = tg.Graph.triangular(n)
    program = Attention()
    y = program(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=width ** -0.5)
    ct = torch.randn(n, heads, width)
    grads = torch.autograd.grad(y, (q, k, v), ct)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = oracle(*ref_in, allowed_mask(graph), width ** -0.5)
    expected = torch.autograd.grad(ref, ref_in, ct.double())
    torch.testing.assert_close(y.double(), ref, rtol=2e-4, atol=2e-5)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.double(), b, rtol=3e-4, atol=3e-5)


def test_prune_threshold_is_approximate_and_reports_skipped_blocks(monkeypatch):
    from tiga.xla_free_runtime.backends.cpu import attention_tiles as tiles
    monkeypatch.setattr(tiles, "BLOCK_M", 16)
    monkeypatch.setattr(tiles, "BLOCK_N", 16)

    class Pruned(tg.MessagePassing):
        reducer = tg.online_softmax(prune_threshold=20.0)

        def edge(self, src, dst, edge, scale):
            return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)

    n = 128
    rng = np.random.default_rng(0)
    u = np.array([1.0, 0.0, 0.0, 0.0])
    q = np.tile(3 * u, (n, 1, 1))
    k = rng.standard_normal((n, 1, 4))
    k[:16] = 20 * u                    # scores 60 in the first key block, |s| < 15 elsewhere
    v = rng.standard_normal((n, 1, 4))
    graph = tg.Graph.dense(n)
    program = Pruned()
    with tg.profile() as prof:
        y = program(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=1.0)
    ex = str(program.explain(run=True, graph=graph, src={"key": k, "value": v},
                             dst={"query": q}, scale=1.0))
    assert "APPROXIMATE" in ex
    skipped, total = prof.measured("pruned_blocks")[-1]
    assert 0 < skipped < total
    assert f"skipped {skipped} of {total} blocks" in ex
    ref = oracle(*(torch.tensor(x) for x in (q, k, v)), allowed_mask(graph), 1.0).numpy()
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-6, atol=1e-6)  # skipped mass ~e^-20

    exact = Attention()
    ex = str(exact.explain(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                           scale=1.0))
    assert "APPROXIMATE" not in ex


def test_prune_threshold_none_is_not_zero():
    assert tg.online_softmax().prune_threshold is None
    with pytest.raises(tg.TigaError, match="prune_threshold"):
        tg.online_softmax(prune_threshold=0.0)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 70), heads=st.integers(1, 3), width=st.integers(1, 9),
       kind=st.sampled_from(KINDS))
def test_property_matches_oracle(n, heads, width, kind):
    graph = relation(kind, n)
    m_ = graph.num_dst
    q, k, v = fields(m_, heads, width, np.float64, seed=n)
    check(Attention(), graph, q, k, v, 0.7, 1e-9, 1e-11)


def test_vjp_reuses_forward_statistics_and_fuses_dq():
    """The VJP's row max/mass are outputs of the forward, and dq one of the dk/dv pass
    (opt.attention_pairing): no walk of their own runs."""
    graph = relation("triangular", 97)
    q, k, v = fields(97, 2, 8, np.float64)
    before = COUNTERS.copy()
    check(Attention(), graph, q, k, v, 0.5, *TOL[np.float64])
    assert COUNTERS["stats_walks"] == before["stats_walks"]
    assert COUNTERS["dq_walks"] == before["dq_walks"]


@pytest.mark.parametrize("argnum", [0, 1, 2])
def test_gradient_of_one_input(argnum):
    """Only dq, only dk or only dv wanted: the unfused propagates on their own."""
    n = 65
    graph = relation("cu_causal", n)
    q, k, v = fields(n, 2, 8, np.float64)
    ct = np.random.default_rng(5).standard_normal((n, 2, 8))
    program = Attention()

    def loss(*qkv):
        y = program(graph=graph, src={"key": qkv[1], "value": qkv[2]}, dst={"query": qkv[0]},
                    scale=0.5)
        return tg.math.sum(y * ct)

    g = tg.grad(loss, argnums=argnum)(q, k, v)
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    ref = oracle(*ts, allowed_mask(graph), 0.5)
    expected = torch.autograd.grad(ref, ts[argnum], torch.tensor(ct))[0]
    np.testing.assert_allclose(np.asarray(g), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_cross_attention_dense_rectangular():
    """dense(num_src, num_dst) with num_src != num_dst: queries and keys differ in count."""
    rng = np.random.default_rng(11)
    n_src, n_dst = 150, 70
    graph = tg.Graph.dense(n_src, n_dst)
    q = rng.standard_normal((n_dst, 2, 8))
    k, v = rng.standard_normal((2, n_src, 2, 8))
    program = Attention()
    ex = routes(program, graph, q, k, v, 0.4)
    assert any(w == "tiled streaming attention" for _, _, w in ex.routes), str(ex)
    check(program, graph, q, k, v, 0.4, 1e-10, 1e-12)


def test_float32_torch_autograd_dense_and_cu_seqlens():
    for graph in (tg.Graph.dense(97), tg.Graph.cu_seqlens(np.array([0, 30, 31, 97]))):
        torch.manual_seed(0)
        q, k, v = (torch.randn(97, 3, 16).requires_grad_() for _ in range(3))
        program = Attention()
        y = program(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)
        ct = torch.randn_like(y)
        grads = torch.autograd.grad(y, (q, k, v), ct)
        ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
        ref = oracle(*ref_in, allowed_mask(graph), 0.25)
        expected = torch.autograd.grad(ref, ref_in, ct.double())
        torch.testing.assert_close(y.double(), ref, rtol=2e-4, atol=2e-5)
        for a, b in zip(grads, expected):
            torch.testing.assert_close(a.double(), b, rtol=3e-4, atol=3e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 65, 97, 200])
def test_llvm_forward_kernel_matches_numpy_tiles_and_oracle(kind, n, monkeypatch):
    """float32 with a head width multiple of 16 runs the LLVM micro-kernel: it agrees with
    the numpy tiles and the float64 oracle (partial row groups, partial key chunks)."""
    graph = relation(kind, n)
    q, k, v = fields(n, 2, 32, np.float32, seed=n)
    program = Attention()
    before = COUNTERS["native_calls"]
    y = np.asarray(program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                           scale=0.3))
    assert COUNTERS["native_calls"] == before + 1
    monkeypatch.setattr(attention_route, "NATIVE_FORWARD", False)
    y_np = np.asarray(program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                              scale=0.3))
    ts = [torch.tensor(x, dtype=torch.float64) for x in (q, k, v)]
    ref = oracle(*ts, allowed_mask(graph), 0.3).numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(y, y_np, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("kind", ["triangular", "cu_full"])
def test_llvm_forward_kernel_several_key_blocks_and_jobs(kind, head_major):
    """N = 613, width 64, 3 heads: several 256-key blocks, row groups and jobs per head, a
    partial last group and key step; the kernel agrees with the float64 oracle. Head-major
    storage ((H, N, D) viewed as (N, H, D)) is read in place, (N, H, D) storage packed."""
    n = 613
    graph = relation(kind, n)
    q, k, v = fields(n, 3, 64, np.float32, seed=7, amp=2.0)
    if head_major:
        q, k, v = (np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
                   for x in (q, k, v))
    before = COUNTERS["native_calls"]
    y = np.asarray(Attention()(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                               scale=0.125))
    assert COUNTERS["native_calls"] == before + 1
    ts = [torch.tensor(x, dtype=torch.float64) for x in (q, k, v)]
    ref = oracle(*ts, allowed_mask(graph), 0.125).numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("kind", ["triangular", "dense"])
def test_llvm_forward_kernel_row_max_moving_late(kind):
    """Keys drift upwards, so each row's max rises by far more than the kernel's lazy
    threshold well after its first key step: output, row max and mass (kept for the VJP)
    agree with a float64 oracle, and the row max is the true one."""
    n, nh = 300, 2
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((n, nh, 32)).astype(np.float32) for _ in range(3))
    u = np.full(32, 32 ** -0.5, np.float32)
    q += 3 * u
    k += np.linspace(0.0, 16.0, n, dtype=np.float32)[:, None, None] * u
    graph = relation(kind, n)
    y = np.asarray(Attention()(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                               scale=0.5))
    ts = [torch.tensor(x, dtype=torch.float64) for x in (q, k, v)]
    ref = oracle(*ts, allowed_mask(graph), 0.5).numpy()
    np.testing.assert_allclose(y, ref, rtol=2e-4, atol=2e-5)
    saved = forward_statistics(Attention(), graph, q, k, v, 0.5)
    np.testing.assert_array_equal(saved[0], y)      # the same kernel call as the plain one
    saved = saved[1:]
    s = np.einsum("ihd,jhd->hij", *(x.astype(np.float64) for x in (q, k))) * 0.5
    s = np.where(allowed_mask(graph)[None], s, -np.inf)
    top = s.max(-1)
    mass = np.exp(s - top[..., None]).sum(-1)
    assert (top[:, 200:] - s[:, 200:, :64].max(-1) > 8).mean() > 0.5   # the max moved late
    np.testing.assert_allclose(np.asarray(saved[0]).T, top, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(saved[1]).T, mass, rtol=2e-4)
