"""runtime: one weak per-relation cache: what the runtime derives from a relation and keeps
while the relation lives (page tasks and windows of a store, a generated relation's cell
directory and degree counts, the kNN ids a tiled scan selected).

A relation's arrays are frozen, so what is derived from them stays valid as long as the
relation does; it is kept here, keyed by the relation object, and never written on the relation
(`Graph.params` is what the user built it with). Dropped with the relation.
"""
from __future__ import annotations

import threading
import weakref

_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # relation -> {key: value}
_LOCK = threading.Lock()


def memo(graph) -> dict:
    """The runtime's dict of what it derived from `graph` (made on first use)."""
    found = _MEMOS.get(graph)
    if found is None:
        with _LOCK:
            found = _MEMOS.get(graph)
            if found is None:
                found = _MEMOS[graph] = {}
    return found


__all__ = ["memo"]
