"""autodiff: partial evaluation, one program -> (known part, unknown part) (tg.linearize).

The known part runs what does not depend on the unknown inputs (for a JVP program: the
forward and the values its tangents read) once; the unknown part takes those residuals and
the unknown inputs. A relation is never a residual: the equations that produce one (radius,
knn) run again in the unknown part, from their (known) tensor residuals.
"""
from __future__ import annotations

from ..core.passes import dce
from ..core.program import GraphProgram, Var
from ..core.types import GraphType


def _split_eqns(program: GraphProgram, unknown_in):
    unknown = {id(v) for v, u in zip(program.in_binders, unknown_in) if u}
    known_eqns, unknown_eqns = [], []
    for e in program.eqns:
        if any(isinstance(a, Var) and id(a) in unknown for a in e.inputs):
            unknown_eqns.append(e)
            unknown.update(id(v) for v in e.outputs)
        else:
            known_eqns.append(e)
    return known_eqns, unknown_eqns, unknown


def _relation_producers(known_eqns, needed: set) -> list:
    """Known equations producing relations the unknown part reads (with what they read)."""
    producers = {id(v): e for e in known_eqns for v in e.outputs}
    chosen, stack = [], [i for i in needed if i in producers]
    seen = set()
    while stack:
        e = producers[stack.pop()]
        if id(e) in seen:
            continue
        seen.add(id(e))
        chosen.append(e)
        stack += [id(a) for a in e.inputs if isinstance(a, Var) and id(a) in producers
                  and isinstance(a.type, GraphType)]
    order = {id(e): i for i, e in enumerate(known_eqns)}
    return sorted(chosen, key=lambda e: order[id(e)])


def partial_eval(program: GraphProgram, unknown_in, n_known_outs: int):
    """(known, unknown): `known(*known inputs) -> (*outs[:n_known_outs], *residuals)` and
    `unknown(*residuals, *known inputs, *unknown inputs) -> outs[n_known_outs:]`. The
    first outputs must not depend on the unknown inputs."""
    known_eqns, unknown_eqns, unknown = _split_eqns(program, unknown_in)
    outs = list(program.outs)
    if any(isinstance(a, Var) and id(a) in unknown for a in outs[:n_known_outs]):
        raise ValueError("partial_eval: a known output depends on an unknown input")
    later = outs[n_known_outs:]
    reads = [a for e in unknown_eqns for a in e.inputs] + later
    graph_ids = {id(a) for a in reads if isinstance(a, Var) and isinstance(a.type, GraphType)
                 and id(a) not in unknown}
    replayed = _relation_producers(known_eqns, graph_ids)
    reads += [a for e in replayed for a in e.inputs]
    skip = (unknown | {id(v) for e in replayed for v in e.outputs}
            | {id(v) for v in program.in_binders})
    residuals, seen = [], set()
    for a in reads:
        if isinstance(a, Var) and id(a) not in skip and id(a) not in seen:
            seen.add(id(a))
            residuals.append(a)
    known_binders = [v for v, u in zip(program.in_binders, unknown_in) if not u]
    known = dce(GraphProgram(known_binders, known_eqns, outs[:n_known_outs] + residuals))
    unknown_binders = [v for v, u in zip(program.in_binders, unknown_in) if u]
    rest = GraphProgram(residuals + known_binders + unknown_binders, replayed + unknown_eqns,
                        later)
    return known, dce(rest)
