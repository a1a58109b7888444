"""autodiff: batching rules of elementwise, reduction, dot_general and shape primitives."""
from __future__ import annotations

from ...core.prims.elementwise import (
    binary_p,
    compare_p,
    convert_p,
    select_p,
    stop_gradient_p,
    unary_p,
)
from ...core.prims.linalg import dot_general_p
from ...core.prims.reductions import reduce_p
from ...core.prims.shape import (
    broadcast_in_dim_p,
    concatenate_p,
    pad_p,
    reshape_p,
    slice_p,
    transpose_p,
)
from ...trace.tracer import aval_of, bind
from ..batching import batch_rules, broadcast_batch, instance_out_types, move_axis
from ..jvp import bind_list


def _elementwise_rule(prim):
    """Operands meet in the instance's result shape with the batch in front; an
    unbatched rank-0 operand still broadcasts by itself."""
    def rule(ins, batched, size, **params):
        (out_t,) = instance_out_types(prim, ins, batched, params)
        shape = tuple(out_t.shape)
        fitted = []
        for x, b in zip(ins, batched):
            t = aval_of(x)
            if b and t.ndim == 1 and shape:
                x = bind(broadcast_in_dim_p, x, shape=(size,) + shape, broadcast_dimensions=(0,))
            elif not b and t.ndim:
                x = broadcast_batch(x, size)
            fitted.append(x)
        return bind_list(prim, *fitted, **params), [True]
    return rule


for _p in [*unary_p.values(), *binary_p.values(), *compare_p.values(), select_p, convert_p,
           stop_gradient_p]:
    batch_rules[_p] = _elementwise_rule(_p)


def _reduce_rule(prim):
    def rule(ins, batched, size, *, axes):
        return bind_list(prim, ins[0], axes=tuple(a + 1 for a in axes)), [True]
    return rule


for _p in reduce_p.values():
    batch_rules[_p] = _reduce_rule(_p)


def dot_general_batch_rule(ins, batched, size, *, dimension_numbers):
    """Both batched: one more batch dimension. One batched: the batch is a free axis of
    that operand (no copy of the other), moved to the front afterwards."""
    (lc, rc), (lb, rb) = dimension_numbers
    x, y = ins
    inc = lambda t: tuple(a + 1 for a in t)  # noqa: E731
    if all(batched):
        dims = ((inc(lc), inc(rc)), ((0,) + inc(lb), (0,) + inc(rb)))
        return bind_list(dot_general_p, x, y, dimension_numbers=dims), [True]
    if batched[0]:
        out = bind(dot_general_p, x, y, dimension_numbers=((inc(lc), rc), (inc(lb), rb)))
        return [move_axis(out, len(lb), 0)], [True]
    n_lfree = aval_of(x).ndim - len(lc) - len(lb)
    out = bind(dot_general_p, x, y, dimension_numbers=((lc, inc(rc)), (lb, inc(rb))))
    return [move_axis(out, len(lb) + n_lfree, 0)], [True]


batch_rules[dot_general_p] = dot_general_batch_rule


def broadcast_batch_rule(ins, batched, size, *, shape, broadcast_dimensions):
    dims = (0,) + tuple(d + 1 for d in broadcast_dimensions)
    out = bind_list(broadcast_in_dim_p, ins[0], shape=(size,) + tuple(shape),
                    broadcast_dimensions=dims)
    return out, [True]


def reshape_batch_rule(ins, batched, size, *, new_sizes):
    return bind_list(reshape_p, ins[0], new_sizes=(size,) + tuple(new_sizes)), [True]


def transpose_batch_rule(ins, batched, size, *, permutation):
    perm = (0,) + tuple(p + 1 for p in permutation)
    return bind_list(transpose_p, ins[0], permutation=perm), [True]


def slice_batch_rule(ins, batched, size, *, start_indices, limit_indices, strides):
    return bind_list(slice_p, ins[0], start_indices=(0,) + tuple(start_indices),
                     limit_indices=(size,) + tuple(limit_indices),
                     strides=(1,) + tuple(strides)), [True]


def pad_batch_rule(ins, batched, size, *, padding_config):
    out = bind_list(pad_p, ins[0], padding_config=((0, 0, 0),) + tuple(padding_config))
    return out, [True]


def concatenate_batch_rule(ins, batched, size, *, dimension):
    xs = [x if b else broadcast_batch(x, size) for x, b in zip(ins, batched)]
    return bind_list(concatenate_p, *xs, dimension=dimension + 1), [True]


batch_rules.update({
    broadcast_in_dim_p: broadcast_batch_rule, reshape_p: reshape_batch_rule,
    transpose_p: transpose_batch_rule, slice_p: slice_batch_rule, pad_p: pad_batch_rule,
    concatenate_p: concatenate_batch_rule})
