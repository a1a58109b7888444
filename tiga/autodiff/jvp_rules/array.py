"""autodiff: JVP rules of elementwise, reduction, dot_general and shape primitives."""
from __future__ import annotations

import math as _pymath

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
from ...trace import math as m
from ...trace.math import _typeof
from ..jvp import bind_list, instantiate, jvp_rules, linear_rule
from ..registry import NONDIFF
from ..rules.reductions import _expand


def fit(t, out):
    """A tangent in the result's shape and dtype (a rank-0 operand broadcasts)."""
    to = _typeof(out)
    t = m.convert(t, to.dtype)
    return m.broadcast_to(t, to.shape) if _typeof(t).shape != to.shape else t


def _sum_tangents(parts, out):
    """Add the present tangent terms; None when every term is zero."""
    total = None
    for p in parts:
        if p is not None:
            p = fit(p, out)
            total = p if total is None else m.add(total, p)
    return total


_UNARY = {   # name -> d out / d x, from (x, out)
    "neg": lambda x, out: -1.0,
    "exp": lambda x, out: out,
    "log": lambda x, out: m.divide(1.0, x),
    "log1p": lambda x, out: m.divide(1.0, m.add(x, 1.0)),
    "expm1": lambda x, out: m.add(out, 1.0),
    "sqrt": lambda x, out: m.divide(0.5, out),
    "rsqrt": lambda x, out: m.multiply(m.divide(out, x), -0.5),
    "abs": lambda x, out: m.sign(x),
    "tanh": lambda x, out: m.subtract(1.0, m.multiply(out, out)),
    "logistic": lambda x, out: m.multiply(out, m.subtract(1.0, out)),
    "erf": lambda x, out: m.multiply(m.exp(m.negative(m.multiply(x, x))),
                                     2 / _pymath.sqrt(_pymath.pi)),
    "sin": lambda x, out: m.cos(x),
    "cos": lambda x, out: m.negative(m.sin(x)),
}


def _unary_rule(prim, deriv):
    def rule(primals, tangents):
        (x,), (t,) = primals, tangents
        out = bind_list(prim, x)[0]
        return [out], [m.multiply(t, deriv(x, out))]
    return rule


def _pow_dy(x, y, out):
    positive = m.greater(x, 0)
    safe = m.where(positive, x, m.ones_like(x))
    return m.where(positive, m.multiply(out, m.log(safe)), m.zeros_like(out))


def _extremum_weight(winner, loser, like):
    # ties split evenly, as the VJP does: max(x, x) = x keeps derivative 1
    w = m.where(m.greater(winner, loser), 1.0, m.where(m.equal(winner, loser), 0.5, 0.0))
    return m.convert(w, _typeof(like).dtype)


def _binary_terms(name, x, y, tx, ty, out):
    """The tangent terms (of x, of y) of one binary primitive; None where a tangent is."""
    def times(t, d):
        return None if t is None else m.multiply(t, d)

    if name == "add":
        return tx, ty
    if name == "sub":
        return tx, None if ty is None else m.negative(ty)
    if name == "mul":
        return times(tx, y), times(ty, x)
    if name == "div":
        return times(tx, m.divide(1.0, y)), times(ty, m.negative(m.divide(out, y)))
    if name == "pow":
        return (times(tx, m.multiply(y, m.power(x, m.subtract(y, 1)))),
                times(ty, _pow_dy(x, y, out)))
    w = _extremum_weight(x, y, out) if name == "max" else _extremum_weight(y, x, out)
    return times(tx, w), times(ty, m.subtract(1.0, w))


