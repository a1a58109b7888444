"""runtime: one weak per-program cache: what the runtime derives from a program's structure
and keeps while the program lives (its Task walks per binding, a warm call's prepared launch
list, the rules a walk runs with, a distributed program's facts), keyed by the program's
identity.

Identity, not equality: equal programs hold different Vars, and a walk's steps hold this
one's. Programs come from the call cache, so a warm call finds here what its first call
derived; each consumer keeps its entries under its own name. Dropped with the program.
"""
from __future__ import annotations

import threading
import weakref

_MEMOS: dict = {}     # id(program) -> (weak program, {name: value})
_LOCK = threading.Lock()


def memo(program) -> dict:
    """The runtime's dict of what it derived from `program` (made on first use)."""
    entry = _MEMOS.get(id(program))
    if entry is not None and entry[0]() is program:
        return entry[1]
    with _LOCK:
        entry = _MEMOS.get(id(program))
        if entry is None or entry[0]() is not program:
            key = id(program)
            entry = _MEMOS[key] = (weakref.ref(program, lambda _, key=key: _drop(key)), {})
    return entry[1]


def _drop(key: int) -> None:
    # (a dead program's id may already name a new program's entry: drop only a dead one)
    entry = _MEMOS.get(key)
    if entry is not None and entry[0]() is None:
        _MEMOS.pop(key, None)


def entries(name: str) -> list:
    """[(program, its value `name`)] of every live program that has one (tests read them)."""
    with _LOCK:
        found = [(ref(), m[name]) for ref, m in list(_MEMOS.values()) if name in m]
    return [(p, v) for p, v in found if p is not None]


def forget() -> None:
    """Drop every entry (what a fresh process has: the next call derives them anew)."""
    with _LOCK:
        _MEMOS.clear()


__all__ = ["memo", "entries", "forget"]
