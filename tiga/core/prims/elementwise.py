"""core: elementwise and math primitives (unary, binary, comparison, select, convert)."""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import DType, as_dtype, bool_
from ..errors import DTypeError, ShapeError
from ..primitive import (
    abstract_eval_rules,
    elementwise_batch_rule,
    impl_rules,
    primitive,
    row_batch_rules,
)
from ..types import TensorType

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _logistic(x):
    # two-sided form: never exponentiates a large positive number
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name -> (numpy function, needs float input)
UNARY = {
    "neg": (np.negative, False), "exp": (np.exp, True), "log": (np.log, True),
    "log1p": (np.log1p, True), "expm1": (np.expm1, True), "sqrt": (np.sqrt, True),
    "rsqrt": (_rsqrt, True), "abs": (np.abs, False), "tanh": (np.tanh, True),
    "logistic": (_logistic, True), "erf": (_erf, True), "sin": (np.sin, True),
    "cos": (np.cos, True), "sign": (np.sign, False), "floor": (np.floor, True),
    "ceil": (np.ceil, True), "not": (np.logical_not, False),
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "max": np.maximum, "min": np.minimum,
    "and": np.logical_and, "or": np.logical_or,
}
COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}

unary_p = {name: primitive(f"{name}", "elementwise") for name in UNARY}
binary_p = {name: primitive(f"{name}", "elementwise") for name in BINARY}
compare_p = {name: primitive(f"{name}", "elementwise") for name in COMPARE}
select_p = primitive("select", "elementwise")
convert_p = primitive("convert", "elementwise")
stop_gradient_p = primitive("stop_gradient", "elementwise")


def _cast(x, dtype: DType):
    return np.asarray(x).astype(dtype.np, copy=False)


def same_shape(types, what: str) -> tuple:
    """Elementwise operands share one shape; rank-0 operands broadcast."""
    shapes = {t.shape for t in types if t.ndim}
    if len(shapes) > 1:
        raise ShapeError(f"{what}: operand shapes differ: {', '.join(str(t) for t in types)}")
    return shapes.pop() if shapes else ()


def _same_dtype(types, what: str) -> DType:
    strong = {t.dtype for t in types if not t.weak} or {types[0].dtype}
    if len(strong) > 1:
        raise DTypeError(f"{what}: operand dtypes differ: {', '.join(str(t) for t in types)}")
    return strong.pop()


def _unary_eval(name, float_only):
    def rule(x: TensorType):
        if float_only and not x.dtype.is_float:
            raise DTypeError(f"{name}: expected a floating-point operand, found {x}")
        if name == "not" and x.dtype != bool_:
            raise DTypeError(f"not: expected a bool operand, found {x}")
        return [x]
    return rule


def _unary_impl(fn, name):
    def rule(x):
        return [_cast(fn(x), _impl_dtype(x))]
    return rule


def _impl_dtype(x) -> DType:
    return as_dtype(np.asarray(x).dtype)


def _binary_eval(name):
    def rule(x: TensorType, y: TensorType):
        shape = same_shape([x, y], name)
        dtype = _same_dtype([x, y], name)
        if name in ("and", "or") and dtype != bool_:
            raise DTypeError(f"{name}: expected bool operands, found {x} and {y}")
        return [TensorType(shape, dtype, x.weak and y.weak)]
    return rule


def _binary_impl(fn):
    def rule(x, y):
        out = fn(x, y)
        dt = np.result_type(np.asarray(x).dtype, np.asarray(y).dtype)
        return [_cast(out, as_dtype(dt)) if out.dtype != dt else out]
    return rule


def _compare_eval(name):
    def rule(x: TensorType, y: TensorType):
        shape = same_shape([x, y], name)
        _same_dtype([x, y], name)
        return [TensorType(shape, bool_)]
    return rule


def _compare_impl(fn):
    return lambda x, y: [np.asarray(fn(x, y))]


for _n, (_fn, _float) in UNARY.items():
    abstract_eval_rules[unary_p[_n]] = _unary_eval(_n, _float)
    impl_rules[unary_p[_n]] = _unary_impl(_fn, _n)
for _n, _fn in BINARY.items():
    abstract_eval_rules[binary_p[_n]] = _binary_eval(_n)
    impl_rules[binary_p[_n]] = _binary_impl(_fn)
for _n, _fn in COMPARE.items():
    abstract_eval_rules[compare_p[_n]] = _compare_eval(_n)
    impl_rules[compare_p[_n]] = _compare_impl(_fn)


def select_abstract_eval_rule(pred: TensorType, x: TensorType, y: TensorType):
    if pred.dtype != bool_:
        raise DTypeError(f"where: condition must be bool, found {pred}")
    shape = same_shape([pred, x, y], "where")
    return [TensorType(shape, _same_dtype([x, y], "where"), x.weak and y.weak)]


def select_impl_rule(pred, x, y):
    out = np.where(pred, x, y)
    return [out.astype(np.result_type(np.asarray(x).dtype, np.asarray(y).dtype), copy=False)]


def convert_abstract_eval_rule(x: TensorType, *, new_dtype):
    return [TensorType(x.shape, as_dtype(new_dtype))]


def convert_impl_rule(x, *, new_dtype):
    return [_cast(x, as_dtype(new_dtype))]


abstract_eval_rules[select_p] = select_abstract_eval_rule
impl_rules[select_p] = select_impl_rule
abstract_eval_rules[convert_p] = convert_abstract_eval_rule
impl_rules[convert_p] = convert_impl_rule
abstract_eval_rules[stop_gradient_p] = lambda x: [x]
impl_rules[stop_gradient_p] = lambda x: [x]

for _p in [*unary_p.values(), *binary_p.values(), *compare_p.values(), select_p, convert_p,
           stop_gradient_p]:
    row_batch_rules[_p] = elementwise_batch_rule