def _binary_rule(prim, name):
    def rule(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        out = bind_list(prim, x, y)[0]
        return [out], [_sum_tangents(_binary_terms(name, x, y, tx, ty, out), out)]
    return rule


for _name, _d in _UNARY.items():
    jvp_rules[unary_p[_name]] = _unary_rule(unary_p[_name], _d)
for _name in ("add", "sub", "mul", "div", "pow", "max", "min"):
    jvp_rules[binary_p[_name]] = _binary_rule(binary_p[_name], _name)
for _p in [unary_p["sign"], unary_p["floor"], unary_p["ceil"], unary_p["not"],
           binary_p["and"], binary_p["or"], *compare_p.values(), stop_gradient_p]:
    jvp_rules[_p] = NONDIFF


def select_jvp_rule(primals, tangents):
    pred, x, y = primals
    _, tx, ty = tangents
    out = bind_list(select_p, pred, x, y)[0]
    tx, ty = fit(instantiate(tx, x), out), fit(instantiate(ty, y), out)
    return [out], [m.where(pred, tx, ty)]


def convert_jvp_rule(primals, tangents, *, new_dtype):
    (x,), (t,) = primals, tangents
    out = bind_list(convert_p, x, new_dtype=new_dtype)[0]
    keep = _typeof(x).dtype.is_float and _typeof(out).dtype.is_float
    return [out], [m.convert(t, _typeof(out).dtype) if keep else None]


jvp_rules[select_p] = select_jvp_rule
jvp_rules[convert_p] = convert_jvp_rule


# ---- reductions ----------------------------------------------------------------------------

def _reduce_extremum_rule(prim):
    def rule(primals, tangents, *, axes):
        (x,), (t,) = primals, tangents
        out = bind_list(prim, x, axes=axes)[0]
        # ties share the tangent evenly, as the VJP shares the cotangent
        hit = m.convert(m.equal(x, _expand(out, x, axes)), _typeof(x).dtype)
        count = m.sum(hit, axis=axes)
        return [out], [m.divide(m.sum(m.multiply(t, hit), axis=axes), count)]
    return rule


def reduce_prod_jvp_rule(primals, tangents, *, axes):
    """Exact with zeros: sum_i t_i prod_{j != i} x_j, from the zero count and the product
    of the nonzero entries."""
    (x,), (t,) = primals, tangents
    out = bind_list(reduce_p["reduce_prod"], x, axes=axes)[0]
    zero = m.equal(x, 0)
    nz = _expand(m.sum(m.convert(zero, _typeof(x).dtype), axis=axes), x, axes)
    rest = _expand(m.prod(m.where(zero, m.ones_like(x), x), axis=axes), x, axes)
    safe = m.where(zero, m.ones_like(x), x)
    d = m.where(zero, m.where(m.equal(nz, 1), rest, m.zeros_like(x)),
                m.where(m.equal(nz, 0), m.divide(rest, safe), m.zeros_like(x)))
    return [out], [m.sum(m.multiply(t, d), axis=axes)]


jvp_rules[reduce_p["reduce_sum"]] = linear_rule(reduce_p["reduce_sum"])
jvp_rules[reduce_p["reduce_max"]] = _reduce_extremum_rule(reduce_p["reduce_max"])
jvp_rules[reduce_p["reduce_min"]] = _reduce_extremum_rule(reduce_p["reduce_min"])
jvp_rules[reduce_p["reduce_prod"]] = reduce_prod_jvp_rule


# ---- dot_general and shape -----------------------------------------------------------------

def dot_general_jvp_rule(primals, tangents, *, dimension_numbers):
    (x, y), (tx, ty) = primals, tangents
    out = bind_list(dot_general_p, x, y, dimension_numbers=dimension_numbers)[0]
    terms = [None if tx is None else m.dot_general(tx, y, dimension_numbers),
             None if ty is None else m.dot_general(x, ty, dimension_numbers)]
    return [out], [_sum_tangents(terms, out)]


def broadcast_jvp_rule(primals, tangents, **params):
    (x,), (t,) = primals, tangents
    out = bind_list(broadcast_in_dim_p, x, **params)[0]
    return [out], [bind_list(broadcast_in_dim_p, m.convert(t, _typeof(x).dtype), **params)[0]]


jvp_rules[dot_general_p] = dot_general_jvp_rule
jvp_rules[broadcast_in_dim_p] = broadcast_jvp_rule
# pad takes no value operand (the padding is zero), so it is linear as well
for _p in (reshape_p, transpose_p, slice_p, pad_p):
    jvp_rules[_p] = linear_rule(_p)
jvp_rules[concatenate_p] = linear_rule(concatenate_p)
