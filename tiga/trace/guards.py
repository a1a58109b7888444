"""trace: guards on what a traced function read from outside its arguments.

A trace bakes in the Python values an edge, update or loss function reads from module
globals, closure cells, attributes of `self` (instance or class), attributes of nested
objects and dict entries with constant keys. A cached trace is only valid while those reads
would give the same answer, so a cache entry keeps them as guards: (where to read, what was
read) pairs that `check` re-reads on reuse. Python numbers, strings and tuples of them are
compared by value (they became constants of the program); other objects by identity.

The reads are found by scanning the function's bytecode for access chains
(`SCALE`, `self.cfg.scale`, `CONST["k"]`, `M.temperature`) and resolving them against the
concrete objects; functions, bound methods and callable objects that the chains reach are
scanned too (user code only, a few levels deep), so a helper's globals are guarded as well.
Reads through values the chain cannot name statically (`self.layers[i]`, a local variable)
guard only the container, by identity. Builtins are not guarded.
"""
from __future__ import annotations

import dis
import sys
import sysconfig
import types
import weakref

import numpy as np

from ..core.reducers import Reducer

MAX_DEPTH = 3
MAX_GUARDS = 256
_SIMPLE = (bool, int, float, complex, str, bytes, type(None), np.generic)
_LIBRARY_PACKAGES = frozenset({"tiga", "numpy", "torch", "scipy", "builtins", "functools",
                               "math", "operator", "typing", "abc", "collections"})
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
_CALLABLE_METHODS = ("__call__", "forward", "edge", "update")

# step kinds of an access path
_ATTR, _ITEM, _GLOBAL, _CELL = 0, 1, 2, 3
# expectation kinds
_VALUE, _SAME, _METHOD, _PRINT = 0, 1, 2, 3

_SCANS: dict = {}   # code object -> access chains (root, steps); code objects live long


def value_token(v):
    """What a trace depends on in a Python value read from outside its arguments, when it
    is compared by value (None: compare by identity)."""
    if isinstance(v, float):
        return ("float", repr(v))    # -0.0 and nan stay distinct from 0.0 and each other
    if isinstance(v, np.generic):   # by bits: a NaN scalar equals itself
        return ("np", v.dtype.str, v.tobytes())
    if isinstance(v, _SIMPLE):
        return (type(v).__name__, v)
    if isinstance(v, tuple) and len(v) <= 16 and all(isinstance(x, _SIMPLE) for x in v):
        return ("tuple", tuple(value_token(x) for x in v))
    if isinstance(v, Reducer):
        return ("reducer", v._key())    # reducers compare by value
    return None


