"""Every primitive carries every rule kind DESIGN.md requires (one test id per primitive).

Rules: abstract eval, numpy impl, a VJP rule or NONDIFF, a JVP rule or NONDIFF, a batching
rule (vmap), and for each lowering backend either
a lowering or an explained REFERENCE_ONLY marker. Primitives that are neither graph nor
control primitives can appear inside edge and update functions, so they also need a
row-batching rule for the reference interpreter's row-batched evaluation.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import tiga as tg  # noqa: F401  (importing tiga registers every primitive and rule)
from tiga.autodiff import NONDIFF, vjp_rules
from tiga.autodiff.batching import batch_rules
from tiga.autodiff.jvp import jvp_rules
from tiga.core.eval import eval_rows
from tiga.core.primitive import (
    Primitive,
    abstract_eval_rules,
    all_primitives,
    elementwise_batch_rule,
    get_primitive,
    impl_rules,
    row_batch_rules,
)
from tiga.core.program import ClosedProgram
from tiga.lower.registry import REFERENCE_ONLY, lowering_rules
from tiga.trace.staging import trace_flat

PRIMS = all_primitives()
IDS = [p.name for p in PRIMS]
NOT_ROW_LEVEL = ("graph", "control")  # families that never run per edge or per row


def test_registry_is_non_trivial_and_names_are_unique():
    assert len(PRIMS) >= 40
    assert len(set(IDS)) == len(IDS)
    for p in PRIMS:
        assert get_primitive(p.name) is p


def test_there_are_lowering_backends():
    assert set(lowering_rules) >= {"cpu-llvm", "triton"}


@pytest.mark.parametrize("p", PRIMS, ids=IDS)
def test_abstract_eval_and_impl(p: Primitive):
    assert callable(abstract_eval_rules.get(p)), f"{p.name}: no abstract eval rule"
    assert callable(impl_rules.get(p)), f"{p.name}: no impl (reference) rule"


@pytest.mark.parametrize("p", PRIMS, ids=IDS)
def test_vjp_rule_or_nondiff(p: Primitive):
    rule = vjp_rules.get(p)
    assert rule is NONDIFF or callable(rule), f"{p.name}: neither a VJP rule nor NONDIFF"
    if rule is not NONDIFF:
        # frozen signature (ct_outs, outs, *ins, **params)
        params = list(inspect.signature(rule).parameters.values())
        assert len(params) >= 2, f"{p.name}: VJP rule does not take (ct_outs, outs, *ins)"


@pytest.mark.parametrize("p", PRIMS, ids=IDS)
def test_jvp_rule_or_nondiff(p: Primitive):
    rule = jvp_rules.get(p)
    assert rule is NONDIFF or callable(rule), f"{p.name}: neither a JVP rule nor NONDIFF"
    if rule is not NONDIFF:
        # frozen signature (primals, tangents, **params)
        params = list(inspect.signature(rule).parameters.values())
        assert len(params) >= 2, f"{p.name}: JVP rule does not take (primals, tangents)"
    # a primitive whose inputs get no cotangent passes no tangent on either
    if vjp_rules.get(p) is NONDIFF:
        assert rule is NONDIFF, f"{p.name}: NONDIFF in reverse mode only"


@pytest.mark.parametrize("p", PRIMS, ids=IDS)
def test_batching_rule(p: Primitive):
    rule = batch_rules.get(p)
    assert callable(rule), f"{p.name}: no batching rule (vmap)"
    params = list(inspect.signature(rule).parameters.values())
    assert len(params) >= 3, f"{p.name}: batching rule does not take (args, batched, size)"


@pytest.mark.parametrize("backend", sorted(lowering_rules))
@pytest.mark.parametrize("p", PRIMS, ids=IDS)
def test_lowering_or_explained_reference_only(p: Primitive, backend: str):
    if p in lowering_rules[backend]:
        assert callable(lowering_rules[backend][p])
        return
    reason = REFERENCE_ONLY.get(p)
    assert isinstance(reason, str) and reason.strip(), (
        f"{p.name}: no {backend} lowering and no REFERENCE_ONLY entry with a reason")


@pytest.mark.parametrize("p", [p for p in PRIMS if p.family not in NOT_ROW_LEVEL],
                         ids=[p.name for p in PRIMS if p.family not in NOT_ROW_LEVEL])
def test_row_level_primitives_have_row_batch_rules(p: Primitive):
    assert callable(row_batch_rules.get(p)), (
        f"{p.name} ({p.family}) may run inside edge functions but has no row_batch_rule")


def test_families_are_known():
    assert {p.family for p in PRIMS} <= {"elementwise", "reductions", "linalg", "shape",
                                          "graph", "control"}


# A behavioural spot check of the batching rules: the row-batched evaluation of a row function
# must equal a plain Python loop over rows, for one representative of each non-elementwise
# batching rule (elementwise ones are the identity rule).
def _row_fn(x, y):
    m = tg.math
    a = m.reshape(m.transpose(x, (1, 0)), (6,))                          # transpose, reshape
    b = m.pad(a[1:5:2], [(1, 1, 1)])                                     # slice, pad
    c = m.concatenate([b, m.broadcast_to(m.sum(y), (2,))], axis=0)       # concat, bcast, sum
    d = m.max(x, axis=1) * m.min(x, axis=0)[:2] + m.prod(x, axis=1)      # max, min, prod
    return m.dot_general(x, y, (((1,), (0,)), ((), ()))), c * 2.0, d      # dot_general


def test_row_batch_rules_match_a_loop_over_rows():
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((5, 2, 3)), rng.standard_normal((5, 3))
    from tiga.core.types import TensorType

    prog, caps, _ = trace_flat(_row_fn, [TensorType((2, 3), tg.float64),
                                         TensorType((3,), tg.float64)], top=False)
    assert not caps
    used = {e.primitive for e in prog.eqns}
    structural = {p for p in PRIMS if p.family not in NOT_ROW_LEVEL
                  and row_batch_rules.get(p) is not elementwise_batch_rule}
    assert structural <= used, f"not exercised: {sorted(p.name for p in structural - used)}"
    batched = eval_rows(ClosedProgram(prog), [xs, ys], [True, True], 5)
    for i in range(5):
        want = tg.eval_program(prog, xs[i], ys[i])
        for got, w in zip(batched, want):
            np.testing.assert_allclose(got[i], w, rtol=1e-12, atol=1e-12)
