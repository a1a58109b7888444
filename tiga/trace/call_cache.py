"""trace: staged programs of concrete message-passing calls, reused per call signature.

Staging a `MessagePassing.__call__` / `tg.propagate` call traces the edge (and update)
function again, which costs ~0.1 ms per call. A staged program is symbolic in the graph
sizes, so the same program serves every later call with the same signature:

- the edge/update functions (a bound method: its function and its owner object, plus a
  fingerprint of the owner's attributes; a plain function: the function object, plus its
  closure cells and defaults), the reducer by value (a fresh `tg.sum()` per call is the
  same reducer; a user `tg.Reducer` by its name, identity, flags and functions),
- the relation's symbolic type (kind, index dtype), every field's role, name and type,
  every keyword parameter's name and type.

A plain call behaves like Python: what the trace read outside its arguments (module
globals, class and nested attributes, dict entries with constant keys, closure cells; see
trace/guards.py) is kept with the entry as guards and re-read on reuse; a changed value
retraces. Python numbers count by value, other objects by identity. A trace that captured
arrays (weights closed over by the edge function) is not reused: new array values must
reach the program as new captures.
"""
from __future__ import annotations

import inspect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..core.graph import Graph
from ..core.program import GraphProgram
from . import guards as guards_mod
from .staging import leaf_aval, leaf_value

MAX_ENTRIES = 128

_LOCK = threading.Lock()
_ENTRIES: OrderedDict = OrderedDict()     # key -> (liveness refs, guards, payload...)
STATS = {"hits": 0, "misses": 0, "uncacheable": 0, "guard_failures": 0}
# [n]: bumped by every store (an entry added, replaced or evicted) and by clear(); a layer's
# warm-call memo (warm_calls.py) made at generation n is valid while it stays n
GENERATION = [0]
# [n]: bumped by clear() only; what the bridge keeps of a guard-free built-in call (the sum
# of summed.py) stays valid while it stays n, however many other entries come and go
CLEARS = [0]


def _value_print(v):
    fingerprint = getattr(type(v), "__tiga_fingerprint__", None)
    if fingerprint is not None:   # e.g. tg.nn.trace modules: layer structure, parameter ids
        return ("fingerprint", id(v), fingerprint(v))
    token = guards_mod.value_token(v)
    return ("id", id(v)) if token is None else token


def _fn_key(fn):
    """(hashable key, objects whose identity the key relies on), or None: not cacheable."""
    if inspect.ismethod(fn):
        owner = fn.__self__
        attrs = getattr(owner, "__dict__", None)
        if attrs is None:
            return None
        held = [fn.__func__, owner]
        fp = tuple(sorted((k, _held_print(v, held)) for k, v in attrs.items()))
        return ("method", id(fn.__func__), id(owner), fp), tuple(held)
    if inspect.isfunction(fn):
        code, glob = fn.__code__, fn.__globals__
        held = [code, glob]
        cells = tuple(_held_print(c.cell_contents, held) if _cell_full(c) else ("empty",)
                      for c in (fn.__closure__ or ()))
        defaults = tuple(_held_print(d, held) for d in (fn.__defaults__ or ()))
        kw = tuple(sorted((k, _held_print(v, held))
                          for k, v in (fn.__kwdefaults__ or {}).items()))
        # keyed by the code, not the function object: `tg.propagate(g, lambda s, d, e: ...)`
        # makes a new function per call from the same code, and must not retrace each time
        # (closure cells and defaults are part of the key; globals are guarded)
        return ("function", id(code), id(glob), cells, defaults, kw), tuple(held)
    return None


