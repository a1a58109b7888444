"""runtime: tg.memory, the bytes Tiga's storage layer allocates per tier, budgets and LRU.

Counted are the buffers the storage layer itself allocates: host copies made by `to`,
`restore`, `load` and row slices of disk tensors, spill files and disk results, and the
page buffers and results of paged runs. Arrays the caller passes in (tg.asarray of a numpy
array is zero-copy) are the caller's memory and are not counted. An allocation is charged
to every active scope and checked against the innermost budget for its tier.
"""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

from ...core.errors import StorageError
from . import scope as sc

_LOCK = threading.RLock()     # a prefetch thread charges page buffers beside the caller


class Charge:
    """Bytes held on one tier, charged to the scopes active when they were allocated."""

    __slots__ = ("tier", "nbytes", "scopes", "key", "__weakref__")

    def __init__(self, tier: str, nbytes: int, scopes: tuple):
        self.tier, self.nbytes, self.scopes, self.key = tier, nbytes, scopes, None

    def credit(self) -> None:
        """Give the bytes back (idempotent)."""
        with _LOCK:
            if self.nbytes < 0:
                return
            for s in self.scopes:
                s.used[self.tier] -= self.nbytes
                if self.key is not None:
                    s.lru.pop(self.key, None)
            self.nbytes = -1


def draw(reserved: Charge, nbytes: int, what: str, knob: str | None = None) -> Charge:
    """Charge `nbytes`, taking what it can from the reservation `reserved` (bytes charged
    ahead for allocations to come; what it gives is no longer reserved): the bytes are
    counted once, and an allocation within its reservation never fails for lack of room."""
    with _LOCK:
        take = max(0, min(int(nbytes), reserved.nbytes))
        if take:
            for s in reserved.scopes:
                s.used[reserved.tier] -= take
            reserved.nbytes -= take
        return _charge(reserved.tier, int(nbytes), what, knob)


def fmt_bytes(n: int) -> str:
    """`n` bytes for people: "1.50 MiB (1572864 bytes)"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"


def charge(tier: str, nbytes: int, what: str = "allocation",
           knob: str | None = None) -> Charge:
    """Charge `nbytes` on `tier` before allocating them: over the innermost budget, idle
    host tensors are spilled first (eviction='lru'), else tg.StorageError naming the knob
    that fixes it. `knob="page_rows"`: the request grows with the scope's page_rows (page
    buffers), so a smaller page_rows is the first fix."""
    with _LOCK:
        return _charge(tier, int(nbytes), what, knob)


def _charge(tier: str, nbytes: int, what: str, knob: str | None = None) -> Charge:
    owner = sc.budget_scope(tier)
    if owner is not None and owner.used[tier] + nbytes > owner.budgets[tier]:
        if tier == "host" and sc.eviction() == "lru":
            _evict(owner, owner.used[tier] + nbytes - owner.budgets[tier])
        if owner.used[tier] + nbytes > owner.budgets[tier]:
            raise StorageError(
                f"{tier} budget {fmt_bytes(owner.budgets[tier])} cannot hold a request of "
                f"{fmt_bytes(nbytes)} for {what}: {fmt_bytes(owner.used[tier])} already "
                f"allocated in the scope that sets it; " + _advice(tier, nbytes, owner, knob))
    scopes = sc.chain()
    for s in scopes:
        s.used[tier] += nbytes
        s.peak[tier] = max(s.peak[tier], s.used[tier])
    return Charge(tier, nbytes, scopes)


_OTHER_TIER = {"host": "keep the value on the 'disk' tier (t.to('disk') or t.spill(); "
                       "programs read disk tensors page by page)",
               "device": "keep the value on the 'host' tier",
               "disk": "spill under a scope whose disk budget is larger"}


def _advice(tier: str, nbytes: int, owner, knob: str | None) -> str:
    """The knob that fixes an over-budget request, most specific first: a smaller
    page_rows for page-sized requests, eviction='lru' only where the idle host tensors it
    would spill cover the shortfall, else a larger budget or another tier."""
    short = owner.used[tier] + nbytes - owner.budgets[tier]
    raise_it = f"raise budgets[{tier!r}] by at least {fmt_bytes(short)}"
    if knob == "page_rows":
        return (f"a smaller page_rows (tg.scope(page_rows=...), now {sc.page_rows()}) makes "
                f"each page's buffers smaller, or {raise_it}")
    if tier == "host" and sc.eviction() != "lru" and nbytes <= owner.budgets[tier]:
        idle = _idle_bytes(owner)
        if idle >= short:
            return (f"eviction='lru' would spill {fmt_bytes(idle)} of idle host tensors "
                    f"first, or {raise_it}")
    return f"{raise_it}, or {_OTHER_TIER[tier]}"


def _idle_bytes(owner) -> int:
    total = 0
    for ref in list(owner.lru.values()):
        t = ref()
        if t is not None and _idle(t) and t._charge is not None:
            total += max(t._charge.nbytes, 0)
    return total


def track(tensor, ch: Charge) -> None:
    """Make a charged host tensor an eviction candidate (most recently used)."""
    ch.key = id(tensor)
    ref = weakref.ref(tensor)
    for s in ch.scopes:
        s.lru[ch.key] = ref


def touch(ch: Charge) -> None:
    if ch.key is not None:
        for s in ch.scopes:
            if ch.key in s.lru:
                s.lru.move_to_end(ch.key)


def _idle(tensor) -> bool:
    """Nobody but the tensor holds its host buffer (a view handed out keeps it alive, so
    spilling it would free nothing)."""
    st = tensor._storage
    arr = getattr(st, "_array", None)
    return (st.tier == "host" and arr is not None and _owns(arr) and
        sys.getrefcount(arr) <= 3 and not getattr(tensor, "_pins", 0))


def _owns(arr) -> bool:
    """The array owns its buffer, or is the one view of an aligned byte buffer that only
    it references (files.aligned_empty)."""
    base = arr.base
    return base is None or (type(base) is np.ndarray and base.base is None and
                            base.dtype == np.uint8 and sys.getrefcount(base) <= 3)


def _evict(owner, need: int) -> None:
    freed = 0
    for key, ref in list(owner.lru.items()):
        if freed >= need:
            return
        t = ref()
        if t is None:
            owner.lru.pop(key, None)
            continue
        if _idle(t):
            before = owner.used["host"]
            t.spill()
            freed += before - owner.used["host"]


def report() -> dict:
    """Per tier {"bytes", "peak", "budget"}: what Tiga allocated in the current scope
    (live bytes, their high-water mark, the budget in force; None = unlimited). Not RSS."""
    return sc.report_of(sc.current())


# charge, draw, Charge and fmt_bytes are the runtime's (reachable, not listed)
__all__ = ["report"]


def __dir__() -> list[str]:
    # (this module is tg.store / tg.memory: its listing is the public API, not its helpers)
    return sorted(__all__)
