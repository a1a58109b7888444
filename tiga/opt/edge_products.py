"""opt: algebraic clean-up of derived edge functions before they are compiled.

The VJP of `x @ W` yields the weight cotangent as `transpose(ct^T x)`: per edge, an outer
product written in one layout and copied into the other with a strided transpose. Emitting
the product in the wanted layout (`x^T ct`) removes the copy and leaves the inner loop on
the contiguous feature axis, which LLVM vectorises.
"""
from __future__ import annotations

from ..core.passes import dce
from ..core.prims.graph import propagate_p
from ..core.prims.linalg import dot_general_p
from ..core.prims.shape import transpose_p
from ..core.program import ClosedProgram, Eqn, GraphProgram
from .facts import ProgramFacts


def swap_transposed_products(program: GraphProgram) -> GraphProgram:
    """`transpose(dot_general(x, y))` of a 2-D, batch-free product -> `dot_general(y, x)`."""
    producer = {}
    eqns, changed = [], False
    for eqn in program.eqns:
        if eqn.primitive is dot_general_p:
            producer[id(eqn.outputs[0])] = eqn
        src = producer.get(id(eqn.inputs[0])) if eqn.primitive is transpose_p else None
        if src is not None and tuple(eqn.params.get("permutation", ())) == (1, 0):
            (lc, rc), (lb, rb) = src.params["dimension_numbers"]
            x, y = src.inputs
            if not lb and x.type.ndim - len(lc) == 1 and y.type.ndim - len(rc) == 1:
                eqn = Eqn(dot_general_p, (y, x),
                          {**src.params, "dimension_numbers": ((rc, lc), ((), ()))},
                          eqn.outputs)
                changed = True
        eqns.append(eqn)
    if not changed:
        return program
    return dce(GraphProgram(program.in_binders, eqns, program.outs))


def simplify_edge_functions(program: GraphProgram) -> GraphProgram:
    """The program with every top-level propagate's edge function cleaned up."""
    eqns, changed = [], False
    for eqn in program.eqns:
        if eqn.primitive is propagate_p:
            fn = eqn.params["edge_fn"]
            new = swap_transposed_products(fn.program)
            if new is not fn.program:
                eqn = Eqn(eqn.primitive, eqn.inputs,
                          {**eqn.params, "edge_fn": ClosedProgram(new, fn.consts)},
                          eqn.outputs)
                changed = True
        eqns.append(eqn)
    return GraphProgram(program.in_binders, eqns, program.outs) if changed else program


def edge_products_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    return simplify_edge_functions(program), []


__all__ = ["edge_products_pass", "simplify_edge_functions", "swap_transposed_products"]
