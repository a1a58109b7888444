"""core: dot_general, the one contraction primitive (matmul, dot, einsum-like forms)."""
from __future__ import annotations

import math

import numpy as np

from ..blas_threads import one_blas_thread
from ..errors import DTypeError, ShapeError
from ..primitive import abstract_eval_rules, impl_rules, primitive, row_batch_rules
from ..types import TensorType

dot_general_p = primitive("dot_general", "linalg")


def dot_general_abstract_eval_rule(x: TensorType, y: TensorType, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ShapeError(f"dot_general: unbalanced dimension numbers {dimension_numbers}")
    for a, b in [*zip(lc, rc), *zip(lb, rb)]:
        if x.shape[a] != y.shape[b]:
            raise ShapeError(f"dot_general: contracted/batch axes differ: {x} axis {a} vs "
                             f"{y} axis {b}")
    if x.dtype != y.dtype and not (x.weak or y.weak):
        raise DTypeError(f"dot_general: operand dtypes differ: {x} and {y}")
    batch = tuple(x.shape[a] for a in lb)
    lfree = tuple(d for i, d in enumerate(x.shape) if i not in lc and i not in lb)
    rfree = tuple(d for i, d in enumerate(y.shape) if i not in rc and i not in rb)
    return [TensorType(batch + lfree + rfree, x.dtype if not x.weak else y.dtype)]


def dot_general_impl_rule(x, y, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    x, y = np.asarray(x), np.asarray(y)
    dtype = np.result_type(x.dtype, y.dtype)
    work = x.size * y.size // max(1, math.prod(y.shape[b] for b in (*rc, *rb)))  # mult-adds
    if not lb:
        # tensordot reshapes to one BLAS product; einsum's path is several times slower
        # for the tall-skinny (entities x features) products edge MLPs hoist out
        with one_blas_thread(work):
            out = np.tensordot(x, y, axes=(list(lc), list(rc)))
        return [np.asarray(out).astype(dtype, copy=False)]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    xs = [next(letters) for _ in range(x.ndim)]
    ys = [next(letters) for _ in range(y.ndim)]
    for a, b in [*zip(lc, rc), *zip(lb, rb)]:
        ys[b] = xs[a]
    batch = [xs[a] for a in lb]
    lfree = [xs[i] for i in range(x.ndim) if i not in lc and i not in lb]
    rfree = [ys[i] for i in range(y.ndim) if i not in rc and i not in rb]
    spec = f"{''.join(xs)},{''.join(ys)}->{''.join(batch + lfree + rfree)}"
    with one_blas_thread(work):
        out = np.einsum(spec, x, y, optimize=True)
    return [np.asarray(out).astype(dtype, copy=False)]


def dot_general_batch_rule(*, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    inc = lambda t: tuple(a + 1 for a in t)  # noqa: E731
    return {"dimension_numbers": ((inc(lc), inc(rc)), ((0,) + inc(lb), (0,) + inc(rb)))}


abstract_eval_rules[dot_general_p] = dot_general_abstract_eval_rule
impl_rules[dot_general_p] = dot_general_impl_rule
row_batch_rules[dot_general_p] = dot_general_batch_rule
