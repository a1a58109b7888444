"""runtime: one weak per-equation cache: what the runtime derives from an equation's structure
and keeps while the equation lives (its Kernel ops per relation type and pool size, its
kernels' cache keys and schedules, its routes per relation, its one-page Task module, its
swapped form), keyed by the equation object.

Equations are immutable and come from the call cache, so what is derived from one stays
valid as long as it does; each consumer keeps its entries under its own name in the
equation's dict. Dropped with the equation.
"""
from __future__ import annotations

import threading
import weakref

from .relations import entry_of, kept_in

_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # eqn -> {name: value}
_LOCK = threading.Lock()


def memo(eqn) -> dict:
    """The runtime's dict of what it derived from `eqn` (made on first use)."""
    return entry_of(_MEMOS, eqn)


def kept(eqn, name: str) -> dict:
    """The dict `name` in `eqn`'s entry (made on first use)."""
    return kept_in(memo(eqn), name)


def entries(name: str) -> list:
    """[(eqn, its dict `name`)] of every live equation that has one (tests read them)."""
    with _LOCK:
        return [(e, m[name]) for e, m in list(_MEMOS.items()) if name in m]


def forget() -> None:
    """Drop every entry (what a fresh process has: the next call derives them anew)."""
    with _LOCK:
        _MEMOS.clear()


__all__ = ["memo", "kept", "entries", "forget"]
