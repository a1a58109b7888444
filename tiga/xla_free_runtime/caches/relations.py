"""runtime: one weak per-relation cache: what the runtime derives from a relation and keeps
while the relation lives (page tasks and windows of a store, a generated relation's cell
directory and degree counts, the kNN ids a tiled scan selected, walk arrays, row chunks,
kernels bound to it).

A relation's arrays are frozen, so what is derived from them stays valid as long as the
relation does; it is kept here, keyed by the relation object, and never written on the relation
(`Graph.params` is what the user built it with). Dropped with the relation.
"""
from __future__ import annotations

import threading
import weakref

_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # relation -> {key: value}
_LOCK = threading.Lock()


def entry_of(memos: weakref.WeakKeyDictionary, key) -> dict:
    """`memos[key]`, a dict made on first use (under one lock: WeakKeyDictionary inserts are
    not atomic); the weak caches of the runtime share it."""
    found = memos.get(key)
    if found is None:
        with _LOCK:
            found = memos.get(key)
            if found is None:
                found = memos[key] = {}
    return found


def memo(graph) -> dict:
    """The runtime's dict of what it derived from `graph` (made on first use)."""
    return entry_of(_MEMOS, graph)


def kept_in(entry: dict, name: str) -> dict:
    """The dict `name` in a weak cache's `entry` (made on first use, under the same lock)."""
    found = entry.get(name)
    if found is None:
        with _LOCK:
            found = entry.setdefault(name, {})
    return found


def kept(graph, name: str) -> dict:
    """The dict `name` in `graph`'s entry ("walks": its walk arrays and tables, "chunks": row
    chunks per partition, "bound": kernels bound to it, ...)."""
    return kept_in(memo(graph), name)


__all__ = ["memo", "entry_of", "kept_in", "kept"]
