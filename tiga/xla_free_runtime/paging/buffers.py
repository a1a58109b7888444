"""runtime: host buffers of the pages in flight of a paged run, reused page after page.

Fresh memory costs a page fault per 4 KiB on first touch (for a page of 65536 rows of 32
float32 features, as much as reading them); so a run keeps a few buffer sets (one per page
in flight: queued, computing, loading) and every page reads into a free set. Each buffer is
charged to the host budget while the run holds it; a new set is only made, and a free set
too small for a page only grown, while the budget has room for it, else the loader waits
for a set to come back. A set's buffers are made as its page loads, so one set grows at a
time: the next is only considered once that page has settled its buffers (`settled`), its
bytes counted in the budget (two loaders growing sets at once would both count on the same
free bytes).
"""
from __future__ import annotations

import threading

import numpy as np

from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers.disk import aligned_empty


def with_slack(n: int) -> int:
    """`n` and an eighth more: what a buffer for `n` rows is made with, so pages of varying
    size settle on one allocation."""
    return n + n // 8


class PageSet:
    """One page's buffers by name; `get` hands out the leading rows of a buffer, growing it
    (with slack, so pages of varying size settle on one allocation) when too small."""

    def __init__(self):
        self.bufs: dict = {}         # name -> (array, its charge)

    def get(self, name: str, n: int, row_shape: tuple, dtype, what: str) -> np.ndarray:
        dtype = np.dtype(dtype)
        held = self.bufs.get(name)
        if held is not None:
            arr, ch = held
            if arr.shape[0] >= n and arr.dtype == dtype and arr.shape[1:] == tuple(row_shape):
                return arr[:n]
            ch.credit()
            del self.bufs[name]
        cap = max(1, with_slack(n))
        row = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
        ch = memory.charge("host", cap * row, what, knob="page_rows")
        arr = aligned_empty((cap,) + tuple(row_shape), dtype, 4096)   # (O_DIRECT writes)
        self.bufs[name] = (arr, ch)
        return arr[:n]

    def held(self) -> int:
        return sum(arr.nbytes for arr, _ in self.bufs.values())

    def credit(self) -> None:
        for _, ch in self.bufs.values():
            ch.credit()
        self.bufs.clear()


class PageBuffers:
    """At most `sets` buffer sets; acquire() blocks while none is free and the budget
    leaves no room for another page."""

    def __init__(self, sets: int):
        self.max_sets = sets
        self.sets: list = []
        self.free: list = []
        self.growing = None        # the new set whose first page is making its buffers
        self.ticket = 0            # the next page (in launch order) that may take a set
        self.cond = threading.Condition()

    def acquire(self, need: int, stop: threading.Event, ticket: int) -> PageSet | None:
        """A set for the page with launch position `ticket`, once every earlier page has
        taken one: the pages holding sets are then always the oldest in flight, so the page
        the computing thread waits for is never starved by later ones."""
        with self.cond:
            while self.ticket != ticket and not stop.is_set():
                self.cond.wait(0.1)
            try:
                return self._acquire(need, stop)
            finally:
                self.ticket += 1
                self.cond.notify_all()

    def _acquire(self, need: int, stop: threading.Event) -> PageSet | None:
        owner = sc.budget_scope("host")
        with self.cond:
            while not stop.is_set():
                room = None if owner is None else owner.budgets["host"] - owner.used["host"]
                if self.free:   # the free set holding most, grown if this page needs more
                    s = max(self.free, key=PageSet.held)
                    grow = need - s.held()
                    if grow <= 0 or (self.growing is None and self._make_room(s, grow, room)):
                        self.free.remove(s)
                        self.growing = s if grow > 0 else self.growing
                        return s
                elif not self.sets or (len(self.sets) < self.max_sets and self.growing is None
                                       and (room is None or need <= room)):
                    self.sets.append(PageSet())
                    self.growing = self.sets[-1]
                    return self.growing
                self.cond.wait(0.1)
        return None

    def _make_room(self, s: PageSet, grow: int, room: int | None) -> bool:
        """Make room for free set `s` to grow by `grow` bytes, the other free sets giving
        their buffers back if need be; whether it may grow: the budget has room, or no page
        holds a set (then waiting frees nothing: the charge itself says whether the budget
        can be met)."""
        if room is None or grow <= room:
            return True
        for other in self.free:
            if other is not s and room < grow:
                room += other.held()
                other.credit()
        return grow <= room or len(self.free) == len(self.sets)

    def settled(self, s: PageSet) -> None:
        """`s` has made its buffers for the page it loaded (or failed to): the budget now
        counts them, so another set may be considered."""
        with self.cond:
            if self.growing is s:
                self.growing = None
                self.cond.notify_all()

    def release(self, s: PageSet) -> None:
        with self.cond:
            self.free.append(s)
            self.cond.notify_all()

    def close(self) -> None:
        """Give every buffer back (the run is over, or interrupted)."""
        with self.cond:
            for s in self.sets:
                s.credit()
            self.sets, self.free, self.growing = [], [], None
            self.cond.notify_all()
