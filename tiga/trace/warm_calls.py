"""trace: a MessagePassing layer's warm call, validated from its arguments without restaging.

The ordinary path of a layer call builds a PropagateCall (copying and checking its fields),
computes the call cache's key (the edge method's owner fingerprint, every operand's type),
looks it up, re-reads its guards and lists the program's arguments: about 15 us of a warm
call's host time. A layer that ran a signature on a prepared launch list remembers it here
(`remember`, after that call), and its next call with the same signature goes straight to the
program (`run`). The memo answers exactly when the call cache would return the same program:

- the same layer object, whose `edge` / `update` are the same functions and whose attributes
  are the same objects (the owner fingerprint; a reducer attribute also by value, and no
  attribute that fingerprints itself, a tg.nn trace module: those always take the full path),
- the same built-in reducer object with the same key,
- the same tg.Graph object (its type is fixed when it is built), with the fields, by role
  and name, numpy arrays of the same shapes and dtypes, the keyword operands of the same
  names and types,
- the entry's guards (what the trace read outside its arguments) still hold, and the call
  cache has stored or cleared nothing since (its generation).

Anything else (another relation, a field of another dtype, a torch tensor, a stencil field in
lattice shape, a generated relation, an arg-reducer) misses and the full path runs, which
remembers the new signature when the runtime prepared it. The memo holds the layer and the
relation weakly, one signature per layer.
"""
from __future__ import annotations

import operator
import threading
import weakref
from types import MethodType

import numpy as np

from ..core.graph import Graph
from ..core.reducers import Reducer
from . import guards as guards_mod
from .call_cache import _LOCK as _CACHE_LOCK
from .call_cache import GENERATION, STATS
from .staging import leaf_value

ROLE_ORDER = ("src", "dst", "edge")
_SCALARS = (float, int, bool)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _Memo:
    """One layer's last prepared signature (immutable once built; replaced whole)."""

    __slots__ = ("layer", "edge", "update", "reducer", "reducer_key", "keys", "values",
                 "reducers", "graph", "counts", "fields", "params", "guards", "generation",
                 "program")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


_MEMOS: dict = {}          # id(layer) -> _Memo, dropped with the layer
_LOCK = threading.Lock()
MAX_MEMOS = 4096


def remember(call, program) -> None:
    """After `call` ran `program` on a prepared launch list: memo its signature for its layer
    (nothing when the call is not a plain layer call of a cached entry, see the docstring)."""
    layer, cached = call.layer, call.cached
    if (layer is None or cached is None or not call.plain or call.lattice is not None or
            type(call.graph) is not Graph or not call.reducer.builtin):
        return
    edge, update = call.edge_fn, call.update
    if (type(edge) is not MethodType or edge.__self__ is not layer or update is not None and
             (type(update) is not MethodType or update.__self__ is not layer)):
        return
    attrs = getattr(layer, "__dict__", None)
    if type(attrs) is not dict:
        return
    values = tuple(attrs.values())
    if any(getattr(type(v), "__tiga_fingerprint__", None) is not None for v in values):
        return
    roles = _roles(call.fields)
    params = _params(call.param_items())
    if roles is None or params is None:
        return
    try:
        ref = weakref.ref(layer, _forget(id(layer)))
        graph = weakref.ref(call.graph)
    except TypeError:
        return
    memo = _Memo(layer=ref, edge=edge.__func__,
                 update=None if update is None else update.__func__, reducer=call.reducer,
                 reducer_key=call.reducer._key(), keys=tuple(attrs), values=values,
                 reducers=tuple((i, v._key()) for i, v in enumerate(values)
                                if isinstance(v, Reducer)),
                 graph=graph, counts=tuple(len(r) for r in roles),
                 fields=tuple((k, name, shape, dtype) for k, r in enumerate(roles)
                              for name, shape, dtype in r),
                 params=params, guards=cached[0],
                 generation=cached[1], program=program)
    with _LOCK:
        if len(_MEMOS) >= MAX_MEMOS:
            _MEMOS.clear()
        _MEMOS[id(layer)] = memo


