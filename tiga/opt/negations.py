"""opt: `a + (-b)` as `a - b` at the top level of a program.

Hoisting a first Linear gives the destination rows `-p W_p + b` and the VJP sums a
cotangent with a negated one: each negation is a full pass over an (entities, hidden)
array whose only reader is an add. IEEE-754 defines `a - b` as `a + (-b)`, so the fold is
exact (signed zeros included); a negation read elsewhere stays.
"""
from __future__ import annotations

from ..core.passes import dce, use_counts
from ..core.prims.elementwise import binary_p, unary_p
from ..core.program import Eqn, GraphProgram, Var
from .facts import ProgramFacts


def fold_negations(program: GraphProgram) -> GraphProgram:
    uses = use_counts(program)
    negated = {id(e.outputs[0]): e.inputs[0] for e in program.eqns
               if e.primitive is unary_p["neg"]}

    def single_neg(a):
        return isinstance(a, Var) and id(a) in negated and uses.get(id(a)) == 1

    eqns, changed = [], False
    for e in program.eqns:
        if e.primitive is binary_p["add"] and len(e.inputs) == 2:
            a, b = e.inputs
            if single_neg(b) and a.type == negated[id(b)].type:
                e = Eqn(binary_p["sub"], (a, negated[id(b)]), e.params, e.outputs)
                changed = True
            elif single_neg(a) and b.type == negated[id(a)].type:
                e = Eqn(binary_p["sub"], (b, negated[id(a)]), e.params, e.outputs)
                changed = True
        eqns.append(e)
    if not changed:
        return program
    return dce(GraphProgram(program.in_binders, eqns, program.outs))


def negations_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    return fold_negations(program), []


__all__ = ["fold_negations", "negations_pass"]