def _held_print(v, held: list):
    """`_value_print(v)`, adding `v` to `held` when the print is its id: an entry keyed by
    an id must also check that the object is still the one it was (a new object may reuse
    a dead one's id: an eager loop's body lambda rebuilt per call reused a stale trace
    holding another relation, and MPI ranks, whose ids differ, then ran different
    programs)."""
    found = _value_print(v)
    if found[0] in ("id", "fingerprint"):
        held.append(v)
    return found


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
    gtype = _graph_key(call.graph)
    fields = tuple((role, name, type_key(v)) for role, name, v in
                   (call.field_items() if items is None else items))
    params = tuple((k, type_key(v)) for k, v in call.param_items())
    reducer = _reducer_key(call.reducer)
    if reducer is None:
        return None
    key = (edge[0], update[0], reducer[0], call.reduce_by, gtype, fields, params)
    return key, edge[1] + update[1] + reducer[1]


def _graph_key(graph) -> tuple:
    """The relation's symbolic type as plain values: looking the key up compares it with the
    stored key, and dataclass equality (GraphType, Dim) runs in Python on every warm call.
    A tg.Graph's type is fixed when it is built, so it is read once per relation."""
    found = _GRAPH_KEYS.get(id(graph)) if type(graph) is Graph else None
    if found is not None and found[0]() is graph:
        return found[1]
    gt = graph.type(symbolic=True)
    key = (gt.kind, gt.num_src is gt.num_dst, gt.index_dtype.name, gt.coord_dims)
    if type(graph) is Graph:
        if len(_GRAPH_KEYS) > 1024:
            _GRAPH_KEYS.clear()
        _GRAPH_KEYS[id(graph)] = (weakref.ref(graph), key)
    return key


_GRAPH_KEYS: dict = {}    # id(tg.Graph) -> (weak graph, _graph_key): a memo of its type


def _reducer_key(r):
    """(key, objects the key relies on) of a reducer, by value: built-ins by name (and
    pruning threshold), user reducers by name, identity, flags and their functions."""
    if r.builtin:   # (with its empty= value and arg-reducer ids)
        return r._key(), ()
    if r.regions is not None:            # already traced: its regions are structural
        return r._key(), ()
    fns = [(_fn_key(f) if f is not None else (("none",), ())) for f in
           (r.lift, r.combine, r.finalize)]
    if any(f is None for f in fns):
        return None
    held = tuple(o for f in fns for o in f[1])
    identity = guards_mod.value_token(r.identity)
    if identity is None:     # an array identity: by object
        identity, held = ("id", id(r.identity)), held + (r.identity,)
    key = ("user", r.name, identity, r.commutative, r.associative, tuple(f[0] for f in fns))
    return key, held


def _guarded_fns(call) -> list:
    """The user functions a call traces: what they read is guarded."""
    r = call.reducer
    fns = [call.edge_fn, call.update]
    if not r.builtin and r.regions is None:
        fns += [r.lift, r.combine, r.finalize]
    return fns


def type_key(v):
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
    if len(refs) != len(objs):
        return False
    for r, o in zip(refs, objs):
        if r() is not o:
            return False
    return True


_ref = guards_mod.ref


def _lookup(key, objs):
    """The live entry for `key` whose guards hold, or None (a failed guard: retrace)."""
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is None or not _alive(entry[0], objs):
            return None
        if not entry[1]:     # nothing read outside the arguments: no guard to re-read
            _ENTRIES.move_to_end(key)
            STATS["hits"] += 1
            return entry
    if not guards_mod.check(entry[1]):
        STATS["guard_failures"] += 1
        return None
    with _LOCK:
        if key in _ENTRIES:
            _ENTRIES.move_to_end(key)
        STATS["hits"] += 1
    return entry


def _store(key, objs, guards, *payload) -> None:
    with _LOCK:
        GENERATION[0] += 1
        _ENTRIES[key] = (tuple(_ref(o) for o in objs), guards) + payload
        _ENTRIES.move_to_end(key)
        while len(_ENTRIES) > MAX_ENTRIES:
            _ENTRIES.popitem(last=False)


