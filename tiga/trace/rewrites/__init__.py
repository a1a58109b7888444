"""trace/rewrites: exact GraphProgram -> GraphProgram rewrites of staged message-passing
calls, applied before autodiff (so the VJP is derived from the rewritten program).

- hoist_linear: parameter-only edge work and an edge MLP's first/last linear layers move out
  of the edge loop (per entity, once per call).
- negations: `a + (-b)` as `a - b` (one pass fewer per hoisted negation).
- residuals: a VJP reads the forward's intermediate values instead of recomputing them.
- fuse_walks: independent sum propagates over one relation share one walk (VJPs).
- edge_products: derived (VJP) edge functions emit outer products in the layout they are
  used in (no per-edge transpose).
"""
from .edge_products import simplify_edge_functions, swap_transposed_products
from .fuse_walks import executable, fuse_relation_walks, relation_kind, relation_kinds
from .hoist_linear import hoist_linear_projections
from .negations import fold_negations
from .residuals import save_residuals

__all__ = ["hoist_linear_projections", "simplify_edge_functions", "swap_transposed_products",
           "fuse_relation_walks", "save_residuals", "fold_negations", "executable",
           "relation_kind", "relation_kinds"]
