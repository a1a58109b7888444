"""trace: staged programs of concrete message-passing calls, reused per call signature.

Staging a `MessagePassing.__call__` / `tg.propagate` call traces the edge (and update)
function again, which costs ~0.1 ms per call. A staged program is symbolic in the graph
sizes, so the same program serves every later call with the same signature:

- the edge/update functions (a bound method: its function and its owner object, plus a
  fingerprint of the owner's attributes; a plain function: the function object, plus its
  closure cells and defaults), the reducer,
- the relation's symbolic type (kind, index dtype), every field's role, name and type,
  every keyword parameter's name and type.

Python numbers that the functions read from those places are baked into the trace as
constants, so they are part of the fingerprint (by value); other objects count by identity.
A trace that captured arrays (weights closed over by the edge function) is not reused: new
array values must reach the program as new captures. Module globals are not fingerprinted:
like `tg.jit`, a cached call does not see a changed global.
"""
from __future__ import annotations

import inspect
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .rewrites import hoist_linear_projections
from .staging import leaf_aval, leaf_value

MAX_ENTRIES = 128
_SIMPLE = (bool, int, float, complex, str, bytes, type(None), np.generic)
_SKIP_ATTRS = frozenset({"_last_call"})   # set by MessagePassing.__call__ itself

_LOCK = threading.Lock()
_ENTRIES: OrderedDict = OrderedDict()     # key -> (program, liveness refs)
STATS = {"hits": 0, "misses": 0, "uncacheable": 0}


def _value_print(v):
    fingerprint = getattr(type(v), "__tiga_fingerprint__", None)
    if fingerprint is not None:   # e.g. tg.nn.trace modules: layer structure, parameter ids
        return ("fingerprint", id(v), fingerprint(v))
    if isinstance(v, float):
        return ("float", repr(v))    # -0.0 and nan stay distinct from 0.0 and each other
    if isinstance(v, _SIMPLE):
        return (type(v).__name__, v)
    if isinstance(v, tuple) and len(v) <= 16 and all(isinstance(x, _SIMPLE) for x in v):
        return ("tuple", v)
    return ("id", id(v))


def _fn_key(fn):
    """(hashable key, objects whose identity the key relies on), or None: not cacheable."""
    if inspect.ismethod(fn):
        owner = fn.__self__
        attrs = getattr(owner, "__dict__", None)
        if attrs is None:
            return None
        fp = tuple(sorted((k, _value_print(v)) for k, v in attrs.items()
                          if k not in _SKIP_ATTRS))
        return ("method", id(fn.__func__), id(owner), fp), (fn.__func__, owner)
    if inspect.isfunction(fn):
        cells = tuple(_value_print(c.cell_contents) if _cell_full(c) else ("empty",)
                      for c in (fn.__closure__ or ()))
        defaults = tuple(_value_print(d) for d in (fn.__defaults__ or ()))
        kw = tuple(sorted((k, _value_print(v)) for k, v in (fn.__kwdefaults__ or {}).items()))
        return ("function", id(fn), cells, defaults, kw), (fn,)
    return None


