"""trace: Python operators and array methods shared by tracers and tg.Tensor."""
from __future__ import annotations

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
