"""NaN and +-inf in attention's values, keys and queries on the Triton attention kernels (in
Triton's interpreter): only the rows whose softmax reads the bad entry are NaN or inf, as in
the reference interpreter, forward and gradients. Before, a tile product multiplied a masked
0 by another row's inf (0 * inf = NaN), so every row of the tile came back NaN.

Oracle: the reference interpreter (forward; the whole gradient program); NaN, +inf and -inf
must sit at the same entries, finite entries agree within rounding."""
import numpy as np
import pytest

import tiga as tg
from tiga.testing import reference_grad
from tiga.xla_free_runtime.backends.triton import attention as triton_attention

N = 20


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


RELATIONS = {
    "triangular": lambda: tg.Graph.triangular(N),
    "cu_seqlens": lambda: tg.Graph.cu_seqlens([0, 7, 7, N], causal=False),
    "dense": lambda: tg.Graph.dense(N - 3, N),
}


QUIET = {"triangular": slice(0, 5), "cu_seqlens": slice(7, N), "dense": slice(0, 0)}


@pytest.fixture
def kernels(monkeypatch):
    """The kinds of attention propagates the Triton attention kernels ran."""
    calls = []
    run = triton_attention.TritonAttentionPlan.run

    def spy(self, *args):
        calls.append(self.kind)
        return run(self, *args)

    monkeypatch.setattr(triton_attention.TritonAttentionPlan, "run", spy)
    return calls


def fields(g, where, bad, dtype=np.float64):
    rng = np.random.default_rng(len(where))
    q = rng.standard_normal((g.num_dst, 2, 8)).astype(dtype)
    k = rng.standard_normal((g.num_src, 2, 8)).astype(dtype)
    v = rng.standard_normal((g.num_src, 2, 8)).astype(dtype)
    {"value": v, "key": k, "query": q}[where][5, 0, 1] = bad
    return q, k, v


def same(got, want, what, tol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        np.testing.assert_array_equal(test(got), test(want), err_msg=f"{what}: {name}")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=tol, atol=tol, err_msg=what)


def call(g, q, k, v, ref=False):
    layer = Attention()
    fn = layer.reference if ref else layer
    return fn(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["value", "key"])
@pytest.mark.parametrize("kind", list(RELATIONS))
def test_forward_rows_match_the_reference(interpreter, kernels, kind, where, bad):
    g = RELATIONS[kind]()
    q, k, v = fields(g, where, bad)
    with np.errstate(invalid="ignore", over="ignore"):
        got, want = call(g, q, k, v), call(g, q, k, v, ref=True)
    assert kernels == ["forward"]
    same(got, want, f"{kind}, {bad} in a {where}")
    # the rows that never read source 5 (triangular: 0..4; cu_seqlens: the second sequence;
    # dense: none) are finite, though their tiles hold it
    assert np.isfinite(np.asarray(got)[QUIET[kind]]).all()


@pytest.mark.parametrize("kind, where, bad", [
    ("triangular", "value", np.inf), ("triangular", "key", np.nan),
    ("cu_seqlens", "value", np.nan), ("cu_seqlens", "key", np.inf),
    ("cu_seqlens", "query", -np.inf)])
def test_gradients_match_the_reference(interpreter, kernels, kind, where, bad):
    g = RELATIONS[kind]()
    q, k, v = fields(g, where, bad)
    ct = np.random.default_rng(1).standard_normal((g.num_dst, 2, 8))

    def loss(q, k, v, ref=False):
        return (call(g, q, k, v, ref) * ct).sum()

    with np.errstate(invalid="ignore", over="ignore"):
        got = tg.grad(loss, argnums=(0, 1, 2))(q, k, v)
        want = reference_grad(lambda *a: loss(*a, ref=True), argnums=(0, 1, 2))(q, k, v)
    assert "forward" in kernels and len(kernels) > 1, kernels
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        same(a, b, f"{kind}, {bad} in a {where}: {name}")


def test_float32_value_inf_stays_in_its_rows(interpreter, kernels):
    g = RELATIONS["cu_seqlens"]()
    q, k, v = fields(g, "value", np.inf, np.float32)
    got, want = call(g, q, k, v), call(g, q, k, v, ref=True)
    same(got, want, "float32", tol=1e-5)
    # source 5 lies in the first sequence: the rows of the second one are finite
    assert np.isfinite(np.asarray(got)[7:]).all()
