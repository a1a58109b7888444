"""opt: dot-product attention's forward and backward paired into multi-output propagates.

Attention's VJP (autodiff.rules.attention) reads the forward's per-row statistics (row max
and mass of the scores, together the log-sum-exp) and computes dq by destination and
(dk, dv) by source. Written separately, those are four walks besides the forward. The
streaming route produces them in fewer: its forward keeps the statistics anyway, and one
walk over key blocks yields dq, dk and dv. This pass says so in the program, so the runtime
carries no value from one kernel to the next:

- forward: `y = propagate[online_softmax](g, q, k, v, ...)` together with the canonical
  `rowmax` and `mass` propagates over the same (g, q, k, scale) reading y becomes
  `y, top, mass = propagate[online_softmax(stats)](...)`; the two propagates go.
  At "staged" in the torch bridge (whose forward runs on its own, the VJP later), every
  attention forward returns its statistics: the VJP rule reads them, and the residuals
  pass makes them forward outputs the VJP takes as inputs.
- backward: a canonical `dkdv` and a `dq` propagate over the very same operands become one
  `dk, dv, dq = propagate[sum](...)` with `reduce_by=("src", "src", "dst")` (kind `dkdvq`).

Runs at "execute" (and "staged" for the bridge's forward), where nothing differentiates
the program again. Only relations the streaming route walks (dense, triangular,
cu_seqlens) are paired. Exact: the statistics are what the canonical propagates compute,
and each output of the fused walk is its own sum over the same messages.
"""
from __future__ import annotations

import numpy as np

from ..autodiff.rules.attention import (
    CANONICAL,
    STREAMING_KINDS,
    canonical_program,
    kind_of,
    match_attention,
    names_of,
    vjp_dtypes,
)
from ..core.primitive import abstract_eval_rules, impl_rules
from ..core.prims.graph import propagate_p
from ..core.program import Eqn, GraphProgram, Lit, Var
from ..core.reducers import sum as sum_reducer
from .facts import ProgramFacts


