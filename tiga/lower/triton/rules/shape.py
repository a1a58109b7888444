"""lower/triton: shape primitives on padded tiles. broadcast_in_dim and transpose work at any
size; reshape when no axis is padded, or when it only adds or drops unit axes (a padded
row is not contiguous in its logical layout, but unit axes pad to 1, so dropping them moves
no lane: the `(1, K) -> (K,)` around a vector-matrix product). slice, pad and concatenate
have no rendering yet (the reference runs them)."""
from __future__ import annotations

from ....core.prims.shape import broadcast_in_dim_p, reshape_p, transpose_p
from ...registry import lowering_rules
from ..emitter import TV, TritonUnsupported, pow2, tl_dtype

R = lowering_rules["triton"]


def broadcast_in_dim_rule(ctx, in_types, out_types, x: TV, *, shape, broadcast_dimensions):
    out = out_types[0]
    if x.lead == "const":
        expr = (f"tl.full([1, {', '.join(str(pow2(d)) for d in shape)}], {x.expr}, "
                f"{tl_dtype(out.dtype)})" if shape else f"tl.full([1], {x.expr}, "
                f"{tl_dtype(out.dtype)})")
        return [ctx.value(expr, out.shape, out.dtype, "row", "b")]
    if list(broadcast_dimensions) != sorted(broadcast_dimensions):
        raise TritonUnsupported("broadcast_in_dim that reorders axes")
    for i, d in enumerate(broadcast_dimensions):
        if x.shape[i] != shape[d] and x.shape[i] != 1:
            raise TritonUnsupported("broadcast_in_dim shape mismatch")
    idx = [":"] + ["None"] * len(shape)
    for d in broadcast_dimensions:
        idx[d + 1] = ":"
    expanded = f"{x.expr}[{', '.join(idx)}]" if len(shape) != len(x.shape) else x.expr
    lead = ctx.lanes if x.lead == "edge" else "1"
    padded = ", ".join(str(pow2(d)) for d in shape)
    full = f"tl.broadcast_to({expanded}, [{lead}, {padded}])"
    return [ctx.value(full, out.shape, out.dtype, x.lead, "b")]


def reshape_rule(ctx, in_types, out_types, x: TV, **params):
    out = out_types[0]
    if x.lead == "const":
        return [x]
    units_only = _non_unit(x.shape) == _non_unit(out.shape)
    if not units_only and (not x.exact or any(pow2(d) != d for d in out.shape)):
        raise TritonUnsupported(f"reshape of a padded row ({x.shape} -> {out.shape})")
    inserted = _inserted_units(tuple(x.shape), tuple(out.shape))
    if inserted is not None:   # only unit axes added: an expand_dims keeps the tile's layout
        return [ctx.value(f"{x.expr}[{inserted}]", out.shape, out.dtype, x.lead, "s")]
    lead = ctx.lanes if x.lead == "edge" else "1"
    dims = ", ".join([lead] + [str(pow2(d)) for d in out.shape])
    return [ctx.value(f"tl.reshape({x.expr}, [{dims}])", out.shape, out.dtype, x.lead, "s")]


def _inserted_units(shape: tuple, out: tuple) -> str | None:
    """The index `:, ..., None, ...` that makes `shape` into `out` by inserting unit axes
    only (None when the reshape does anything else)."""
    idx, i = [":"], 0
    for d in out:
        if i < len(shape) and shape[i] == d:
            idx.append(":")
            i += 1
        elif d == 1:
            idx.append("None")
        else:
            return None
    return ", ".join(idx) if i == len(shape) and len(out) > len(shape) else None


def _non_unit(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def transpose_rule(ctx, in_types, out_types, x: TV, *, permutation):
    out = out_types[0]
    if list(permutation) == sorted(permutation) or x.lead == "const":
        return [TV(x.expr, out.shape, out.dtype, x.lead)]
    dims = ", ".join(["0"] + [str(a + 1) for a in permutation])
    return [ctx.value(f"tl.permute({x.expr}, ({dims}))", out.shape, out.dtype, x.lead, "t")]


R[broadcast_in_dim_p] = broadcast_in_dim_rule
R[reshape_p] = reshape_rule
R[transpose_p] = transpose_rule
