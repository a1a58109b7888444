"""opt: propagate operands the edge function never reads are dropped.

Autodiff derives edge functions that take every operand of the forward walk although
they read only some (a sum's source cotangent reads the destination cotangent, not the
source field). A dropped operand is one field fewer to bind, check and, over a paged
relation, to read from disk page by page. Only propagates without an update function
(an update reads destination fields and parameters by position), and at least one
operand stays (the field that gives a walk its rows).
"""
from __future__ import annotations

import dataclasses

from ..core.prims.graph import propagate_p
from ..core.program import ClosedProgram, GraphProgram
from .facts import ProgramFacts


def _pruned(eqn):
    p = eqn.params
    if p.get("update") is not None:
        return eqn
    read = p["edge_fn"].read_inputs()
    used = [i in read for i in range(len(p["roles"]))]
    if all(used):
        return eqn
    if not any(used):
        used[0] = True
    keep = [i for i, u in enumerate(used) if u]
    closed = p["edge_fn"]
    n = len(closed.consts)
    binders = closed.program.in_binders
    fn = ClosedProgram(GraphProgram(binders[:n] + tuple(binders[n + i] for i in keep),
                                    closed.program.eqns, closed.program.outs), closed.consts)
    params = dict(p, edge_fn=fn, roles=tuple(p["roles"][i] for i in keep),
                  names=tuple(p["names"][i] for i in keep))
    inputs = (eqn.inputs[0],) + tuple(eqn.inputs[1 + i] for i in keep)
    return dataclasses.replace(eqn, inputs=inputs, params=params)


def unused_operands_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram,
                                                                               list]:
    eqns = tuple(_pruned(e) if e.primitive is propagate_p else e for e in program.eqns)
    if all(a is b for a, b in zip(eqns, program.eqns)):
        return program, []
    return GraphProgram(program.in_binders, eqns, program.outs), []


__all__ = ["unused_operands_pass"]
