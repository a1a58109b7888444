"""core: `record`, a frozen dataclass whose methods are shared functions, not compiled ones.

`dataclasses.dataclass(frozen=True)` compiles six methods per class with `exec` when its module
is imported (__init__, __repr__, __eq__, __hash__, __setattr__, __delattr__): ~0.5-2 ms a
class on this project's 2-core machine, a third of `import tiga` over its ~80 dataclasses.
`record` makes the same dataclass (dataclasses.fields / replace / asdict work; FrozenInstanceError,
repr, equality and hash values are the dataclass ones) with the methods written once here, over
the class's field names. Its __init__ binds arguments in a loop, so a class built in a hot loop
(the tracer's types and equations) stays a plain dataclass; the IR levels' ops, built once per
lowering, are records.
"""
from __future__ import annotations

import dataclasses
from operator import attrgetter

_MISSING = dataclasses.MISSING


def record(cls=None, /, *, eq: bool = True):
    """`@record` / `@record(eq=False)`: `@dataclass(frozen=True[, eq=False])`, methods shared."""
    if cls is None:
        return lambda c: _make(c, eq)
    return _make(cls, eq)


def _make(cls, eq: bool):
    own = dict(cls.__dict__)     # (as dataclass: what the class body defines is kept)
    for name in ("__setattr__", "__delattr__"):
        if name in own:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    explicit_hash = not ("__hash__" not in own or (own["__hash__"] is None and "__eq__" in own))
    own_doc = own.get("__doc__")
    if own_doc is None:
        cls.__doc__ = "-"      # (dataclass would build one through inspect.signature)
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False)
    fields = dataclasses.fields(cls)
    init = tuple(f for f in fields if f.init)
    made = {"__init__": _init(cls, init), "__repr__": _repr(tuple(f.name for f in fields
                                                                  if f.repr))}
    made["__setattr__"], made["__delattr__"] = _frozen(cls, frozenset(f.name for f in fields))
    if eq:
        made["__eq__"] = _eq(tuple(f.name for f in fields if f.compare))
    for name, fn in made.items():
        if name not in own:
            setattr(cls, name, fn)
    if eq and not explicit_hash:
        hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        cls.__hash__ = _hash(hashed)
    if own_doc is None:
        cls.__doc__ = cls.__name__ + "(" + ", ".join(_described(f) for f in init) + ")"
    return cls


def _described(f) -> str:
    text = f"{f.name}: {f.type!r}"
    return text if f.default is _MISSING else f"{text} = {f.default!r}"


def _init(cls, fields: tuple):
    names = tuple(f.name for f in fields)
    defaults = {f.name: f.default for f in fields if f.default is not _MISSING}
    factories = {f.name: f.default_factory for f in fields
                 if f.default_factory is not _MISSING}
    post_init = hasattr(cls, "__post_init__")
    n_names = len(names)

    def __init__(self, *args, **kwargs):
        if len(args) > n_names:
            raise TypeError(f"{type(self).__name__}.__init__() takes {n_names + 1} positional "
                            f"arguments but {len(args) + 1} were given")
        state = self.__dict__
        state.update(zip(names, args))
        if kwargs or len(args) < n_names:
            for name in names[:len(args)]:
                if name in kwargs:
                    raise TypeError(f"{type(self).__name__}.__init__() got multiple values "
                                    f"for argument {name!r}")
            for name in names[len(args):]:
                if name in kwargs:
                    state[name] = kwargs.pop(name)
                elif name in defaults:
                    state[name] = defaults[name]
                elif name in factories:
                    state[name] = factories[name]()
                else:
                    raise TypeError(f"{type(self).__name__}.__init__() missing required "
                                    f"argument: {name!r}")
            if kwargs:
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword "
                                f"argument {next(iter(kwargs))!r}")
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _repr(names: tuple):
    def __repr__(self):
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{type(self).__qualname__}({inner})"
    return __repr__


def _row(names: tuple):
    """self -> the tuple of these fields (a 1-tuple for one field, as dataclass compares)."""
    if not names:
        return lambda self: ()
    get = attrgetter(*names)
    return (lambda self: (get(self),)) if len(names) == 1 else get


def _eq(names: tuple):
    row = _row(names)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return row(self) == row(other)
        return NotImplemented
    return __eq__


def _hash(names: tuple):
    row = _row(names)

    def __hash__(self):
        return hash(row(self))
    return __hash__


def _frozen(cls, names: frozenset):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)
    return __setattr__, __delattr__


__all__ = ["record"]
