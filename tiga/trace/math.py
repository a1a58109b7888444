"""trace: tg.math, the functional array namespace; binds primitives with promotion."""
from __future__ import annotations

import builtins
import math as _pymath

import numpy as np

from ..core.dtypes import DType, as_dtype, bool_, float32, int32, promote
from ..core.errors import DTypeError, ShapeError, UnsupportedError
from ..core.prims.elementwise import (
    binary_p,
    compare_p,
    convert_p,
    select_p,
    stop_gradient_p,
    unary_p,
)
from ..core.prims.linalg import dot_general_p
from ..core.prims.reductions import reduce_p
from ..core.prims.shape import (
    broadcast_in_dim_p,
    concatenate_p,
    pad_p,
    reshape_p,
    slice_p,
    transpose_p,
)
from ..core.types import Dim, TensorType, broadcast_shapes, normalize_axes
from .tracer import Tracer, aval_of, bind, host_array

_SCALARS = (bool, int, float)


def _typeof(x) -> TensorType:
    t = aval_of(x)
    if not isinstance(t, TensorType):
        raise DTypeError(f"expected an array operand, found a relation {t}")
    return t


def asvalue(x):
    """Tracers and tg.Tensors pass through; everything else becomes a concrete numpy value."""
    # a tg.Tensor (typed by __tiga_type__) stays one, so eager no-op reshapes/slices/converts
    # return the Tensor rather than its host ndarray
    if isinstance(x, Tracer) or hasattr(type(x), "__tiga_type__"):
        return x
    if isinstance(x, np.ndarray):
        return x
    return host_array(x)


def _is_python_scalar(x) -> bool:
    # np.float64 subclasses float but carries its own dtype: it is not weakly typed
    return isinstance(x, _SCALARS) and not isinstance(x, np.generic)


def _scalar_dtype(x) -> DType:
    return bool_ if isinstance(x, bool) else int32 if isinstance(x, int) else float32


def convert(x, dtype) -> object:
    """x as `dtype` (a tg dtype, numpy dtype or name such as "float32"); x itself when it already
    has it."""
    dtype = as_dtype(dtype)
    x = asvalue(x)
    if _typeof(x).dtype == dtype:
        return x
    return bind(convert_p, x, new_dtype=dtype)


def _promote_operands(*xs):
    """Python scalars (and weak values) adopt the other operands' dtype, as in JAX."""
    typed = []
    for x in xs:
        if _is_python_scalar(x):
            typed.append((_scalar_dtype(x), True))
        else:
            t = _typeof(asvalue(x))
            typed.append((t.dtype, t.weak))
    dtype, weak = typed[0]
    for d, w in typed[1:]:
        dtype = promote(dtype, d, weak, w)
        weak = weak and w
    out = []
    for x in xs:
        out.append(np.asarray(x, dtype.np) if _is_python_scalar(x) else convert(x, dtype))
    return out, dtype


def broadcast_to(x, shape):
    """x broadcast to `shape`, numpy's rules (new axes on the left)."""
    x = asvalue(x)
    t = _typeof(x)
    shape = tuple(shape)
    if t.shape == shape:
        return x
    broadcast_shapes(t.shape, shape, what="broadcast_to")
    dims = tuple(range(len(shape) - t.ndim, len(shape)))
    if len(shape) < t.ndim:
        raise ShapeError(f"broadcast_to: cannot broadcast {t} to fewer dimensions {shape}")
    return bind(broadcast_in_dim_p, x, shape=shape, broadcast_dimensions=dims)


def _broadcast_all(xs):
    shapes = [_typeof(x).shape for x in xs]
    shape = broadcast_shapes(*shapes)
    return [x if _typeof(x).ndim == 0 else broadcast_to(x, shape) for x in xs]


def _binary(name, x, y):
    (x, y), _ = _promote_operands(x, y)
    x, y = _broadcast_all([x, y])
    prim = binary_p.get(name) or compare_p[name]
    return bind(prim, x, y)


