"""autodiff: VJP rules of axis reductions."""
from __future__ import annotations

from ...core.prims.reductions import reduce_p
from ...trace import math as m
from ...trace.math import _typeof
from ..registry import vjp_rules


def _expand(ct, x, axes):
    """Cotangent of a reduced value, broadcast back to the operand's shape."""
    shape = list(_typeof(x).shape)
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    return m.broadcast_to(m.reshape(ct, tuple(kept)), tuple(shape))


def reduce_sum_vjp_rule(ct, out, x, *, axes):
    return (_expand(ct, x, axes),)


def _reduce_extremum_vjp_rule(ct, out, x, *, axes):
    # ties share the cotangent evenly (the subgradient with the smallest norm)
    hit = m.convert(m.equal(x, _expand(out, x, axes)), _typeof(x).dtype)
    count = _expand(m.sum(hit, axis=axes), x, axes)
    return (m.multiply(_expand(ct, x, axes), m.divide(hit, count)),)


def reduce_prod_vjp_rule(ct, out, x, *, axes):
    """Exact with zeros: d/dx_i prod = prod of the others, from zero count and nonzero prod."""
    zero = m.equal(x, 0)
    nz = m.sum(m.convert(zero, _typeof(x).dtype), axis=axes)
    rest = m.prod(m.where(zero, m.ones_like(x), x), axis=axes)
    nz_e, rest_e = _expand(nz, x, axes), _expand(rest, x, axes)
    safe = m.where(zero, m.ones_like(x), x)
    d = m.where(zero, m.where(m.equal(nz_e, 1), rest_e, m.zeros_like(x)),
                m.where(m.equal(nz_e, 0), m.divide(rest_e, safe), m.zeros_like(x)))
    return (m.multiply(_expand(ct, x, axes), d),)


vjp_rules[reduce_p["reduce_sum"]] = reduce_sum_vjp_rule
vjp_rules[reduce_p["reduce_max"]] = _reduce_extremum_vjp_rule
vjp_rules[reduce_p["reduce_min"]] = _reduce_extremum_vjp_rule
vjp_rules[reduce_p["reduce_prod"]] = reduce_prod_vjp_rule
