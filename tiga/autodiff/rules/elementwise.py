"""autodiff: VJP rules of elementwise and math primitives."""
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
from ...trace import math as m
from ...trace.math import _typeof
from ..registry import NONDIFF, vjp_rules


def unbroadcast(ct, x):
    """Elementwise operands of rank 0 broadcast; their cotangent sums over the result."""
    if ct is None:
        return None
    tx = _typeof(x)
    if tx.ndim == 0 and _typeof(ct).ndim:
        ct = m.sum(ct)
    return m.convert(ct, tx.dtype) if tx.dtype.is_float else None


def _both(rule):
    def wrapped(ct, out, x, y, **params):
        cx, cy = rule(ct, out, x, y)
        return unbroadcast(cx, x), unbroadcast(cy, y)
    return wrapped


def _pow_y(ct, out, x):
    safe = m.where(m.greater(x, 0), x, m.ones_like(x))
    return m.where(m.greater(x, 0), m.multiply(m.multiply(ct, out), m.log(safe)),
                   m.zeros_like(out))


_BINARY = {
    "add": lambda ct, out, x, y: (ct, ct),
    "sub": lambda ct, out, x, y: (ct, m.negative(ct)),
    "mul": lambda ct, out, x, y: (m.multiply(ct, y), m.multiply(ct, x)),
    "div": lambda ct, out, x, y: (m.divide(ct, y),
                                  m.negative(m.divide(m.multiply(ct, out), y))),
    "pow": lambda ct, out, x, y: (
        m.multiply(m.multiply(ct, y), m.power(x, m.subtract(y, 1))), _pow_y(ct, out, x)),
    # ties split the cotangent evenly, so max(x, x) = x keeps gradient 1
    "max": lambda ct, out, x, y: _extremum(ct, x, y),
    "min": lambda ct, out, x, y: _extremum(ct, y, x),
}


def _extremum(ct, winner, loser):
    w = m.where(m.greater(winner, loser), 1.0, m.where(m.equal(winner, loser), 0.5, 0.0))
    w = m.convert(w, _typeof(ct).dtype)
    return m.multiply(ct, w), m.multiply(ct, m.subtract(1.0, w))


_UNARY = {
    "neg": lambda ct, out, x: m.negative(ct),
    "exp": lambda ct, out, x: m.multiply(ct, out),
    "log": lambda ct, out, x: m.divide(ct, x),
    "log1p": lambda ct, out, x: m.divide(ct, m.add(x, 1.0)),
    "expm1": lambda ct, out, x: m.multiply(ct, m.add(out, 1.0)),
    "sqrt": lambda ct, out, x: m.divide(m.multiply(ct, 0.5), out),
    "rsqrt": lambda ct, out, x: m.multiply(ct, m.multiply(m.divide(out, x), -0.5)),
    "abs": lambda ct, out, x: m.multiply(ct, m.sign(x)),
    "tanh": lambda ct, out, x: m.multiply(ct, m.subtract(1.0, m.multiply(out, out))),
    "logistic": lambda ct, out, x: m.multiply(ct, m.multiply(out, m.subtract(1.0, out))),
    "erf": lambda ct, out, x: m.multiply(
        ct, m.multiply(m.exp(m.negative(m.multiply(x, x))), 2 / _pymath.sqrt(_pymath.pi))),
    "sin": lambda ct, out, x: m.multiply(ct, m.cos(x)),
    "cos": lambda ct, out, x: m.negative(m.multiply(ct, m.sin(x))),
}

for _name, _rule in _BINARY.items():
    vjp_rules[binary_p[_name]] = _both(_rule)
for _name, _rule in _UNARY.items():
    vjp_rules[unary_p[_name]] = (lambda r: lambda ct, out, x: (r(ct, out, x),))(_rule)
for _name in ("sign", "floor", "ceil", "not"):
    vjp_rules[unary_p[_name]] = NONDIFF
for _name in ("and", "or"):
    vjp_rules[binary_p[_name]] = NONDIFF
for _p in compare_p.values():
    vjp_rules[_p] = NONDIFF


def select_vjp_rule(ct, out, pred, x, y):
    zero = m.zeros_like(ct)
    return None, unbroadcast(m.where(pred, ct, zero), x), unbroadcast(m.where(pred, zero, ct), y)


def convert_vjp_rule(ct, out, x, *, new_dtype):
    tx = _typeof(x)
    return (m.convert(ct, tx.dtype) if tx.dtype.is_float else None,)


vjp_rules[select_p] = select_vjp_rule
vjp_rules[convert_p] = convert_vjp_rule
vjp_rules[stop_gradient_p] = lambda ct, out, x: (None,)
