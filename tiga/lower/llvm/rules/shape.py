"""lower/llvm: shape primitives as strided views (broadcast, reshape, transpose, slice) or
small copies (concatenate, pad, reshape of a non-contiguous view)."""
from __future__ import annotations

from ....core.prims.shape import (
    broadcast_in_dim_p,
    concatenate_p,
    pad_p,
    reshape_p,
    slice_p,
    transpose_p,
)
from ...registry import lowering_rules
from ..values import Val, const, contiguous_strides, i64, linear_index, storage_type


def broadcast_in_dim_rule(ctx, in_types, out_types, x, *, shape, broadcast_dimensions):
    shape = tuple(out_types[0].shape)
    strides = [0] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        if x.shape[i] == shape[d]:
            strides[d] = x.strides[i]
    return [x.with_shape(shape, tuple(strides))]


def reshape_rule(ctx, in_types, out_types, x, *, new_sizes):
    shape = tuple(out_types[0].shape)
    if not x.is_scalar:
        x = ctx.materialize(x)
    return [x.with_shape(shape, contiguous_strides(shape))]


def transpose_rule(ctx, in_types, out_types, x, *, permutation):
    return [x.with_shape(tuple(x.shape[p] for p in permutation),
                         tuple(x.strides[p] for p in permutation))]


def slice_rule(ctx, in_types, out_types, x, *, start_indices, limit_indices, strides):
    shape = tuple(out_types[0].shape)
    if x.is_scalar:
        return [x.with_shape(shape, ())]
    start = [i64(s) for s in start_indices]
    ptr = ctx.b.gep(x.ptr, [linear_index(ctx.b, start, x.strides)],
                    source_etype=_elem(x))
    new_strides = tuple(s * st for s, st in zip(x.strides, strides))
    return [x.with_shape(shape, new_strides, ptr=ptr)]


def _elem(x: Val):
    return storage_type(x.dtype)


def concatenate_rule(ctx, in_types, out_types, *xs, dimension):
    out_t = out_types[0]
    out = ctx.new_buf(tuple(out_t.shape), out_t.dtype)
    offset = 0
    for x in xs:
        base = [i64(0)] * len(out.shape)
        base[dimension] = i64(offset)
        part = out.with_shape(x.shape, out.strides,
                              ptr=ctx.b.gep(out.ptr, [linear_index(ctx.b, base, out.strides)],
                                            source_etype=_elem(out)))
        ctx.copy_into(part, x)
        offset += x.shape[dimension]
    return [out]


def pad_rule(ctx, in_types, out_types, x, *, padding_config):
    out_t = out_types[0]
    out = ctx.new_buf(tuple(out_t.shape), out_t.dtype)
    ctx.fill(out, const(out_t.dtype, 0))
    if any(d == 0 for d in x.shape):
        return [out]
    base = [i64(lo) for lo, _, _ in padding_config]
    strides = tuple(s * (inner + 1) for s, (_, _, inner) in zip(out.strides, padding_config))
    part = out.with_shape(x.shape, strides,
                          ptr=ctx.b.gep(out.ptr, [linear_index(ctx.b, base, out.strides)],
                                        source_etype=_elem(out)))
    ctx.copy_into(part, x)
    return [out]


lowering_rules["cpu-llvm"].update({
    broadcast_in_dim_p: broadcast_in_dim_rule, reshape_p: reshape_rule,
    transpose_p: transpose_rule, slice_p: slice_rule, concatenate_p: concatenate_rule,
    pad_p: pad_rule})