def _unary(name, x, float_only=True):
    x = asvalue(x)
    t = _typeof(x)
    if float_only and not t.dtype.is_float:
        x = convert(x, float32)
    return bind(unary_p[name], x)


def add(x, y):
    """x + y, elementwise, broadcasting the operands; Python numbers take the other operand's dtype
    (as in JAX)."""
    return _binary("add", x, y)


def subtract(x, y):
    """x - y, elementwise, broadcasting the operands; Python numbers take the other operand's dtype
    (as in JAX)."""
    return _binary("sub", x, y)


def multiply(x, y):
    """x * y, elementwise, broadcasting the operands; Python numbers take the other operand's dtype
    (as in JAX)."""
    return _binary("mul", x, y)


def maximum(x, y):
    """The larger of x and y, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX). NaN wins, as in numpy."""
    return _binary("max", x, y)


def minimum(x, y):
    """The smaller of x and y, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX). NaN wins, as in numpy."""
    return _binary("min", x, y)


def less(x, y):
    """x < y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("lt", x, y)


def less_equal(x, y):
    """x <= y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("le", x, y)


def greater(x, y):
    """x > y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("gt", x, y)


def greater_equal(x, y):
    """x >= y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("ge", x, y)


def equal(x, y):
    """x == y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("eq", x, y)


def not_equal(x, y):
    """x != y as a bool array, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("ne", x, y)


def logical_and(x, y):
    """x and y for bool arrays, elementwise, broadcasting the operands; Python numbers take the
    other operand's dtype (as in JAX)."""
    return _binary("and", x, y)


def logical_or(x, y):
    """x or y for bool arrays, elementwise, broadcasting the operands; Python numbers take the other
    operand's dtype (as in JAX)."""
    return _binary("or", x, y)


def logical_not(x):
    """not x, elementwise, for a bool array."""
    return bind(unary_p["not"], asvalue(x))


def negative(x):
    """-x, elementwise (any numeric dtype)."""
    return _unary("neg", x, float_only=False)


def exp(x):
    """e ** x, elementwise; integer input is computed in float32."""
    return _unary("exp", x)


def log(x):
    """The natural logarithm, elementwise; integer input is computed in float32."""
    return _unary("log", x)


def log1p(x):
    """log(1 + x), elementwise, accurate for small x; integer input is computed in float32."""
    return _unary("log1p", x)


def expm1(x):
    """exp(x) - 1, elementwise, accurate for small x; integer input is computed in float32."""
    return _unary("expm1", x)


def sqrt(x):
    """The square root, elementwise; integer input is computed in float32."""
    return _unary("sqrt", x)


def rsqrt(x):
    """1 / sqrt(x), elementwise; integer input is computed in float32."""
    return _unary("rsqrt", x)


def abs(x):  # noqa: A001
    """|x|, elementwise (any numeric dtype; the dtype is kept)."""
    return _unary("abs", x, float_only=False)


def tanh(x):
    """The hyperbolic tangent, elementwise; integer input is computed in float32."""
    return _unary("tanh", x)


def sigmoid(x):
    """1 / (1 + exp(-x)), elementwise; integer input is computed in float32."""
    return _unary("logistic", x)


def erf(x):
    """The error function, elementwise; integer input is computed in float32."""
    return _unary("erf", x)


def sin(x):
    """The sine (radians), elementwise; integer input is computed in float32."""
    return _unary("sin", x)


def cos(x):
    """The cosine (radians), elementwise; integer input is computed in float32."""
    return _unary("cos", x)


def sign(x):
    """-1, 0 or 1 by the sign of x, elementwise (any numeric dtype; the dtype is kept)."""
    return _unary("sign", x, float_only=False)


def floor(x):
    """The largest integer not above x, elementwise, as a float."""
    return _unary("floor", x)


def ceil(x):
    """The smallest integer not below x, elementwise, as a float."""
    return _unary("ceil", x)


