"""core: reductions over array axes (sum, max, min, prod)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..primitive import abstract_eval_rules, impl_rules, primitive, row_batch_rules
from ..types import Dim, TensorType

REDUCE = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min,
          "reduce_prod": np.prod}
reduce_p = {name: primitive(name, "reductions") for name in REDUCE}


def _eval(name):
    def rule(x: TensorType, *, axes: tuple):
        for a in axes:
            if not 0 <= a < x.ndim:
                raise ShapeError(f"{name}: axis {a} out of range for {x}")
        if name in ("reduce_max", "reduce_min"):
            for a in axes:
                if x.shape[a] == 0:
                    raise ShapeError(f"{name}: cannot reduce an empty axis {a} of {x} "
                                     "(max/min have no identity)")
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype, x.weak)]
    return rule


def _impl(fn):
    def rule(x, *, axes):
        x = np.asarray(x)
        return [np.asarray(fn(x, axis=tuple(axes))).astype(x.dtype, copy=False)]
    return rule


def _batch(*, axes):
    return {"axes": tuple(a + 1 for a in axes)}


for _n, _fn in REDUCE.items():
    abstract_eval_rules[reduce_p[_n]] = _eval(_n)
    impl_rules[reduce_p[_n]] = _impl(_fn)
    row_batch_rules[reduce_p[_n]] = _batch

__all__ = ["reduce_p", "Dim"]