def _cell_full(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def _call_key(call, items=None):
    edge = _fn_key(call.edge_fn)
    if edge is None:
        return None
    update = _fn_key(call.update) if call.update is not None else (("none",), ())
    if update is None:
        return None
    gt = call.graph.type(symbolic=True)
    # the GraphType as plain values: looking the key up compares it with the stored key, and
    # dataclass equality (GraphType, Dim) runs in Python on every warm call
    gtype = (gt.kind, gt.num_src is gt.num_dst, gt.index_dtype.name, gt.coord_dims)
    fields = tuple((role, name, _type_key(v)) for role, name, v in
                   (call.field_items() if items is None else items))
    params = tuple((k, _type_key(v)) for k, v in call.param_items())
    key = (edge[0], update[0], id(call.reducer), call.reduce_by, gtype, fields, params)
    return key, edge[1] + update[1] + (call.reducer,)


def _type_key(v):
    """What the staged program depends on in an argument: its type. numpy arrays answer
    from their shape and dtype directly (leaf_aval maps the dtype by name, ~10 µs)."""
    if type(v) is np.ndarray:
        return ("ndarray", v.shape, v.dtype)
    if hasattr(v, "__dlpack__") and hasattr(v, "dtype") and not hasattr(v, "__tiga_type__"):
        return ("foreign", type(v).__name__, tuple(v.shape), str(v.dtype))   # torch tensors
    return leaf_aval(v)


def _sizes_ok(call, items) -> bool:
    """Every field's leading axis matches its role's size (else check_sizes says why)."""
    g = call.graph
    want = {"src": g.num_src, "dst": g.num_dst, "edge": g.num_edges}
    for role, _, v in items:
        shape = v.shape if type(v) is np.ndarray else leaf_aval(v).shape
        if not shape or shape[0] != want[role]:
            return False
    return True


def _alive(refs: tuple, objs: tuple) -> bool:
    """The objects whose ids form the key are still the same objects (ids get reused)."""
    return len(refs) == len(objs) and all(r() is o for r, o in zip(refs, objs))


def _ref(obj):
    try:
        return weakref.ref(obj)
    except TypeError:            # not weak-referenceable: hold it (bounded by MAX_ENTRIES)
        return lambda obj=obj: obj


def staged_program(call) -> tuple:
    """`call.staged_program()`, reused when this call's signature was staged before."""
    items = call.field_items()     # (sorted per call: computed once here)
    try:
        if not hasattr(call.graph, "resolve_csr"):
            raise TypeError
        found = _call_key(call, items)
    except (TypeError, AttributeError, ValueError):   # not a relation / unhashable: no reuse
        found = None
    if found is None:
        STATS["uncacheable"] += 1
        return _staged_and_rewritten(call)
    key, objs = found
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is not None and _alive(entry[1], objs):
            _ENTRIES.move_to_end(key)
            STATS["hits"] += 1
            program = entry[0]
        else:
            program = None
    if program is not None:
        if not _sizes_ok(call, items):
            call.check_sizes(call.graph.type())   # raises the ShapeError naming the field
        return program, [call.graph] + [leaf_value(v) for _, _, v in items] + \
            [leaf_value(v) for _, v in call.param_items()]
    program, args = _staged_and_rewritten(call)
    with _LOCK:
        STATS["misses"] += 1
        if len(args) == len(call.values()):      # no captured arrays (they lead the args)
            _ENTRIES[key] = (program, tuple(_ref(o) for o in objs))
            _ENTRIES.move_to_end(key)
            while len(_ENTRIES) > MAX_ENTRIES:
                _ENTRIES.popitem(last=False)
    return program, args


def _staged_and_rewritten(call) -> tuple:
    """The staged call after the exact edge-loop rewrites (trace/rewrites), once per entry."""
    program, args = call.staged_program()
    return hoist_linear_projections(program)[0], args


def reuse(call, extra_key, build) -> tuple:
    """(payload, held objects): what `build()` staged for this call's signature (plus
    `extra_key`), built once. For callers that stage differently from `staged_program` (the
    torch bridge caches its rewritten program and the parameters it captured).

    `build()` returns (payload, held): `held` are the objects the payload reads by identity
    (captured parameters), kept as weak references; the entry dies with any of them. `held`
    None means the staging cannot be reused (it captured values made during the trace).
    """
    try:
        found = _call_key(call) if hasattr(call.graph, "resolve_csr") else None
    except (TypeError, AttributeError, ValueError):
        found = None
    if found is None:
        STATS["uncacheable"] += 1
        return build()
    key, objs = found
    key = ("reuse", key, extra_key)
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is not None and _alive(entry[1], objs):
            held = tuple(r() for r in entry[3])
            if all(h is not None for h in held):
                _ENTRIES.move_to_end(key)
                STATS["hits"] += 1
                return entry[2], held
    payload, held = build()
    with _LOCK:
        STATS["misses"] += 1
        if held is not None:
            _ENTRIES[key] = (None, tuple(_ref(o) for o in objs), payload,
                             tuple(weakref.ref(h) for h in held))
            _ENTRIES.move_to_end(key)
            while len(_ENTRIES) > MAX_ENTRIES:
                _ENTRIES.popitem(last=False)
    return payload, held


def clear() -> None:
    with _LOCK:
        _ENTRIES.clear()