def square(x):
    """x * x, elementwise."""
    return multiply(x, x)


def stop_gradient(x):
    """x itself, but gradients do not flow through it (a constant for tg.grad)."""
    return bind(stop_gradient_p, asvalue(x))


def divide(x, y):
    """x / y, true division, elementwise with broadcasting; integer operands give float32."""
    (x, y), dtype = _promote_operands(x, y)
    if not dtype.is_float:
        x, y = convert(x, float32), convert(y, float32)
    x, y = _broadcast_all([x, y])
    return bind(binary_p["div"], x, y)


def power(x, y):
    """x ** y, elementwise with broadcasting. A Python int exponent from 0 to 4 is computed as
    products: exact, and differentiable at x = 0."""
    if isinstance(y, int) and not isinstance(y, bool) and 0 <= y <= 4:
        # small integer powers as products: exact, and differentiable at x = 0
        result = ones_like(x) if y == 0 else asvalue(x)
        for _ in range(builtins.max(y - 1, 0)):
            result = multiply(result, x)
        return result
    return _binary("pow", x, y)


def relu(x):
    """max(x, 0), elementwise; the gradient at 0 is 0."""
    x = asvalue(x)
    return where(greater(x, 0), x, zeros_like(x))


def gelu(x, approximate: str = "none"):
    """x * Phi(x), Phi the standard normal distribution function (torch's GELU);
    `approximate="tanh"` uses the tanh approximation."""
    if approximate == "tanh":
        c = _pymath.sqrt(2 / _pymath.pi)
        return 0.5 * x * (1 + tanh(c * (x + 0.044715 * x * x * x)))
    return multiply(multiply(x, 0.5), add(erf(multiply(x, 1 / _pymath.sqrt(2))), 1.0))


def silu(x):
    """x * sigmoid(x), elementwise (also called swish)."""
    return multiply(x, sigmoid(x))


# The activations below are compositions of existing primitives (so their VJPs and the
# LLVM lowering come from those primitives); each follows torch.nn.functional's semantics,
# including which branch owns the kink at the threshold.

def _float_value(x):
    x = asvalue(x)
    return x if _typeof(x).dtype.is_float else convert(x, float32)


def leaky_relu(x, negative_slope: float = 0.01):
    """x where x > 0, else negative_slope * x (the gradient at 0 is negative_slope)."""
    x = _float_value(x)
    return where(greater(x, 0.0), x, multiply(x, float(negative_slope)))


def elu(x, alpha: float = 1.0):
    """x where x > 0, else alpha * (exp(x) - 1)."""
    x = _float_value(x)
    pos = greater(x, 0.0)
    # expm1 of the clamped value: the unused branch never overflows, so its (masked)
    # cotangent cannot turn into 0 * inf = NaN
    neg = multiply(expm1(where(pos, 0.0, x)), float(alpha))
    return where(pos, x, neg)


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's
    linear regime, which also keeps exp from overflowing)."""
    x = _float_value(x)
    bx = multiply(x, float(beta))
    linear = greater(bx, float(threshold))
    # where (not minimum) clamps: at bx == threshold the whole cotangent stays on bx
    soft = divide(log1p(exp(where(linear, float(threshold), bx))), float(beta))
    return where(linear, x, soft)


def _shifted(x, axis):
    # the shift by the maximum is for range only: softmax is invariant to it, so it
    # carries no gradient
    return subtract(x, stop_gradient(max(x, axis=axis, keepdims=True)))


def log_softmax(x, axis: int = -1, *, dim=None):
    """x - max - log(sum(exp(x - max))) over `axis` (a feature axis)."""
    x = _float_value(x)
    axis = dim if dim is not None else axis
    z = _shifted(x, axis)
    return subtract(z, log(sum(exp(z), axis=axis, keepdims=True)))


def softmax(x, axis: int = -1, *, dim=None):
    """exp(x - max) / sum(exp(x - max)) over `axis` (a feature axis)."""
    x = _float_value(x)
    axis = dim if dim is not None else axis
    e = exp(_shifted(x, axis))
    return divide(e, sum(e, axis=axis, keepdims=True))


def where(cond, x, y):
    """x where `cond` is true, else y, elementwise with broadcasting. A non-bool `cond` means cond
    != 0."""
    cond = asvalue(cond)
    if _typeof(cond).dtype != bool_:
        cond = not_equal(cond, 0)
    (x, y), _ = _promote_operands(x, y)
    cond, x, y = _broadcast_all([cond, x, y])
    return bind(select_p, cond, x, y)


def zeros_like(x, dtype=None):
    """Zeros with x's shape and dtype (or `dtype`)."""
    t = _typeof(asvalue(x))
    return full(t.shape, 0, dtype or t.dtype)


