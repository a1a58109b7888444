"""opt: program passes, GraphProgram -> GraphProgram, between autodiff and lowering.

Every entry point (plain calls, tg.jit, tg.grad / tg.value_and_grad / tg.vjp, explain()
and the torch bridge) runs `optimize_program(program, facts)`; the facts (opt/facts.py)
say where the program stands, and decide which passes run, always in the order of
PROGRAM_PASSES. Each pass is pure, `(program, facts) -> (program, notes)`, and exact
(up to float rounding order):

- hoist_linear (staged): parameter-only edge work and an edge MLP's first/last linear
  layers move out of the edge loop (per entity, once per call).
- edge_products (vjp): derived edge functions emit outer products in the layout they are
  used in (no per-edge transpose).
- residuals (vjp, given the forward): the VJP reads the forward's intermediate values
  instead of recomputing them.
- uniform_fields (execute): a propagate field that is one literal broadcast to every row
  (tg.grad's seed of ones) becomes a literal of the edge function.
- cse, dce (execute): common subexpressions once, unused equations dropped.
- unused_operands (execute; after attention_pairing, which matches operands): propagate
  operands the edge function never reads are dropped.
- attention_pairing (execute; staged in the torch bridge): attention's forward returns its
  row statistics (residual outputs its VJP reads) and the VJP's dk/dv and dq walks are one
  multi-output propagate.
- negations (execute; staged in the torch bridge): `a + (-b)` as `a - b`.
- fuse_walks (execute): independent sum propagates over one radius/knn relation share
  one walk.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.program import GraphProgram
from .attention_pairing import attention_pairing_pass
from .cse import cse_pass
from .dce import dce_pass
from .edge_products import edge_products_pass, simplify_edge_functions
from .facts import STAGES, ProgramFacts
from .fuse_walks import fuse_relation_walks, fuse_walks_pass, relation_kind, relation_kinds
from .hoist_linear import hoist_linear_pass, hoist_linear_projections
from .negations import fold_negations, negations_pass
from .residuals import forward_with_residuals, residuals_pass, save_residuals
from .uniform_fields import uniform_fields_pass
from .unused_operands import unused_operands_pass

Pass = Callable[[GraphProgram, ProgramFacts], tuple]

# name -> pass, in the one order they run (looked up per call: a test may replace one)
PROGRAM_PASSES: dict[str, Pass] = {
    "hoist_linear": hoist_linear_pass,
    "edge_products": edge_products_pass,
    "residuals": residuals_pass,
    "uniform_fields": uniform_fields_pass,
    "cse": cse_pass,
    "attention_pairing": attention_pairing_pass,
    "dce": dce_pass,
    "unused_operands": unused_operands_pass,
    "negations": negations_pass,
    "fuse_walks": fuse_walks_pass,
}

# which facts call for each pass
_RUNS_WHEN: dict[str, Callable[[ProgramFacts], bool]] = {
    "hoist_linear": lambda f: f.stage == "staged",
    "edge_products": lambda f: f.stage == "vjp",
    "residuals": lambda f: f.stage == "vjp" and f.forward is not None,
    "uniform_fields": lambda f: f.stage == "execute",
    "cse": lambda f: f.stage == "execute",
    # the torch bridge's forward runs on its own: its attention returns the statistics then
    "attention_pairing": lambda f: f.stage == "execute" or (f.stage == "staged" and f.bridge),
    "dce": lambda f: f.stage == "execute",
    "unused_operands": lambda f: f.stage == "execute",
    # the torch bridge runs its staged forward as is: fold the hoisted `b - p W` there
    "negations": lambda f: f.stage == "execute" or (f.stage == "staged" and f.bridge),
    "fuse_walks": lambda f: f.stage == "execute",
}


def passes_for(facts: ProgramFacts) -> list[str]:
    """The names of the passes `facts` call for, in run order."""
    return [name for name in PROGRAM_PASSES if _RUNS_WHEN[name](facts)]


def optimize_program(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """(program after the passes `facts` call for, their notes in run order)."""
    notes: list = []
    for name in passes_for(facts):
        program, more = PROGRAM_PASSES[name](program, facts)
        notes.extend(more)
    return program, notes


__all__ = ["PROGRAM_PASSES", "STAGES", "ProgramFacts", "optimize_program", "passes_for",
           "relation_kind", "relation_kinds", "forward_with_residuals",
           "fold_negations", "fuse_relation_walks", "hoist_linear_projections",
           "save_residuals", "simplify_edge_functions"]
