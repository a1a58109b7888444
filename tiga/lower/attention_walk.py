"""lower: which propagates the tiled dot-product attention walk claims.

One predicate for the Iter stage (a claimed `gf.apply` walks `attention-tiles`) and the
runtime's attention route (xla_free_runtime/backends/cpu/attention.py runs what it claims), so the
walk the IR names is the walk that runs:

- the forward: an online_softmax propagate by destination, without update, whose edge
  function is dot-product attention (`autodiff.rules.attention.match_attention`);
- the canonical propagates of its VJP (row max, row mass, dq, (dk, dv), and (dk, dv, dq) from
  one walk), recognised by their operand names and the structure of their edge programs;

over a dense, triangular or cu_seqlens relation: every destination row reads one contiguous
source range [lo, hi), lo and hi nondecreasing, which is all the tiled walk needs.
"""
from __future__ import annotations

from ..autodiff.rules.attention import (
    CANONICAL,
    STREAMING_KINDS,
    canonical_program,
    kind_of,
    match_attention,
)
from ..core.prims.graph import row_type

ATTENTION_TILES = "attention-tiles"
# the canonical VJP propagates the backward kernel runs (row max and mass: the forward's
# numpy tiles; dscale: not claimed)
BACKWARD_KINDS = ("dq", "dkdv", "dkdvq")


def claim_attention(relation_kind: str, params: dict, field_types) -> tuple | None:
    """("forward", pattern) or (canonical VJP kind, None) when the attention walk runs this
    propagate, else None. `params` are the propagate's, `field_types` its field operands'
    types (the relation excluded)."""
    if relation_kind not in STREAMING_KINDS or params["update"] is not None:
        return None
    kind = kind_of(params["names"])
    if kind is not None:
        if kind == "dscale" or params["reduce_by"] != CANONICAL[kind][3]:
            return None
        types = [row_type(t) if r != "param" else t.strong()
                 for t, r in zip(field_types, CANONICAL[kind][1])]
        if canonical_program(kind, types).structure_key() != params["edge_fn"].structure_key():
            return None
        if field_types[0].dtype.name not in ("float32", "float64"):
            return None
        return kind, None
    if params["reduce_by"] != "dst" or params["reducer"].name != "online_softmax":
        return None
    pattern = match_attention(params["edge_fn"], params["roles"], params["reducer"])
    return None if pattern is None else ("forward", pattern)


def claim_computation(comp) -> tuple | None:
    """claim_attention for a Domain/Iter/Kernel computation (its regions as programs)."""
    kind = comp.relation.type.kind
    if kind not in STREAMING_KINDS or comp.update is not None:
        return None
    if kind_of(comp.input_names) is None and comp.reducer.name != "online_softmax":
        return None      # (cheap filters first: the regions convert only for candidates)
    from .ir.base import propagate_params

    return claim_attention(kind, propagate_params(comp), [v.type for v in comp.inputs])


def attention_kernel(comp) -> str | None:
    """Which attention kernel's tiles a claimed computation runs by: "forward" (the
    online_softmax forward), "backward" (dq, dk, dv) or None (row max, row mass)."""
    kind = kind_of(comp.input_names)
    if kind is None:
        return "forward"
    return "backward" if kind in BACKWARD_KINDS else None
