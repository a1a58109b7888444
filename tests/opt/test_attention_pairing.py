"""opt.attention_pairing: attention's forward returns its row statistics (residual outputs
the VJP reads) and the VJP's dk/dv and dq walks are one multi-output propagate; the runtime
keeps no per-call value in module state. Oracles: the reference interpreter on the unpaired
program, and torch autograd."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga import opt
from tiga.autodiff import vjp_program
from tiga.autodiff.rules.attention import kind_of
from tiga.core.eval import eval_program
from tiga.testing import reference_grad
from tiga.xla_free_runtime.backends.cpu import attention as attention_route
from tiga.xla_free_runtime.executor import execute
from tiga.xla_free_runtime.reports.runs import COUNTERS


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


class AttentionLiteral(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((dst.query * src.key).sum(dim=-1) * 0.25, src.value)


class AttentionUnscaled(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer((dst.query * src.key).sum(dim=-1), src.value)


LAYERS = {"param": Attention, "literal": AttentionLiteral, "none": AttentionUnscaled}


def relation(kind: str, n: int):
    if kind == "dense":
        return tg.Graph.dense(n)
    if kind == "triangular":
        return tg.Graph.triangular(n)
    if kind == "csr":       # a stored relation: not a streaming walk, left unpaired
        rng = np.random.default_rng(n)
        rows = [np.sort(rng.choice(n, size=rng.integers(0, n + 1), replace=False))
                for _ in range(n)]
        return tg.Graph.from_csr(np.cumsum([0] + [len(r) for r in rows]),
                                 np.concatenate(rows).astype(np.int64), num_src=n)
    cut = [0, n // 3, n] if n >= 3 else [0, n]
    return tg.Graph.cu_seqlens(np.array(cut), causal=kind == "cu_causal")


def call(layer, graph):
    if isinstance(layer, Attention):
        return lambda q, k, v: layer(graph=graph, src={"key": k, "value": v},
                                     dst={"query": q}, scale=0.7)
    return lambda q, k, v: layer(graph=graph, src={"key": k, "value": v}, dst={"query": q})


def programs(layer, graph, args):
    """(VJP program as tg.grad derives it, the same after the "execute" passes)."""
    prog = opt.optimize_program(tg.make_program(call(layer, graph))(*args),
                                opt.ProgramFacts("staged"))[0]
    vjp = opt.optimize_program(vjp_program(prog, [True] * 3), opt.ProgramFacts("vjp"))[0]
    return vjp, opt.optimize_program(vjp, opt.ProgramFacts("execute"))[0]


def propagates(program) -> list:
    return [e for e in program.eqns if e.primitive.name == "propagate"]


def fields(n, heads, width, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, heads, width) if heads else (n, width)
    return [rng.standard_normal(shape) for _ in range(4)]


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 24), heads=st.integers(0, 3), width=st.integers(1, 6),
       kind=st.sampled_from(["dense", "triangular", "cu_causal", "cu_full"]),
       scale=st.sampled_from(sorted(LAYERS)))
def test_paired_program_has_residual_outputs_and_same_values(n, heads, width, kind, scale):
    graph = relation(kind, n)
    q, k, v, ct = fields(n, heads, width, seed=n)
    vjp, paired = programs(LAYERS[scale](), graph, [q, k, v])
    eqns = propagates(paired)
    forward = [e for e in eqns if e.params["reducer"].name == "online_softmax"]
    assert len(forward) == 1 and forward[0].params["reducer"].stats
    assert len(forward[0].outputs) == 3              # y, row max, row mass
    kinds = [kind_of(e.params["names"]) for e in eqns]
    assert "rowmax" not in kinds and "mass" not in kinds and "dq" not in kinds
    (fused,) = [e for e in eqns if kind_of(e.params["names"]) == "dkdvq"]
    assert fused.params["reduce_by"] == ("src", "src", "dst") and len(fused.outputs) == 3
    # the residual outputs are what the VJP reads: the log-sum-exp comes from them
    stats = {id(o) for o in forward[0].outputs[1:]}
    assert any(id(a) in stats for e in paired.eqns for a in e.inputs)
    want = eval_program(vjp, q, k, v, ct)                # unpaired, reference interpreter
    for got in (eval_program(paired, q, k, v, ct), execute(paired, [q, k, v, ct])):
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)


def test_stored_relation_is_not_paired():
    graph = relation("csr", 12)
    q, k, v, _ = fields(12, 2, 4)
    vjp, paired = programs(Attention(), graph, [q, k, v])
    assert [len(e.outputs) for e in propagates(paired)] == \
        [len(e.outputs) for e in propagates(vjp)]
    assert not any(e.params["reducer"].stats for e in propagates(paired))


def test_gradient_of_queries_only_runs_dq_alone():
    """Only dq wanted: no dk/dv walk to pair with, the dq propagate runs on its own."""
    graph = relation("triangular", 20)
    q, k, v, ct = fields(20, 2, 4)
    f = call(Attention(), graph)
    before = COUNTERS.copy()
    dq = tg.grad(lambda q: (f(q, k, v) * ct).sum())(q)
    assert COUNTERS["dq_walks"] == before["dq_walks"] + 1
    assert COUNTERS["stats_walks"] == before["stats_walks"]
    want = reference_grad(lambda q: (Attention().reference(
        graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.7) * ct).sum())(q)
    np.testing.assert_allclose(np.asarray(dq), np.asarray(want), rtol=1e-9, atol=1e-11)


def _module_state() -> dict:
    """Sizes of the containers the attention route and the pass keep at module level."""
    from tiga.autodiff.rules import attention as rules
    from tiga.opt import attention_pairing
    sizes = {}
    for mod in (attention_route, rules, attention_pairing):
        for name, value in vars(mod).items():
            if isinstance(value, dict | list | set) and not name.isupper():
                sizes[f"{mod.__name__}.{name}"] = len(value)
            elif hasattr(value, "cache_info"):     # functools memo of traced programs
                sizes[f"{mod.__name__}.{name}"] = value.cache_info().currsize
    return sizes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_module_state_holds_per_call_values(dtype):
    """Forward + backward (tg.vjp and the torch bridge) on fresh arrays: module-level
    containers do not grow per call, and the old id()-keyed stores are gone."""
    torch = pytest.importorskip("torch")
    assert not hasattr(attention_route, "_SAVED") and not hasattr(attention_route, "_DQ")
    graph = relation("triangular", 40)
    f = call(Attention(), graph)

    def one(seed):
        q, k, v, ct = (x.astype(dtype) for x in fields(40, 2, 16, seed))
        _, vjp_fn = tg.vjp(f, q, k, v)
        vjp_fn(ct)
        ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        y = f(*ts)
        torch.autograd.grad(y, ts, torch.tensor(ct))

    one(0)
    one(1)          # warm: every memo (programs, kernels, scratch shapes) filled
    before = _module_state()
    walks = (COUNTERS["stats_walks"], COUNTERS["dq_walks"])
    for seed in range(2, 6):
        one(seed)
    assert _module_state() == before
    assert (COUNTERS["stats_walks"], COUNTERS["dq_walks"]) == walks
