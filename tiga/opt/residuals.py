"""opt: reuse the forward's intermediate values in the VJP instead of recomputing.

A VJP program `(*ins, *cts) -> cotangents` replays the forward program to get the values
its rules read: for an edge MLP after hoist_linear, the per-entity rows of the first
layer and the propagate's hidden sums (a full relation walk). When the forward runs right
before (torch.autograd), those values already exist. `save_residuals` finds the VJP
equations that repeat forward equations on the same operands (same primitive, params and
inputs, matched from the shared binders down) and turns the repeated values the rest of
the VJP reads into extra inputs, which the forward program returns as extra outputs.

Exact: the forward computes the very same equations on the very same operands; the VJP
just reads their results instead of evaluating them again.
"""
from __future__ import annotations

import numpy as np

from ..core.passes import dce
from ..core.program import Eqn, GraphProgram, Lit, Var
from .facts import ProgramFacts


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


def _key(eqn, inputs: tuple) -> tuple:
    return (eqn.primitive.name, inputs,
            tuple(sorted((k, _hashable(v)) for k, v in eqn.params.items())))


def _same_type(a, b) -> bool:
    """Binder types equal up to weak typing: a Python-number operand (a weak f64 scalar in the
    forward) is the same value when the VJP program was traced with it as a strong one."""
    if a == b:
        return True
    return hasattr(a, "weak") and hasattr(b, "weak") and (a.shape, a.dtype) == (b.shape, b.dtype)


def _lit_key(a: Lit) -> tuple:
    if not isinstance(a.value, np.ndarray | np.generic):   # a relation: by identity
        return ("lit-object", id(a.value))
    return ("lit", str(a.type), a.value.tobytes())


def residuals_pass(vjp: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """The VJP reading `facts.forward`'s intermediates instead of recomputing them: its
    extra trailing binders are those forward values themselves (the very Vars), so
    `forward_with_residuals` makes the forward return them. Unchanged without a forward."""
    if facts.forward is None:
        return vjp, []
    new = _read_residuals(facts.forward, vjp)
    return (vjp, []) if new is None else (new, [])


def forward_with_residuals(forward: GraphProgram, vjp: GraphProgram,
                           n_inputs: int) -> GraphProgram:
    """`forward` also returning the residuals `vjp` (from residuals_pass) reads after its
    first `n_inputs` binders."""
    saved = tuple(vjp.in_binders[n_inputs:])
    if not saved:
        return forward
    return GraphProgram(forward.in_binders, forward.eqns, tuple(forward.outs) + saved)


def save_residuals(forward: GraphProgram, vjp: GraphProgram) -> tuple | None:
    """(forward returning its outputs then the residuals, VJP taking its inputs then the
    residuals), or None when the VJP repeats nothing the forward computes."""
    new = _read_residuals(forward, vjp)
    if new is None:
        return None
    return forward_with_residuals(forward, new, len(vjp.in_binders)), new


def _read_residuals(forward: GraphProgram, vjp: GraphProgram) -> GraphProgram | None:
    n_in = len(forward.in_binders)
    if len(vjp.in_binders) < n_in or any(
            not _same_type(a.type, b.type) for a, b in zip(vjp.in_binders, forward.in_binders)):
        return None
    # forward values by (primitive, inputs, params), inputs named by forward value ids
    fkey: dict = {}
    fwd_id = {id(v): ("in", k) for k, v in enumerate(forward.in_binders)}
    for e in forward.eqns:
        ins = tuple(_lit_key(a) if isinstance(a, Lit) else fwd_id.get(id(a)) for a in e.inputs)
        if None in ins:
            continue
        key = _key(e, ins)
        if key not in fkey:
            fkey[key] = e.outputs
        for k, v in enumerate(fkey[key]):
            if id(v) not in fwd_id:
                fwd_id[id(v)] = ("eqn", id(fkey[key][0]), k)
    by_name = {name: v for v in [*forward.in_binders,
                                 *(o for e in forward.eqns for o in e.outputs)]
               for name in [fwd_id.get(id(v))] if name is not None}
    # VJP values that equal a forward value
    same: dict = {id(v): ("in", k) for k, v in enumerate(vjp.in_binders[:n_in])}
    repeated = set()
    for e in vjp.eqns:
        ins = tuple(_lit_key(a) if isinstance(a, Lit) else same.get(id(a)) for a in e.inputs)
        if None in ins:
            continue
        outs = fkey.get(_key(e, ins))
        if outs is None:
            continue
        repeated.add(id(e))
        for v, fv in zip(e.outputs, outs):
            same[id(v)] = fwd_id[id(fv)]
    if not repeated:
        return None
    # the repeated values the remaining VJP reads become residual inputs
    needed, order = set(), []
    reads = [a for e in vjp.eqns if id(e) not in repeated for a in e.inputs] + list(vjp.outs)
    for a in reads:
        if (isinstance(a, Var) and id(a) in same and same[id(a)][0] == "eqn" and
                id(a) not in needed):
            needed.add(id(a))
            order.append(a)
    if not order:
        return None
    # the forward's own values: the pair (forward, VJP) names each residual once
    sub = {id(a): by_name[same[id(a)]] for a in order}
    res_binders = list({id(b): b for b in sub.values()}.values())   # once each

    def s(a):
        return sub.get(id(a), a) if isinstance(a, Var) else a

    eqns = [Eqn(e.primitive, tuple(s(a) for a in e.inputs), e.params, e.outputs)
            for e in vjp.eqns if id(e) not in repeated]
    return dce(GraphProgram(tuple(vjp.in_binders) + tuple(res_binders), eqns,
                            tuple(s(a) for a in vjp.outs)))


__all__ = ["forward_with_residuals", "residuals_pass", "save_residuals"]
