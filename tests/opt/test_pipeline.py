"""tiga/opt as one stage: PROGRAM_PASSES holds every pass, each pass is pure and keeps the
program well-formed, optimize_program runs the sequence each entry point used to call by
hand, and every entry point (plain call, tg.jit, tg.grad, tg.vjp, explain, the torch
bridge) goes through optimize_program.

Oracles: the individual rewrites called in their old order (printed programs compared),
check_program, the reference interpreter on the unoptimised program."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga import opt
from tiga.autodiff import vjp_program
from tiga.core.check import check_program
from tiga.core.eval import eval_program
from tiga.core.passes import cse, dce
from tiga.opt import (
    PROGRAM_PASSES,
    ProgramFacts,
    fold_negations,
    fuse_relation_walks,
    hoist_linear_projections,
    optimize_program,
    relation_kind,
    relation_kinds,
    save_residuals,
    simplify_edge_functions,
)
from tiga.trace import call_cache
from tiga.trace.staging import make_program

N, F, H, OUT = 24, 3, 8, 2
PASS_FILES = ("dce", "cse", "hoist_linear", "negations", "fuse_walks", "residuals",
              "edge_products", "attention_pairing", "unused_operands", "uniform_fields")


def _edge(s, d, e, w1, b1, w2):
    h = tg.math.concatenate([s.pos - d.pos, s.x], axis=-1)
    return tg.math.matmul(tg.math.tanh(tg.math.add(tg.math.matmul(h, w1), b1)), w2)


def _edge_nn(pos, x, w1, b1, w2):
    """An EdgeNN layer over a radius relation generated in the program."""
    g = tg.Graph.radius(pos, 0.45)
    y = tg.propagate(g, _edge, tg.sum(), src={"pos": pos, "x": x}, dst={"pos": pos},
                     w1=w1, b1=b1, w2=w2)
    return tg.math.sum(y * y)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random((N, 3)), rng.normal(size=(N, F)), rng.normal(size=(3 + F, H)) / 3,
            rng.normal(size=H), rng.normal(size=(H, OUT)) / 3]


@pytest.fixture(scope="module")
def programs():
    """(staged forward, its VJP as tg.grad derives it), traced once."""
    forward = make_program(_edge_nn)(*_args())
    staged = hoist_linear_projections(forward)[0]
    return forward, staged, vjp_program(staged, [True] * 5)


def test_every_pass_is_registered_once_in_one_order():
    assert set(PROGRAM_PASSES) == set(PASS_FILES)
    for name in PASS_FILES:   # one pass per file: tiga/opt/<name>.py
        assert PROGRAM_PASSES[name].__module__ == f"tiga.opt.{name}"
    assert opt.passes_for(ProgramFacts("staged")) == ["hoist_linear"]
    assert opt.passes_for(ProgramFacts("staged", bridge=True)) == ["hoist_linear",
                                                                   "attention_pairing",
                                                                   "negations"]
    assert opt.passes_for(ProgramFacts("execute")) == ["uniform_fields", "cse",
                                                       "attention_pairing", "dce",
                                                       "unused_operands", "negations",
                                                       "fuse_walks"]


def test_facts_name_a_known_stage():
    with pytest.raises(tg.TigaError, match="stage.*'traced'"):
        ProgramFacts("traced")
    with pytest.raises(tg.TigaError, match="forward"):
        ProgramFacts("execute", forward=make_program(lambda a: a * 2.0)(np.ones(2)))


@pytest.mark.parametrize("name", PASS_FILES)
def test_each_pass_is_pure_and_keeps_the_program_well_formed(name, programs):
    forward, staged, vjp = programs
    cases = [(forward, ProgramFacts("staged")), (staged, ProgramFacts("staged")),
             (vjp, ProgramFacts("vjp", forward=staged)),
             (vjp, ProgramFacts("execute", relation_kinds=tuple(relation_kinds(vjp).items())))]
    for program, facts in cases:
        before = str(program)
        out, notes = PROGRAM_PASSES[name](program, facts)
        assert str(program) == before, f"{name} changed its input program"
        assert all(isinstance(n, str) for n in notes)
        check_program(out)
        if len(out.in_binders) == len(program.in_binders) and \
                len(out.outs) == len(program.outs):   # residuals adds inputs: checked below
            args = _args(1)
            if program is vjp:
                args = args + [np.float64(1.0)]
            for a, b in zip(eval_program(out, *args), eval_program(program, *args)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10,
                                           atol=1e-12)


def test_optimize_program_equals_the_old_sequences(programs):
    forward, staged, vjp = programs
    # staged: hoist (the torch bridge: then fold negations)
    got, notes = optimize_program(forward, ProgramFacts("staged"))
    want, want_notes = hoist_linear_projections(forward)
    assert str(got) == str(want) and notes == want_notes and len(notes) >= 2
    got, _ = optimize_program(forward, ProgramFacts("staged", bridge=True))
    assert str(got) == str(fold_negations(want))
    # vjp: edge functions simplified; with the forward, residuals saved
    derived = simplify_edge_functions(vjp)
    assert str(optimize_program(vjp, ProgramFacts("vjp"))[0]) == str(derived)
    derived = dce(vjp, keep_outputs=range(1, len(vjp.outs)))   # cotangents only (bridge)
    got, _ = optimize_program(derived, ProgramFacts("vjp", forward=staged))
    pair = save_residuals(staged, simplify_edge_functions(derived))
    assert pair is not None
    assert str(got) == str(pair[1])
    assert str(opt.forward_with_residuals(staged, got, len(derived.in_binders))) == \
        str(pair[0])
    # execute: cse, dce, a + (-b) as a - b, then walk fusion by relation kind
    kinds = relation_kinds(vjp)
    got, _ = optimize_program(vjp, ProgramFacts("execute",
                                                relation_kinds=tuple(kinds.items())))
    want = fuse_relation_walks(fold_negations(dce(cse(vjp))),
                               lambda a: relation_kind(a.value) if hasattr(a, "value")
                               else kinds.get(id(a)))
    assert str(got) == str(want) and str(got).count("propagate") < str(vjp).count("propagate")


class _Layer(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, w1, b1, w2):
        return _edge(src, dst, edge, w1, b1, w2)


@pytest.fixture
def stages(monkeypatch):
    """The stages optimize_program ran with, in call order."""
    seen = []
    real = opt.optimize_program

    def record(program, facts):
        seen.append(facts.stage + ("+forward" if facts.forward is not None else "")
                    + ("+bridge" if facts.bridge else ""))
        return real(program, facts)

    monkeypatch.setattr(opt, "optimize_program", record)
    call_cache.clear()
    return seen


def test_every_entry_point_runs_optimize_program(stages):
    pos, x, w1, b1, w2 = _args(2)
    g = tg.Graph.radius(pos, 0.45)
    kw = dict(graph=g, src={"pos": pos, "x": x}, dst={"pos": pos}, w1=w1, b1=b1, w2=w2)
    _Layer()(**kw)
    assert stages == ["staged"]
    stages.clear()
    _Layer().explain(**kw)
    assert stages == ["staged"]
    stages.clear()
    jitted = tg.jit(lambda *a: _edge_nn(*a))
    jitted(*_args(3))
    assert stages == ["staged", "execute"]
    stages.clear()
    jitted.lower(*_args(3)).compile().explain()
    assert stages == ["execute"]
    stages.clear()
    tg.grad(lambda *a: _edge_nn(*a), argnums=(1, 2))(*_args(4))
    assert stages == ["staged", "vjp", "execute"]
    stages.clear()
    _, vjp_fn = tg.vjp(lambda *a: _edge_nn(*a), *_args(5))
    vjp_fn(np.float64(1.0))
    assert stages == ["staged", "vjp", "execute", "execute"]


def test_the_torch_bridge_runs_optimize_program(stages):
    torch = pytest.importorskip("torch")
    pos, x, w1, b1, w2 = (torch.tensor(a, requires_grad=True) for a in _args(6))
    g = tg.Graph.radius(pos.detach().numpy(), 0.45)
    y = _Layer()(graph=g, src={"pos": pos, "x": x}, dst={"pos": pos}, w1=w1, b1=b1, w2=w2)
    assert stages == ["staged+bridge", "vjp+forward", "execute"]
    grads = torch.autograd.grad(y.square().sum(), (x, w1))
    oracle = tg.grad(lambda *a: _edge_nn(*a), argnums=(1, 2))(*_args(6))
    for got, want in zip(grads, oracle):
        np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-9, atol=1e-11)


def test_unused_operands_are_dropped_and_values_kept():
    """A derived source cotangent reads only the destination cotangent: the source field
    operand goes, the result is the reference interpreter's."""
    from tiga.core.eval import eval_program
    from tiga.core.prims.graph import propagate_p
    from tiga.opt.unused_operands import unused_operands_pass

    rng = np.random.default_rng(0)
    g = tg.Graph.from_edge_index(rng.integers(0, 7, (2, 30)), num_nodes=7)
    x, w = rng.standard_normal((7, 3)), rng.standard_normal((7, 3))

    def f(x, w):
        return tg.propagate(g, lambda s, d, e: d.w * 2.0, tg.sum(), src={"x": x},
                            dst={"w": w})
    program = make_program(f)(x, w)
    got, _ = unused_operands_pass(program, ProgramFacts("execute"))
    (eqn,) = [e for e in got.eqns if e.primitive is propagate_p]
    assert eqn.params["roles"] == ("dst",) and eqn.params["names"] == ("w",)
    np.testing.assert_allclose(eval_program(got, x, w)[0], eval_program(program, x, w)[0])