def attention_pairing_pass(program: GraphProgram,
                           facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """The program with attention's forward statistics and fused backward as outputs of
    multi-output propagates (unchanged when there is nothing to pair)."""
    if facts.stage == "staged":
        return _with_stats_everywhere(program), []
    program = _pair_forward_statistics(program)
    return _pair_backward(program), []


def _attention(eqn):
    """The AttentionPattern of a streaming-route attention forward without statistics."""
    if eqn.primitive is not propagate_p:
        return None
    p = eqn.params
    red = p["reducer"]
    if (p["reduce_by"] != "dst" or p["update"] is not None or red.stats or
            getattr(eqn.inputs[0].type, "kind", None) not in STREAMING_KINDS):
        return None
    # (16-bit fields where the selected route's VJP takes them, as the VJP rule decides)
    return match_attention(p["edge_fn"], p["roles"], red, vjp_dtypes())


def _stats_eqn(eqn, outs) -> Eqn:
    return Eqn(propagate_p, eqn.inputs, {**eqn.params, "reducer": eqn.params["reducer"]
                                         .with_stats()}, tuple(outs))


def _with_stats_everywhere(program: GraphProgram) -> GraphProgram:
    eqns, changed = [], False
    for e in program.eqns:
        if _attention(e) is None:
            eqns.append(e)
            continue
        params = {**e.params, "reducer": e.params["reducer"].with_stats()}
        types = abstract_eval_rules[propagate_p](*(a.type for a in e.inputs), **params)
        eqns.append(_stats_eqn(e, (e.outputs[0], Var(types[1]), Var(types[2]))))
        changed = True
    return GraphProgram(program.in_binders, eqns, program.outs) if changed else program


def _same(a, b) -> bool:
    """Whether two operands are one value: the same variable, the same relation object, or
    literals of one type and value."""
    if a is b:
        return True
    if not (isinstance(a, Lit) and isinstance(b, Lit)) or a.type != b.type:
        return False
    if not isinstance(a.value, np.ndarray | np.generic):      # a relation: by identity
        return a.value is b.value
    return np.array_equal(a.value, b.value)


def _same_all(xs, ys) -> bool:
    return len(xs) == len(ys) and all(_same(a, b) for a, b in zip(xs, ys))


def _constant(atom, producer: dict):
    """The float value of a scalar constant (a literal, or an equation of literals)."""
    if isinstance(atom, Lit):
        return float(np.asarray(atom.value))
    e = producer.get(id(atom))
    if (e is None or not all(isinstance(a, Lit) for a in e.inputs) or
            e.primitive not in impl_rules or len(e.outputs) != 1):
        return None
    out = impl_rules[e.primitive](*(a.value for a in e.inputs), **e.params)
    return float(np.asarray(out[0] if e.primitive.multiple_results else out))


def _same_scale(pat, fwd, atom, producer) -> bool:
    if pat.scale is not None and pat.scale[0] == "param":
        return _same(atom, fwd.inputs[1 + pat.scale[1]])
    want = 1.0 if pat.scale is None else pat.scale[1]
    return _constant(atom, producer) == want


def _pair_forward_statistics(program: GraphProgram) -> GraphProgram:
    producer = {id(o): e for e in program.eqns for o in e.outputs}
    by_kind: dict = {"rowmax": [], "mass": []}
    for e in program.eqns:
        kind = kind_of(e.params.get("names")) if e.primitive is propagate_p else None
        if kind in by_kind:
            by_kind[kind].append(e)
    replace, drop = {}, set()
    for e in program.eqns:
        pat = _attention(e)
        if pat is None or not by_kind["rowmax"]:
            continue
        g, q, k, y = e.inputs[0], e.inputs[1 + pat.q], e.inputs[1 + pat.k], e.outputs[0]
        top = next((r for r in by_kind["rowmax"] if id(r) not in drop and
                    _same_all(r.inputs[:3], (g, q, k)) and r.inputs[4] is y and
                    _same_scale(pat, e, r.inputs[3], producer)), None)
        if top is None:
            continue
        mass = next((r for r in by_kind["mass"] if id(r) not in drop and
                     _same_all(r.inputs[:3], (g, q, k)) and r.inputs[4] is y and
                     _same(r.inputs[3], top.inputs[3]) and r.inputs[5] is top.outputs[0]),
                    None)
        if mass is None or not _types_match(e, top.outputs[0], mass.outputs[0]):
            continue
        replace[id(e)] = _stats_eqn(e, (y, top.outputs[0], mass.outputs[0]))
        drop.update((id(top), id(mass)))
    if not replace:
        return program
    eqns = [replace.get(id(e), e) for e in program.eqns if id(e) not in drop]
    return GraphProgram(program.in_binders, eqns, program.outs)


def _types_match(eqn, top, mass) -> bool:
    params = {**eqn.params, "reducer": eqn.params["reducer"].with_stats()}
    types = abstract_eval_rules[propagate_p](*(a.type for a in eqn.inputs), **params)
    return types[1].strong() == top.type.strong() and types[2].strong() == mass.type.strong()


def _pair_backward(program: GraphProgram) -> GraphProgram:
    """A `dkdv` and a `dq` canonical propagate over the same operands as one `dkdvq`."""
    def canonical(e, kind):
        return (e.primitive is propagate_p and kind_of(e.params["names"]) == kind and
            e.params["reduce_by"] == CANONICAL[kind][3] and
            getattr(e.inputs[0].type, "kind", None) in STREAMING_KINDS)

    dqs = [e for e in program.eqns if canonical(e, "dq")]
    pos = {id(e): i for i, e in enumerate(program.eqns)}
    fused, drop, taken = {}, set(), set()
    for e in program.eqns:
        if not dqs or not canonical(e, "dkdv"):
            continue
        dq = next((d for d in dqs if id(d) not in taken and _same_all(d.inputs, e.inputs)),
                  None)
        if dq is None:
            continue
        taken.add(id(dq))
        rows = e.params["edge_fn"].in_types
        params = {**e.params, "edge_fn": canonical_program("dkdvq", rows),
                  "reducer": sum_reducer(), "names": names_of("dkdvq"),
                  "reduce_by": CANONICAL["dkdvq"][3]}
        eqn = Eqn(propagate_p, e.inputs, params, tuple(e.outputs) + tuple(dq.outputs))
        # at the earlier of the two: both read the same operands, defined before either
        first, later = (e, dq) if pos[id(e)] < pos[id(dq)] else (dq, e)
        fused[id(first)] = eqn
        drop.add(id(later))
    if not fused:
        return program
    eqns = [fused.get(id(e), e) for e in program.eqns if id(e) not in drop]
    return GraphProgram(program.in_binders, eqns, program.outs)


__all__ = ["attention_pairing_pass"]