def ones_like(x, dtype=None):
    """Ones with x's shape and dtype (or `dtype`)."""
    t = _typeof(asvalue(x))
    return full(t.shape, 1, dtype or t.dtype)


def full(shape, value, dtype=float32):
    """An array of `shape` filled with `value`, of `dtype` (float32 unless given)."""
    scalar = np.asarray(value, as_dtype(dtype).np)
    return bind(broadcast_in_dim_p, scalar, shape=tuple(shape), broadcast_dimensions=())


def _axes(x, axis, dim):
    if dim is not None:
        if axis is not None:
            raise ShapeError("pass either axis= or dim= (its alias), not both")
        axis = dim
    return normalize_axes(axis, _typeof(x).ndim)


def _keep(x, out, axes, keepdims):
    if not keepdims:
        return out
    shape = list(_typeof(x).shape)
    for a in axes:
        shape[a] = 1
    return reshape(out, shape)


def _reduce(name, x, axis, keepdims, dim):
    x = asvalue(x)
    axes = _axes(x, axis, dim)
    return _keep(x, bind(reduce_p[name], x, axes=axes), axes, keepdims)


def sum(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    """The sum over `axis` (an int, a tuple, or None for all axes; `dim=` is an alias);
    `keepdims=True` keeps the reduced axes as size 1."""
    return _reduce("reduce_sum", x, axis, keepdims, dim)


def max(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    """The maximum over `axis` (an int, a tuple, or None for all axes; `dim=` is an alias);
    `keepdims=True` keeps the reduced axes as size 1. An array op, unlike the `tg.max()` reducer."""
    return _reduce("reduce_max", x, axis, keepdims, dim)


def min(x, axis=None, keepdims=False, *, dim=None):  # noqa: A001
    """The minimum over `axis` (an int, a tuple, or None for all axes; `dim=` is an alias);
    `keepdims=True` keeps the reduced axes as size 1. An array op, unlike the `tg.min()` reducer."""
    return _reduce("reduce_min", x, axis, keepdims, dim)


def prod(x, axis=None, keepdims=False, *, dim=None):
    """The product over `axis` (an int, a tuple, or None for all axes; `dim=` is an alias);
    `keepdims=True` keeps the reduced axes as size 1."""
    return _reduce("reduce_prod", x, axis, keepdims, dim)


def mean(x, axis=None, keepdims=False, *, dim=None):
    """The mean over `axis` (an int, a tuple, or None for all axes; `dim=` is an alias); integer
    input gives float32. Not over a graph-sized axis: use a `tg.mean()` reducer there."""
    x = asvalue(x)
    axes = _axes(x, axis, dim)
    sizes = [_typeof(x).shape[a] for a in axes]
    if builtins.any(isinstance(s, Dim) for s in sizes):
        raise UnsupportedError("mean over a symbolic (graph-sized) axis", hint="use sum and "
                               "divide by the count, or a tg.mean() reducer")
    count = int(np.prod(sizes)) if sizes else 1
    if not _typeof(x).dtype.is_float:
        x = convert(x, float32)
    return divide(sum(x, axis=axes, keepdims=keepdims), float(count))


def norm(x, axis=-1, keepdims=False, *, dim=None):
    """The Euclidean norm over `axis` (the last by default; `dim=` is an alias):
    sqrt(sum(x ** 2))."""
    return sqrt(sum(square(x), axis=axis, keepdims=keepdims, dim=dim))


def reshape(x, *shape):
    """x with a new shape of the same size, given as one tuple or as ints; one -1 is inferred."""
    x = asvalue(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    t = _typeof(x)
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        total = t.shape and np.prod([d for d in t.shape])
        if known == 0 or builtins.any(isinstance(d, Dim) for d in t.shape):
            raise ShapeError(f"reshape: cannot infer -1 in {shape} for {t}")
        shape = tuple(int(total) // known if d == -1 else d for d in shape)
    if tuple(shape) == t.shape:
        return x
    return bind(reshape_p, x, new_sizes=tuple(shape))


def transpose(x, *axes):
    """x with its axes permuted (given as one tuple or as ints); no axes reverses them."""
    x = asvalue(x)
    n = _typeof(x).ndim
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    perm = tuple(a % n for a in axes) if axes else tuple(reversed(range(n)))
    if perm == tuple(range(n)):
        return x
    return bind(transpose_p, x, permutation=perm)


def expand_dims(x, axis):
    """x with a new axis of size 1 inserted at `axis`."""
    t = _typeof(asvalue(x))
    axis = axis % (t.ndim + 1)
    return reshape(x, t.shape[:axis] + (1,) + t.shape[axis:])


def squeeze(x, axis=None):
    """x without its size-1 axes (only `axis`, when given)."""
    t = _typeof(asvalue(x))
    axes = ([a for a in range(t.ndim) if t.shape[a] == 1] if axis is None else
        list(normalize_axes(axis, t.ndim)))
    return reshape(x, tuple(d for i, d in enumerate(t.shape) if i not in axes))


def concatenate(xs, axis=0, *, dim=None):
    """The arrays of `xs` joined along an existing `axis` (`dim=` is an alias), promoted to one
    dtype."""
    xs, _ = _promote_operands(*xs)
    nd = _typeof(xs[0]).ndim
    axis = normalize_axes(dim if dim is not None else axis, nd)[0]
    return bind(concatenate_p, *xs, dimension=axis)


def stack(xs, axis=0, *, dim=None):
    """The arrays of `xs`, of one shape, joined along a new `axis` (`dim=` is an alias)."""
    axis = dim if dim is not None else axis
    return concatenate([expand_dims(asvalue(x), axis) for x in xs], axis=axis)


def pad(x, config):
    """x padded with zeros: `config` holds (low, high, interior) per axis, as in JAX's lax.pad."""
    return bind(pad_p, asvalue(x), padding_config=tuple(tuple(c) for c in config))


def slice_static(x, start, limit, strides=None):
    """x[start:limit:strides] per axis, with static start, limit and (positive) strides."""
    x = asvalue(x)
    strides = tuple(strides) if strides else (1,) * len(start)
    return bind(slice_p, x, start_indices=tuple(start), limit_indices=tuple(limit),
                strides=strides)


def dot_general(x, y, dimension_numbers):
    """A general tensor contraction, as JAX's lax.dot_general: `dimension_numbers` is ((x
    contracting axes, y contracting axes), (x batch axes, y batch axes))."""
    (x, y), _ = _promote_operands(x, y)
    return bind(dot_general_p, x, y, dimension_numbers=dimension_numbers)


def matmul(x, y):
    """The matrix product x @ y with numpy's rules: 1-D operands are vectors, leading axes broadcast
    as batch axes."""
    (x, y), _ = _promote_operands(x, y)
    tx, ty = _typeof(x), _typeof(y)
    if tx.ndim == 0 or ty.ndim == 0:
        raise ShapeError("matmul: operands must have at least one dimension")
    squeeze_x, squeeze_y = tx.ndim == 1, ty.ndim == 1
    if squeeze_x:
        x = reshape(x, (1,) + tx.shape)
    if squeeze_y:
        y = reshape(y, ty.shape + (1,))
    tx, ty = _typeof(x), _typeof(y)
    batch = broadcast_shapes(tx.shape[:-2], ty.shape[:-2], what="matmul batch axes")
    x = broadcast_to(x, batch + tx.shape[-2:])
    y = broadcast_to(y, batch + ty.shape[-2:])
    b = tuple(range(len(batch)))
    out = dot_general(x, y, (((len(batch) + 1,), (len(batch),)), (b, b)))
    shape = _typeof(out).shape
    if squeeze_x:
        out = reshape(out, shape[:-2] + shape[-1:])
        shape = _typeof(out).shape
    if squeeze_y:
        out = reshape(out, shape[:-1])
    return out


def dot(x, y):
    """numpy's dot: the matrix product for 1-D and 2-D operands, x * y for a scalar, else a
    contraction of x's last axis with y's second to last."""
    tx, ty = _typeof(asvalue(x)), _typeof(asvalue(y))
    if tx.ndim <= 2 and ty.ndim <= 2 and tx.ndim and ty.ndim:
        return matmul(x, y)
    if tx.ndim == 0 or ty.ndim == 0:
        return multiply(x, y)
    return dot_general(x, y, (((tx.ndim - 1,), (builtins.max(ty.ndim - 2, 0),)), ((), ())))


def getitem(x, index):
    """Basic indexing: ints, slices with positive steps, None and Ellipsis."""
    x = asvalue(x)
    t = _typeof(x)
    index = index if isinstance(index, tuple) else (index,)
    if builtins.any(not isinstance(i, (int, slice, type(None), type(Ellipsis)))
                    or isinstance(i, bool) for i in index):
        raise UnsupportedError("only basic indexing (ints, slices, None, ...) is supported "
                               "on traced arrays", hint="use tg.math.where or a relation")
    n_real = builtins.sum(1 for i in index if isinstance(i, (int, slice)))
    if index.count(Ellipsis) > 1 or n_real > t.ndim:
        raise ShapeError(f"index {index} has too many entries for {t}")
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (t.ndim - n_real) + index[k + 1:]
    else:  # the Ellipsis already filled the unindexed axes
        index = index + (slice(None),) * (t.ndim - n_real)
    return _apply_index(x, t, index)


def _apply_index(x, t, index):
    start, limit, strides, out_shape = [], [], [], []
    axis = 0
    for i in index:
        if i is None:
            out_shape.append(1)
            continue
        size = t.shape[axis]
        if isinstance(i, int):
            j = i + size if i < 0 else i
            if not 0 <= j < size:
                raise ShapeError(f"index {i} is out of range for axis {axis} of size {size}")
            start.append(j), limit.append(j + 1), strides.append(1)
        else:
            if isinstance(size, Dim) and i == slice(None):
                start.append(0), limit.append(size), strides.append(1)
                out_shape.append(size)
                axis += 1
                continue
            lo, hi, st = i.indices(size)
            if st < 1:
                raise UnsupportedError("negative slice steps are not supported",
                                       hint="reverse with an explicit index relation")
            start.append(lo), limit.append(builtins.max(hi, lo)), strides.append(st)
            out_shape.append(builtins.max(0, -(-(hi - lo) // st)))
        axis += 1
    out = x
    if (tuple(start), tuple(limit)) != ((0,) * t.ndim, t.shape) or builtins.any(
            s != 1 for s in strides):
        out = slice_static(x, start, limit, strides)
    return reshape(out, tuple(out_shape))


# tg.math's public API: the functions defined here; the primitives, the tracer's helpers
# and the modules this one imports stay reachable but are neither exported nor listed
__all__ = sorted(_n for _n, _f in list(globals().items()) if not _n.startswith("_")
                 and callable(_f) and getattr(_f, "__module__", None) == __name__
                 and not isinstance(_f, type))


def __dir__() -> list[str]:
    return list(__all__)