def ref(obj):
    """A weak reference, or a strong one for objects that take none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda obj=obj: obj


def expect(v) -> tuple:
    """The expectation a guard stores for the value `v` it read."""
    fingerprint = getattr(type(v), "__tiga_fingerprint__", None)
    if fingerprint is not None:   # tg.nn.trace modules: layer structure, parameter ids
        return (_PRINT, ref(v), fingerprint(v))
    token = value_token(v)
    if token is not None:
        return (_VALUE, token, None)
    if isinstance(v, types.MethodType):   # a new bound-method object on every read
        return (_METHOD, ref(v.__func__), ref(v.__self__))
    return (_SAME, ref(v), None)


def holds(v, exp: tuple) -> bool:
    kind, a, b = exp
    if kind == _VALUE:
        return value_token(v) == a
    if kind == _SAME:
        return a() is v
    if kind == _METHOD:
        return isinstance(v, types.MethodType) and a() is v.__func__ and b() is v.__self__
    return a() is v and type(v).__tiga_fingerprint__(v) == b


def read(root, steps: tuple):
    obj = root
    for kind, arg in steps:
        if kind == _ATTR:
            obj = getattr(obj, arg)
        elif kind == _ITEM:
            obj = obj[arg]
        elif kind == _GLOBAL:
            obj = obj[arg]
        else:
            obj = obj.cell_contents
    return obj


def check(guards: tuple) -> bool:
    """Every guarded read gives what the trace read (a failing read fails the guard)."""
    try:
        for root, steps, exp in guards:
            if not holds(read(root(), steps), exp):
                return False
    except Exception:   # noqa: BLE001 - an attribute gone, a key deleted: retrace
        return False
    return True


def collect(fns) -> tuple:
    """Guards for everything the functions `fns` (and user code they reach) read."""
    out: dict = {}
    seen: set = set()
    for fn in fns:
        if fn is not None:
            _collect_callable(fn, out, seen, 0)
    return tuple(out.values())


def pinned_ids(guards: tuple) -> set:
    """ids of the objects the guards hold by identity (an array read from a global...)."""
    ids = set()
    for _, _, (kind, a, _) in guards:
        if kind in (_SAME, _PRINT) and a() is not None:
            ids.add(id(a()))
    return ids


def _collect_callable(v, out, seen, depth) -> None:
    if depth > MAX_DEPTH or len(out) >= MAX_GUARDS:
        return
    if isinstance(v, types.MethodType):
        if isinstance(v.__func__, types.FunctionType):
            _collect_function(v.__func__, v.__self__, out, seen, depth)
    elif isinstance(v, types.FunctionType):
        _collect_function(v, None, out, seen, depth)
    elif not isinstance(v, (type, types.ModuleType)) and _is_user(type(v)):
        for name in _CALLABLE_METHODS:
            f = getattr(type(v), name, None)
            if isinstance(f, types.FunctionType):
                _collect_function(f, v, out, seen, depth)


def _is_user(obj) -> bool:
    """Code of the program's author (not a library's): only that is scanned."""
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] in _LIBRARY_PACKAGES:
        return False
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) or ""
    return not (path and path.startswith(_LIBRARY_DIRS))


def _collect_function(fn, owner, out, seen, depth) -> None:
    if (fn.__code__, id(owner)) in seen or not _is_user(fn):
        return
    seen.add((fn.__code__, id(owner)))
    code = fn.__code__
    self_name = code.co_varnames[0] if owner is not None and code.co_argcount else None
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    for root_kind, name, steps in _chains(code):
        if root_kind == "global":
            if name not in fn.__globals__:
                continue   # a builtin (or a name that fails at call time anyway)
            root, steps = fn.__globals__, ((_GLOBAL, name),) + steps
        elif root_kind == "deref" and name == self_name and steps:
            root = owner
        elif root_kind == "deref" and name in cells:
            root, steps = cells[name], ((_CELL, None),) + steps
        elif root_kind == "fast" and name == self_name and steps:
            root = owner
        else:
            continue
        _add(root, steps, out, seen, depth)


def _add(root, steps, out, seen, depth) -> None:
    key = (id(root), steps)
    if key in out or len(out) >= MAX_GUARDS:
        return
    try:
        v = read(root, steps)
    except Exception:   # noqa: BLE001 - raises at call time too; nothing to guard
        return
    out[key] = (ref(root), steps, expect(v))
    _collect_callable(v, out, seen, depth + 1)


_NO_CONST = object()


def _chains(code) -> list:
    """Access chains `(root kind, root name, steps)` in `code` and the code nested in it."""
    found = _SCANS.get(code)
    if found is not None:
        return found
    found = []
    chain, const = None, _NO_CONST
    for ins in dis.get_instructions(code):
        op = ins.opname
        if chain is not None and op in ("LOAD_ATTR", "LOAD_METHOD") and const is _NO_CONST:
            chain[2].append((_ATTR, ins.argval))
            continue
        if (chain is not None and op in ("LOAD_CONST", "LOAD_SMALL_INT")
                and const is _NO_CONST and _constant_key(ins.argval)):
            const = ins.argval
            continue
        if chain is not None and const is not _NO_CONST and (
                op == "BINARY_SUBSCR" or (op == "BINARY_OP" and ins.argrepr == "[]")):
            chain[2].append((_ITEM, const))
            const = _NO_CONST
            continue
        if chain is not None:
            found.append((chain[0], chain[1], tuple(chain[2])))
        chain, const = _chain_start(ins), _NO_CONST
    if chain is not None:
        found.append((chain[0], chain[1], tuple(chain[2])))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):   # lambdas, comprehensions, inner functions
            found += [ch for ch in _chains(c) if ch[0] != "fast"]
    if len(_SCANS) > 4096:
        _SCANS.clear()
    _SCANS[code] = found
    return found


def _chain_start(ins):
    op = ins.opname
    if op == "LOAD_GLOBAL":
        return ("global", ins.argval, [])
    if op in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        return ("deref", ins.argval, [])
    if op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"):
        return ("fast", ins.argval, [])
    return None


def _constant_key(c) -> bool:
    if isinstance(c, tuple):
        return all(isinstance(x, (str, int)) for x in c)
    return isinstance(c, (str, int, bytes)) and not isinstance(c, bool)
