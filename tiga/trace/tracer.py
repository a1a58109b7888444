"""trace: builders that stage primitive applications into GraphPrograms, and `bind`."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.dtypes import as_dtype
from ..core.errors import RequiresGradError, TraceError
from ..core.primitive import Primitive, abstract_eval_rules, impl_rules
from ..core.program import Eqn, GraphProgram, Lit, Var
from ..core.types import Dim, GraphType, TensorType
from .unroll import note_propagate

_state = threading.local()


def _stack() -> list:
    if not hasattr(_state, "builders"):
        _state.builders = []
    return _state.builders


class Tracer:
    """A staged value: its type and the Var it is bound to in one builder."""

    __array_priority__ = 1000  # numpy defers mixed operators to us
    __slots__ = ("aval", "builder", "var")

    def __init__(self, aval, builder: Builder, var: Var):
        self.aval = aval
        self.builder = builder
        self.var = var

    def __repr__(self) -> str:
        return f"Tracer<{self.aval}>"

    def __bool__(self):
        raise TraceError("a traced value has no concrete truth value; use tg.math.where "
                         "for data-dependent choices or tg.while_loop for data-dependent loops")

    def _no_concrete(self, what: str):
        raise TraceError(f"{what}() of the traced value {self.aval}: it has no concrete value "
                         "inside a traced function; keep it an array (tg.math, x.astype(...)) "
                         "or pass the number as a keyword parameter")

    def __float__(self):
        self._no_concrete("float")

    def __int__(self):
        self._no_concrete("int")

    def __index__(self):
        self._no_concrete("index")

    def __complex__(self):
        self._no_concrete("complex")

    def __array__(self, *args, **kwargs):
        raise TraceError(f"cannot convert the traced value {self.aval} to a numpy array "
                         "inside a traced function")

    def _no_value(self, what: str):
        raise TraceError(
            f"{what} of the traced value {self.aval}: inside tg.jit, tg.grad or another "
            "transformation the function is traced once for every input of this type, so "
            "its values are not known yet. Keep it an array (tg.math, x.astype(...)); use "
            "tg.math.where for a data-dependent choice and tg.while_loop for a data-dependent "
            f"loop; or return it and call {what} on the result, outside the traced function")

    def item(self, *args):
        self._no_value(".item()")

    def tolist(self):
        self._no_value(".tolist()")

    def numpy(self, *args, **kwargs):
        self._no_value(".numpy()")

    def __hash__(self):
        return id(self)

    # the operators, the array methods and numpy's and torch's protocols (__array_ufunc__,
    # __array_function__, __torch_function__) come from array_ops.py: they call tg.math,
    # which imports this module


class Builder:
    """Records equations for one (sub-)trace; foreign values become captured inputs."""

    def __init__(self, top: bool, lift: bool = False):
        self.top = top  # concrete captures inline as literals only at top level
        # `lift`: a tensor paged from disk closed over by the traced function becomes an input
        # of the program, not a literal: the runtime pages an input (a literal it reads whole)
        self.lift = lift
        self.eqns: list[Eqn] = []
        self.args: list[Var] = []
        self.captures: list[tuple[Any, Var]] = []
        self._captured: dict[int, Tracer] = {}

    def new_arg(self, aval) -> Tracer:
        v = Var(aval)
        self.args.append(v)
        return Tracer(aval, self, v)

    def capture(self, x) -> Tracer:
        if id(x) not in self._captured:
            aval = x.aval if isinstance(x, Tracer) else aval_of(x)
            v = Var(aval)
            self.captures.append((x, v))
            self._captured[id(x)] = Tracer(aval, self, v)
        return self._captured[id(x)]

    def atom(self, x):
        if isinstance(x, Lit):
            return x
        if isinstance(x, Tracer):
            if x.builder is self:
                return x.var
            if x.builder not in _stack():
                raise TraceError(f"a traced value {x.aval} escaped the function that traced it "
                                 "(it was stored outside and used later)")
            return self.capture(x).var
        aval = aval_of(x)
        if self.lift and lifted(x):
            return self.capture(x).var
        # a foreign scalar (torch) stays a captured input so that it can receive a gradient
        if self.top or (isinstance(aval, TensorType) and aval.ndim == 0 and not _owned(x)):
            return Lit(x, aval) if isinstance(aval, TensorType) else GraphLit(x, aval)
        return self.capture(x).var

    def program(self, outs: list) -> GraphProgram:
        out_atoms = [self.atom(o) for o in outs]
        binders = [v for _, v in self.captures] + self.args
        return GraphProgram(tuple(binders), tuple(self.eqns), tuple(out_atoms))


def lifted(x) -> bool:
    """A concrete value a lifting trace takes as an input of the program rather than as a
    literal: a tensor on the disk tier (the runtime reads a literal whole, an input page by
    page, as it would the same tensor passed as an argument)."""
    return (not isinstance(x, Tracer) and getattr(x, "tier", None) == "disk" and
        hasattr(x, "__tiga_type__"))


class GraphLit(Lit):
    """A relation captured as a constant of a program (its arrays are part of the key)."""

    __slots__ = ()

    def __init__(self, value, type: GraphType):  # noqa: A002
        self.value = value
        self.type = type


def aval_of(x):
    if isinstance(x, Tracer):
        return x.aval
    if isinstance(x, Lit):
        return x.type
    t = getattr(x, "__tiga_type__", None)
    if t is not None:
        return t
    if hasattr(x, "type") and callable(x.type) and hasattr(x, "resolve_csr"):
        return x.type()
    arr = host_array(x)
    return TensorType(arr.shape, as_dtype(arr.dtype))


def _resolver():
    stack = getattr(_state, "resolvers", None)
    return stack[-1] if stack else None


class resolving:
    """Install a resolver for foreign arrays (torch tensors) met while tracing.

    Trace cannot import torch, so the torch bridge supplies `view(x) -> ndarray | None` (a
    host view, the same object each time for one tensor) and `owns(x) -> bool` (x is such a
    tensor or view). Owned values are staged as captured inputs, never literals nor eager
    results, so the bridge can route their gradients back to the tensors.
    """

    def __init__(self, resolver):
        self.resolver = resolver

    def __enter__(self):
        if not hasattr(_state, "resolvers"):
            _state.resolvers = []
        _state.resolvers.append(self.resolver)
        return self.resolver

    def __exit__(self, *exc):
        _state.resolvers.pop()


# a torch tensor that requires grad met a trace with no resolver installed: the message
# propagate routes catch it and reroute through the torch bridge; anywhere else the user
# sees it as tg.RequiresGradError
NeedsTorchBridge = RequiresGradError


def host_array(x) -> np.ndarray:
    """`np.asarray(x)`, except that an installed resolver reads foreign arrays."""
    r = _resolver()
    view = r.view(x) if r is not None else None
    if view is not None:
        return view
    if getattr(x, "requires_grad", False) is True:
        # numpy cannot read it; the caller reroutes through the torch bridge (autograd)
        raise NeedsTorchBridge(
            f"a torch tensor that requires grad ({tuple(x.shape)}) cannot enter tg.jit, "
            "tg.grad or another Tiga transformation: call the propagate or layer outside "
            "them and use torch's .backward() (Tiga's compiled backward runs inside it), or "
            "pass x.detach() to differentiate with tg.grad")
    return np.asarray(x)


def _owned(x) -> bool:
    r = _resolver()
    return r is not None and r.owns(x)


def current_builder() -> Builder | None:
    s = _stack()
    return s[-1] if s else None


class building:
    """Context manager that makes `builder` the innermost trace."""

    def __init__(self, builder: Builder):
        self.builder = builder

    def __enter__(self) -> Builder:
        _stack().append(self.builder)
        return self.builder

    def __exit__(self, *exc):
        _stack().pop()


_concrete_wrapper: list[Callable] = [lambda x: x]


def set_concrete_wrapper(fn: Callable) -> None:
    """The runtime registers how eager results are wrapped (tg.Tensor)."""
    _concrete_wrapper[0] = fn


def bind(prim: Primitive, *args, **params):
    """Apply a primitive: stage it when a traced operand is present, else run the impl."""
    builder = current_builder()
    if builder is not None and (any(isinstance(a, Tracer) or _owned(a) for a in args)
                                or _symbolic(params)):
        return _stage(builder, prim, args, params)
    values = [a.value if isinstance(a, Lit) else a if _is_graph(a) else host_array(a)
              for a in args]
    abstract_eval_rules[prim](*[aval_of(v) for v in values], **params)  # validates eagerly
    outs = impl_rules[prim](*values, **params)
    wrapped = [_concrete_wrapper[0](np.asarray(o)) for o in outs]
    return wrapped if prim.multiple_results else wrapped[0]


def _symbolic(params) -> bool:
    """A shape parameter with a symbolic dim has no concrete value until the program runs."""
    def has_dim(p):
        return isinstance(p, Dim) or (isinstance(p, tuple) and any(has_dim(q) for q in p))
    return any(has_dim(p) for p in params.values())


def _is_graph(x) -> bool:
    return hasattr(x, "resolve_csr")


def _stage(builder: Builder, prim, args, params):
    atoms = [builder.atom(a) for a in args]
    out_types = abstract_eval_rules[prim](*[a.type for a in atoms], **params)
    outs = [Var(t) for t in out_types]
    builder.eqns.append(Eqn(prim, tuple(atoms), dict(params), tuple(outs)))
    if prim.name == "propagate":
        note_propagate(builder, builder.eqns[-1])   # a Python loop unrolled: TraceWarning
    tracers = [Tracer(t, builder, v) for t, v in zip(out_types, outs)]
    return tracers if prim.multiple_results else tracers[0]