def staged_program(call, optimize: Callable[[GraphProgram], GraphProgram]) -> tuple:
    """`optimize(call.staged_program())`, reused when this call's signature was staged
    before and what the trace read is unchanged. `optimize` (GraphProgram -> GraphProgram)
    is the facade's program passes (tiga/opt, a layer below this one); the cache holds its
    result, so every caller passes the same one."""
    items = call.field_items()     # (sorted per call: computed once here)
    try:
        if not hasattr(call.graph, "resolve_csr"):
            raise TypeError
        found = _call_key(call, items)
    except (TypeError, AttributeError, ValueError):   # not a relation / unhashable: no reuse
        found = None
    if found is None:
        STATS["uncacheable"] += 1
        return _staged_and_rewritten(call, optimize)
    key, objs = found
    generation = GENERATION[0]
    entry = _lookup(key, objs)
    if entry is not None:
        if not _sizes_ok(call, items):
            call.check_sizes(call.graph.type())   # raises the ShapeError naming the field
        call.cached = (entry[1], generation)
        return (entry[2], [call.graph] + [leaf_value(v) for _, _, v in items] +
            [leaf_value(v) for _, v in call.param_items()])
    guards = guards_mod.collect(_guarded_fns(call))   # the values the trace will read
    program, args = _staged_and_rewritten(call, optimize)
    STATS["misses"] += 1
    if len(args) == len(call.values()):      # no captured arrays (they lead the args)
        _store(key, objs, guards, program)
        call.cached = (guards, GENERATION[0])
    return program, args


def _staged_and_rewritten(call, optimize) -> tuple:
    """The staged call after the program passes, once per entry."""
    program, args = call.staged_program()
    return optimize(program), args


def reuse(call, extra_key, build) -> tuple:
    """(payload, held objects): what `build()` staged for this call's signature (plus
    `extra_key`), built once. For callers that stage differently from `staged_program` (the
    torch bridge caches its rewritten program and the parameters it captured).

    `build()` returns (payload, held): `held` are the objects the payload reads by identity
    (captured parameters), kept as weak references; the entry dies with any of them. `held`
    None means the staging cannot be reused (it captured values made during the trace).
    Like `staged_program`, the entry is guarded by what the functions read.
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
    entry = _lookup(key, objs)
    if entry is not None:
        held = tuple(r() for r in entry[3])
        if all(h is not None for h in held):
            return entry[2], held
    guards = guards_mod.collect(_guarded_fns(call))
    payload, held = build()
    STATS["misses"] += 1
    if held is not None:
        _store(key, objs, guards, payload, tuple(weakref.ref(h) for h in held))
    return payload, held


def clear() -> None:
    with _LOCK:
        GENERATION[0] += 1
        CLEARS[0] += 1
        _ENTRIES.clear()


def reuse_transform(fn, extra_key, build, reads=None):
    """What `build(guards)` made for the function `fn` of a transformation (tg.grad,
    tg.value_and_grad, tg.vjp) at `extra_key` (its options and input types), built once
    while what `fn` read is unchanged. The cache outlives the transformation object
    (`tg.grad(f)(x)` in a loop hits) and dies with `fn`.

    `build(guards)` returns (payload, reusable): the guards tell it which objects the
    trace may keep by identity; `reusable` False keeps the payload out of the cache.
    `reads`: the user functions whose reads guard the entry, when `fn` is Tiga's own wrapper
    of them (an eager loop's staging); default `[fn]`.
    """
    try:
        found = _fn_key(fn)
        key = None if found is None else ("transform", found[0], extra_key)
        hash(key)
    except (TypeError, ValueError):
        found = None
    if found is None:
        STATS["uncacheable"] += 1
        return build(())[0]
    entry = _lookup(key, found[1])
    if entry is not None:
        return entry[2]
    guards = guards_mod.collect([fn] if reads is None else list(reads))
    payload, reusable = build(guards)
    STATS["misses"] += 1
    if reusable:
        _store(key, found[1], guards, payload)
    return payload
