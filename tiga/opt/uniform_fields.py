"""opt: a propagate field that is one constant broadcast to every row becomes a literal of
its edge function.

tg.grad seeds the backward with ones broadcast to the output's shape: the cotangent of
`propagate(...).sum()` is a (rows, features) field of ones, which the backward walks read
per edge. As a field it is an array allocated, hashed for the caches and read per edge;
as a literal of the edge function it is a register (and `x * 1` folds away in codegen).
Only a broadcast of a one-element literal is taken (its value is known when the program
is rewritten), on operands of propagates without an update function (an update reads
destination fields and parameters by position) other than attention's (its canonical VJP
walks are known to the runtime by their operands), and at least one operand stays (the
field that gives a walk its rows). The broadcast itself is left to dce.
"""
from __future__ import annotations

import dataclasses

from ..autodiff.rules.attention import kind_of
from ..core.prims.graph import propagate_p
from ..core.prims.shape import broadcast_in_dim_p
from ..core.program import ClosedProgram, Eqn, GraphProgram, Lit, Var
from ..core.types import TensorType
from .facts import ProgramFacts


def _uniform_producers(program: GraphProgram) -> dict:
    """id(var) -> the one-element literal a broadcast_in_dim spreads over it."""
    found = {}
    for e in program.eqns:
        if e.primitive is broadcast_in_dim_p:
            (x,) = e.inputs
            if isinstance(x, Lit) and x.value.size == 1:
                found[id(e.outputs[0])] = x
    return found


def _absorbed(eqn: Eqn, uniform: dict) -> Eqn:
    p = eqn.params
    if (p.get("update") is not None or p["reducer"].name == "online_softmax"
            or kind_of(p["names"]) is not None):
        return eqn
    operands = eqn.inputs[1:]
    take = [i for i, a in enumerate(operands) if isinstance(a, Var) and id(a) in uniform]
    if not take:
        return eqn
    if len(take) == len(operands):
        take = take[1:]
        if not take:
            return eqn
    closed = p["edge_fn"]
    n = len(closed.consts)
    binders = closed.program.in_binders
    made = []
    for i in take:
        b = binders[n + i]
        lit = uniform[id(operands[i])]
        scalar = Lit(lit.value.reshape(()), TensorType((), b.type.dtype, b.type.weak))
        made.append(Eqn(broadcast_in_dim_p, (scalar,),
                        {"shape": tuple(b.type.shape), "broadcast_dimensions": ()}, (b,)))
    keep = [i for i in range(len(operands)) if i not in take]
    fn = ClosedProgram(GraphProgram(binders[:n] + tuple(binders[n + i] for i in keep),
                                    tuple(made) + tuple(closed.program.eqns),
                                    closed.program.outs), closed.consts)
    params = dict(p, edge_fn=fn, roles=tuple(p["roles"][i] for i in keep),
                  names=tuple(p["names"][i] for i in keep))
    inputs = (eqn.inputs[0],) + tuple(operands[i] for i in keep)
    return dataclasses.replace(eqn, inputs=inputs, params=params)


def uniform_fields_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram,
                                                                             list]:
    uniform = _uniform_producers(program)
    if not uniform:
        return program, []
    eqns = tuple(_absorbed(e, uniform) if e.primitive is propagate_p else e
                 for e in program.eqns)
    if all(a is b for a, b in zip(eqns, program.eqns)):
        return program, []
    return GraphProgram(program.in_binders, eqns, program.outs), []


__all__ = ["uniform_fields_pass"]
