"""runtime: choose a route for a program, run it, and explain the choice."""
from __future__ import annotations

import numpy as np

from ..core.check import check_program
from ..core.config import config
from ..core.errors import UnsupportedError
from ..core.eval import eval_program
from ..core.prims.graph import propagate_p
from ..core.program import GraphProgram
from ..core.types import GraphType
from .explain import Explanation

REFERENCE_REASON = ("no compiled backend is built yet (the CPU LLVM compiler is a later "
                    "issue); the numpy reference interpreter runs every program")


def select_route(program: GraphProgram) -> str:
    """Every program currently runs on the reference interpreter; strict mode refuses that."""
    if config.strict:
        raise UnsupportedError("strict mode: this program would fall back to the reference "
                               "interpreter", hint="unset TIGA_STRICT / tg.config.strict, or "
                               "use a route with a compiled backend")
    return "reference"


def execute(program: GraphProgram, args: list) -> list:
    if config.check:
        check_program(program)
    select_route(program)
    return eval_program(program, *args)


def explain_program(program: GraphProgram, args: list) -> Explanation:
    ex = Explanation(route="reference", backend="numpy reference interpreter",
                     reason=REFERENCE_REASON, program=str(program))
    total = 0
    for eqn in program.eqns:
        if eqn.primitive is not propagate_p:
            continue
        graph = _concrete_graph(eqn, program, args)
        p = eqn.params
        kind = graph.kind if graph is not None else eqn.inputs[0].type.kind
        ex.traversal.append(f"propagate[{p['reducer'].pp_param()}] over {kind} relation, "
                            f"grouped by {p['reduce_by']}, visiting every edge in edge order")
        if graph is not None:
            nbytes = _message_bytes(eqn, graph)
            total += nbytes
            ex.materialized.append((f"({graph.num_edges}, ...) message arrays", nbytes,
                                    "the interpreter gathers fields per edge and evaluates "
                                    "the edge function on whole arrays"))
            if kind != "csr":
                ex.materialized.append(("CSR of the implicit relation",
                                        8 * (graph.num_dst + 1 + graph.num_edges),
                                        "the interpreter walks resolved CSR"))
    ex.estimated_bytes = total
    ex.vjp_route = ("reference interpreter over the VJP program: source cotangents are a "
                    "propagate grouped by source (the transposed relation), edge cotangents "
                    "per edge, parameter cotangents summed over edges")
    ex.cache = "no executable cache on the reference route (programs are re-traced per call)"
    return ex


def _concrete_graph(eqn, program, args):
    src = eqn.inputs[0]
    for v, a in zip(program.in_binders, args):
        if v is src:
            return a
    return getattr(src, "value", None) if isinstance(src.type, GraphType) else None


def _message_bytes(eqn, graph) -> int:
    out = 0
    for t in eqn.params["edge_fn"].out_types:
        n = int(np.prod([d for d in t.shape])) if t.shape else 1
        out += n * t.dtype.itemsize * graph.num_edges
    return out
