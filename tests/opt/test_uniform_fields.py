"""opt.uniform_fields: a propagate field that is one literal broadcast over its rows (tg.grad's
seed of ones) becomes a literal of the edge function; bind_constants keeps such a broadcast
an equation rather than folding it into an array.

Oracles: the reference interpreter on the unrewritten program, numpy's np.add.at, and the
printed programs (no (rows, features) constant left)."""
from __future__ import annotations

import numpy as np

import tiga as tg
from tiga import api
from tiga.core.check import check_program
from tiga.core.eval import eval_program
from tiga.core.passes import bind_constants
from tiga.core.prims.graph import propagate_p
from tiga.core.prims.shape import broadcast_in_dim_p
from tiga.core.program import Lit, Var
from tiga.opt import ProgramFacts
from tiga.opt.uniform_fields import uniform_fields_pass
from tiga.trace.staging import make_program

N, K, F = 1000, 5, 7      # N * F above bind_constants' spread threshold (4096)


def _graph(seed=0):
    rng = np.random.default_rng(seed)
    col = rng.integers(0, N, size=N * K)
    return tg.Graph.from_csr(np.arange(0, N * K + 1, K), col, num_src=N), col


def _weighted(g):
    return lambda x, w: tg.propagate(g, lambda s, d, e: s.x * e.w, tg.sum(),
                                     src={"x": x}, edge={"w": w})


def _args(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, F)), rng.standard_normal(N * K)


def _spy_executed(monkeypatch) -> list:
    seen = []
    real = api._executed_passes

    def spy(program, kinds):
        out = real(program, kinds)
        seen.append(out)
        return out
    monkeypatch.setattr(api, "_executed_passes", spy)
    return seen


def test_grad_seed_is_a_literal_of_the_backward_edge_functions(monkeypatch):
    g, col = _graph()
    x, w = _args()
    seen = _spy_executed(monkeypatch)
    gx, gw = tg.grad(lambda x, w: tg.math.sum(_weighted(g)(x, w)), argnums=(0, 1))(x, w)
    want_x = np.zeros((N, F))
    np.add.at(want_x, col, np.broadcast_to(w[:, None], (N * K, F)))
    np.testing.assert_allclose(np.asarray(gx), want_x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), x[col].sum(1), rtol=1e-12, atol=1e-12)
    (program,) = seen
    check_program(program)
    walks = [e for e in program.eqns if e.primitive is propagate_p]
    assert len(walks) == 2
    for e in walks:     # no field of ones: each walk reads one user operand
        assert len(e.inputs) == 2
        assert isinstance(e.inputs[1], Var)
        inner = e.params["edge_fn"].program.eqns
        assert inner[0].primitive is broadcast_in_dim_p
        assert isinstance(inner[0].inputs[0], Lit) and inner[0].inputs[0].value == 1.0
    assert not any(e.primitive is broadcast_in_dim_p for e in program.eqns)   # dce'd


def test_rewrite_matches_the_reference_on_every_role():
    g, _ = _graph(2)
    x, w = _args(3)

    def fn(x, w, s):
        c = tg.math.broadcast_to(tg.math.reshape(s, (1, 1)), (N, F))
        return tg.propagate(g, lambda s, d, e: s.x * e.w + d.c * s.c, tg.sum(),
                            src={"c": c, "x": x}, dst={"c": c}, edge={"w": w})

    spread = bind_constants(make_program(fn)(x, w, np.float64(0.0)), {2: np.float64(2.5)})
    assert [e.primitive.name for e in spread.eqns] == ["broadcast_in_dim", "propagate"]
    rewritten, _ = uniform_fields_pass(spread, ProgramFacts("execute"))
    check_program(rewritten)
    (walk,) = [e for e in rewritten.eqns if e.primitive is propagate_p]
    assert walk.params["roles"] == ("src", "edge")      # both reads of c are literals now
    np.testing.assert_allclose(eval_program(rewritten, x, w)[0],
                               eval_program(spread, x, w)[0], rtol=1e-12)
    want = eval_program(make_program(fn)(x, w, np.float64(2.5)), x, w, np.float64(2.5))[0]
    np.testing.assert_allclose(eval_program(rewritten, x, w)[0], want, rtol=1e-12)


def test_bind_constants_keeps_a_large_spread_and_folds_a_small_one():
    def fn(s, x):
        return tg.math.broadcast_to(tg.math.reshape(s, (1, 1)), x.shape) * x

    big = make_program(fn)(np.float64(1.0), np.ones((4096 + 1, 1)))
    small = make_program(fn)(np.float64(1.0), np.ones((8, 2)))
    prims = [[e.primitive.name for e in bind_constants(p, {0: np.float64(3.0)}).eqns]
             for p in (big, small)]
    assert prims[0] == ["broadcast_in_dim", "mul"]
    assert prims[1] == ["mul"]
    out = eval_program(bind_constants(big, {0: np.float64(3.0)}), np.ones((4097, 1)))[0]
    np.testing.assert_array_equal(out, np.full((4097, 1), 3.0))