def _roles(fields: dict) -> tuple | None:
    """Per role (ROLE_ORDER), ((name, shape, dtype), ...) in name order; None: a field is
    not a numpy array (those calls take the full path)."""
    out = []
    for role in ROLE_ORDER:
        items = []
        for name in sorted(fields[role]):
            v = fields[role][name]
            if type(v) is not np.ndarray:
                return None
            items.append((name, v.shape, v.dtype))
        out.append(tuple(items))
    return tuple(out)


def _params(items) -> tuple | None:
    """((name, type, shape or None, dtype), ...) of the keyword operands in name order."""
    out = []
    for name, v in items:
        if type(v) is np.ndarray:
            out.append((name, np.ndarray, v.shape, v.dtype))
        elif type(v) in _SCALARS:
            out.append((name, type(v), None, leaf_value(v).dtype))
        else:
            return None
    return tuple(out)


def _forget(key: int):
    def dead(ref) -> None:    # (only the dead layer's memo: the id may be reused already)
        with _LOCK:
            memo = _MEMOS.get(key)
            if memo is not None and memo.layer is ref:
                del _MEMOS[key]
    return dead


def run(layer, graph, edge_fn, update, reducer, src, dst, edge, params: dict, *, runner):
    """`runner(program, args)` (the runtime's prepared launch list: the call's result, or
    None when it has none for these arguments) when the layer's memo matches (one call
    cache hit counted), else None: take the full path."""
    memo = _MEMOS.get(id(layer))
    if (memo is None or memo.generation != GENERATION[0] or
            memo.graph() is not graph or memo.layer() is not layer or
            memo.reducer is not reducer or type(edge_fn) is not MethodType or
            edge_fn.__func__ is not memo.edge):
        return None
    if update is None:
        if memo.update is not None:
            return None
    elif type(update) is not MethodType or update.__func__ is not memo.update:
        return None
    args = _args(memo, graph, src, dst, edge, params)
    if (args is None or not _same_owner(memo, layer) or reducer._key() != memo.reducer_key or
            memo.guards and not guards_mod.check(memo.guards)):
        return None
    outs = runner(memo.program, args)
    if outs is not None:
        with _CACHE_LOCK:
            STATS["hits"] += 1
    return outs


def _same_owner(memo: _Memo, layer) -> bool:
    """The layer's attributes are the objects the memo's key fingerprinted (a reducer among
    them also by value)."""
    attrs = layer.__dict__
    if len(attrs) != len(memo.values):
        return False
    if attrs and (not all(map(operator.is_, attrs.values(), memo.values)) or
                  tuple(attrs) != memo.keys):
        return False
    return (all(memo.values[i]._key() == key for i, key in memo.reducers)
        if memo.reducers else True)


def _args(memo: _Memo, graph, src, dst, edge, params: dict) -> list | None:
    """The program's arguments (relation, fields by role and name, keyword operands), or
    None when a field or operand differs from the memo's types."""
    # each role a dict of the memo's number of fields, or None for none (anything else, a
    # Mapping that is not a dict included, takes the full path)
    n_src, n_dst, n_edge = memo.counts
    if ((len(src) != n_src if type(src) is dict else src is not None or n_src) or
             (len(dst) != n_dst if type(dst) is dict else dst is not None or n_dst) or
             (len(edge) != n_edge if type(edge) is dict else edge is not None or n_edge)):
        return None
    given = (src, dst, edge)
    args = [graph]
    for role, name, shape, dtype in memo.fields:
        v = given[role].get(name)
        if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
            return None
        args.append(v)
    if len(params) != len(memo.params):
        return None
    for name, kind, shape, dtype in memo.params:
        v = params.get(name)
        if type(v) is not kind:
            return None
        if kind is np.ndarray:
            if v.shape != shape or v.dtype != dtype:
                return None
            args.append(v)
        elif kind is int and not _INT64[0] <= v <= _INT64[1]:
            return None
        else:
            args.append(np.asarray(v, dtype))
    return args


__all__ = ["remember", "run"]
