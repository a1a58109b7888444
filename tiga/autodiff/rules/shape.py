"""autodiff: VJP rules of shape primitives."""
from __future__ import annotations

from ...core.prims.shape import (
    broadcast_in_dim_p,
    concatenate_p,
    pad_p,
    reshape_p,
    slice_p,
    transpose_p,
)
from ...trace import math as m
from ...trace.math import _typeof
from ..registry import vjp_rules


def broadcast_in_dim_vjp_rule(ct, out, x, *, shape, broadcast_dimensions):
    tx = _typeof(x)
    new = [d for d in range(len(shape)) if d not in broadcast_dimensions]
    stretched = [d for i, d in enumerate(broadcast_dimensions)
                 if tx.shape[i] == 1 and shape[d] != 1]
    summed = (m.sum(ct, axis=tuple(sorted(new + stretched)), keepdims=True)
        if new or stretched else ct)
    return (m.reshape(summed, tx.shape) if tx.dtype.is_float else None,)


def reshape_vjp_rule(ct, out, x, *, new_sizes):
    return (m.reshape(ct, _typeof(x).shape),)


def transpose_vjp_rule(ct, out, x, *, permutation):
    inverse = [permutation.index(i) for i in range(len(permutation))]
    return (m.transpose(ct, tuple(inverse)),)


def slice_vjp_rule(ct, out, x, *, start_indices, limit_indices, strides):
    tx, tc = _typeof(x), _typeof(ct)
    config = []
    for d, n, lo, st in zip(tx.shape, tc.shape, start_indices, strides):
        used = lo + (n - 1) * st + 1 if n else lo
        config.append((lo, d - used, st - 1 if n else 0))
    return (m.pad(ct, config),)


def pad_vjp_rule(ct, out, x, *, padding_config):
    tx = _typeof(x)
    start = [lo for lo, _, _ in padding_config]
    limit = [lo + (d - 1) * (inner + 1) + 1 if d else lo
             for d, (lo, _, inner) in zip(tx.shape, padding_config)]
    strides = [inner + 1 for _, _, inner in padding_config]
    return (m.slice_static(ct, start, limit, strides),)


def concatenate_vjp_rule(ct, out, *xs, dimension):
    cts, offset = [], 0
    tc = _typeof(ct)
    for x in xs:
        size = _typeof(x).shape[dimension]
        start = [0] * tc.ndim
        limit = list(tc.shape)
        start[dimension], limit[dimension] = offset, offset + size
        cts.append(m.slice_static(ct, start, limit))
        offset += size
    return tuple(cts)


vjp_rules.update({
    broadcast_in_dim_p: broadcast_in_dim_vjp_rule, reshape_p: reshape_vjp_rule,
    transpose_p: transpose_vjp_rule, slice_p: slice_vjp_rule, pad_p: pad_vjp_rule,
    concatenate_p: concatenate_vjp_rule})
