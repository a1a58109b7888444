"""trace: Python operators and array methods shared by tracers and tg.Tensor."""
from __future__ import annotations

from ..core.errors import UnsupportedError
from . import math as m
from .tracer import Tracer, aval_of


def _swap(fn):
    return lambda self, other: fn(other, self)


class ArrayOps:
    """Mixin: operators and methods that bind primitives through tg.math."""

    __slots__ = ()

    @property
    def shape(self) -> tuple:
        return aval_of(self).shape

    @property
    def dtype(self):
        return aval_of(self).dtype

    @property
    def ndim(self) -> int:
        return aval_of(self).ndim

    @property
    def T(self):
        return m.transpose(self)

    __add__ = lambda self, o: m.add(self, o)  # noqa: E731
    __radd__ = _swap(m.add)
    __sub__ = lambda self, o: m.subtract(self, o)  # noqa: E731
    __rsub__ = _swap(m.subtract)
    __mul__ = lambda self, o: m.multiply(self, o)  # noqa: E731
    __rmul__ = _swap(m.multiply)
    __truediv__ = lambda self, o: m.divide(self, o)  # noqa: E731
    __rtruediv__ = _swap(m.divide)
    __pow__ = lambda self, o: m.power(self, o)  # noqa: E731
    __rpow__ = _swap(m.power)
    __matmul__ = lambda self, o: m.matmul(self, o)  # noqa: E731
    __rmatmul__ = _swap(m.matmul)
    __neg__ = lambda self: m.negative(self)  # noqa: E731
    __pos__ = lambda self: self  # noqa: E731
    __abs__ = lambda self: m.abs(self)  # noqa: E731
    __lt__ = lambda self, o: m.less(self, o)  # noqa: E731
    __le__ = lambda self, o: m.less_equal(self, o)  # noqa: E731
    __gt__ = lambda self, o: m.greater(self, o)  # noqa: E731
    __ge__ = lambda self, o: m.greater_equal(self, o)  # noqa: E731
    # elementwise like numpy; without these `a == b` silently compared object identity
    __eq__ = lambda self, o: m.equal(self, o)  # noqa: E731
    __ne__ = lambda self, o: m.not_equal(self, o)  # noqa: E731
    __hash__ = object.__hash__  # defining __eq__ would otherwise make values unhashable
    __and__ = lambda self, o: m.logical_and(self, o)  # noqa: E731
    __or__ = lambda self, o: m.logical_or(self, o)  # noqa: E731
    __invert__ = lambda self: m.logical_not(self)  # noqa: E731
    __getitem__ = lambda self, idx: m.getitem(self, idx)  # noqa: E731

    def sum(self, axis=None, keepdims=False, *, dim=None):
        return m.sum(self, axis, keepdims, dim=dim)

    def max(self, axis=None, keepdims=False, *, dim=None):
        return m.max(self, axis, keepdims, dim=dim)

    def min(self, axis=None, keepdims=False, *, dim=None):
        return m.min(self, axis, keepdims, dim=dim)

    def mean(self, axis=None, keepdims=False, *, dim=None):
        return m.mean(self, axis, keepdims, dim=dim)

    def prod(self, axis=None, keepdims=False, *, dim=None):
        return m.prod(self, axis, keepdims, dim=dim)

    def norm(self, axis=-1, keepdims=False, *, dim=None):
        return m.norm(self, axis, keepdims, dim=dim)

    def exp(self): return m.exp(self)
    def log(self): return m.log(self)
    def sqrt(self): return m.sqrt(self)
    def abs(self): return m.abs(self)
    def relu(self): return m.relu(self)
    def tanh(self): return m.tanh(self)
    def sigmoid(self): return m.sigmoid(self)
    def square(self): return m.square(self)
    def leaky_relu(self, negative_slope=0.01): return m.leaky_relu(self, negative_slope)
    def elu(self, alpha=1.0): return m.elu(self, alpha)
    def softplus(self, beta=1.0, threshold=20.0): return m.softplus(self, beta, threshold)
    def log_softmax(self, axis=-1, *, dim=None): return m.log_softmax(self, axis, dim=dim)
    def softmax(self, axis=-1, *, dim=None): return m.softmax(self, axis, dim=dim)
    def reshape(self, *shape): return m.reshape(self, *shape)
    def transpose(self, *axes): return m.transpose(self, *axes)
    def astype(self, dtype): return m.convert(self, dtype)


_NOT_COPIED = {"__module__", "__qualname__", "__doc__", "__slots__", "__dict__", "__weakref__",
               "__hash__"}
# Tracer cannot inherit ArrayOps (tg.math imports the tracer), so it receives the methods here.
for _name, _value in vars(ArrayOps).items():
    if _name not in _NOT_COPIED:
        setattr(Tracer, _name, _value)


# numpy and torch calls on a tracer (Tracer only: a tg.Tensor holds data)

def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    # numpy hands us `ndarray <op> tracer` (and numpy scalars) as a ufunc call: serve the
    # operators; any other numpy function cannot run on a value that has no data yet
    op = _OPERATOR_UFUNCS.get(ufunc.__name__) if method == "__call__" and not kwargs else None
    if op is not None:
        return getattr(m, op)(*inputs)
    suffix = "" if method == "__call__" else f".{method}"
    raise _foreign_call("numpy", f"np.{ufunc.__name__}{suffix}", ufunc.__name__)


def _array_function(self, func, types, args, kwargs):
    module = getattr(func, "__module__", None) or "numpy"
    where = "np" + module[len("numpy"):] if module.startswith("numpy") else module
    raise _foreign_call("numpy", f"{where}.{func.__name__}", func.__name__)


def _torch_function(cls, func, types, args=(), kwargs=None):
    name = getattr(func, "__name__", str(func))
    owner = getattr(func, "__qualname__", "").split(".")[0]
    if owner in ("Tensor", "TensorBase") and args and not isinstance(args[0], Tracer):
        # `torch_tensor * tracer` arrives as TensorBase.mul: decline, so that torch turns
        # the operator into NotImplemented and Python calls the tracer's reflected one
        return NotImplemented
    raise _foreign_call("torch", f"torch.{name}", name)


# ufuncs numpy calls for its operators with a tracer on the right, and the tg.math spelling
_OPERATOR_UFUNCS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
    "true_divide": "divide", "power": "power", "matmul": "matmul", "less": "less",
    "less_equal": "less_equal", "greater": "greater", "greater_equal": "greater_equal",
    "equal": "equal", "not_equal": "not_equal", "bitwise_and": "logical_and",
    "bitwise_or": "logical_or",
}


def _foreign_call(library: str, what: str, short: str) -> UnsupportedError:
    fn = getattr(m, short, None)
    if callable(fn) and getattr(fn, "__module__", None) == m.__name__:
        hint = f"use tg.math.{short}(...) or the array methods (x.sum(), x.exp(), ...)"
    else:
        hint = ("use the tg.math functions (tg.math.exp, tg.math.sum, tg.math.where, ...) or "
                "the array methods (x.sum(axis=...), x.exp(), ...)")
    return UnsupportedError(f"{what}: {library} functions cannot run on a traced value (edge "
                            "and update functions, tg.jit, tg.grad and tg.vjp see symbolic "
                            "values, not data)", hint)


Tracer.__array_ufunc__ = _array_ufunc
Tracer.__array_function__ = _array_function
Tracer.__torch_function__ = classmethod(_torch_function)
