"""runtime: host buffers of the pages in flight of a paged run, reused page after page.

Fresh memory costs a page fault per 4 KiB on first touch (for a page of 65536 rows of 32
float32 features, as much as reading them); so a run keeps a few buffer sets (one per page
in flight: loading, loaded ahead, computing, being written) and every page reads into a free
set. Each buffer is charged to the host budget while the run holds it; a new set is only
made, and a free set too small for a page only grown, while the budget has room for it,
else the loader waits for a set to come back. A set that grows reserves its page's estimate
when it is handed out, and its buffers draw on that reservation as they are made, so two
loaders growing sets at once never count on the same free bytes; the rest of the
reservation goes back when the page has made its buffers (`settled`). Sets are handed out in
launch order (`acquire`'s ticket), so the page the computing thread waits for is never
starved by later ones.
"""
from __future__ import annotations

import threading

import numpy as np

from ...core.errors import StorageError
from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers.files import aligned_empty


def with_slack(n: int) -> int:
    """`n` and an eighth more: what a buffer for `n` rows is made with, so pages of varying
    size settle on one allocation."""
    return n + n // 8


class PageSet:
    """One page's buffers by name; `get` hands out the leading rows of a buffer, growing it
    (with slack, so pages of varying size settle on one allocation) when too small."""

    def __init__(self):
        self.bufs: dict = {}         # name -> (array, its charge)
        self.reserved = None         # the Charge its growth draws on (acquire to settled)

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
        ch = (memory.charge("host", cap * row, what, knob="page_rows") if self.reserved is None
            else memory.draw(self.reserved, cap * row, what, knob="page_rows"))
        # (page-aligned for O_DIRECT writes; a mapping of its own, unmapped with the set)
        arr = aligned_empty((cap,) + tuple(row_shape), dtype, 4096, mapped=True)
        self.bufs[name] = (arr, ch)
        return arr[:n]

    def held(self) -> int:
        return sum(arr.nbytes for arr, _ in self.bufs.values())

    def reserve(self, grow: int) -> None:
        """Charge `grow` bytes ahead of the buffers this page makes (raises the budget's
        StorageError when they do not fit)."""
        if grow > 0:
            self.reserved = memory.charge("host", grow, "page buffers", knob="page_rows")

    def unreserve(self) -> None:
        if self.reserved is not None:
            self.reserved.credit()
            self.reserved = None

    def credit(self) -> None:
        for _, ch in self.bufs.values():
            ch.credit()
        self.bufs.clear()
        self.unreserve()


class PageBuffers:
    """At most `sets` buffer sets; acquire() blocks while none is free and the budget
    leaves no room for another page."""

    def __init__(self, sets: int):
        self.max_sets = sets
        self.sets: list = []
        self.free: list = []
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
                s = None
                if self.free:   # the free set holding most, grown if this page needs more
                    s = max(self.free, key=PageSet.held)
                    if need - s.held() > 0 and not self._make_room(s, need - s.held(), room):
                        s = None
                elif not self.sets or (len(self.sets) < self.max_sets and
                                       (room is None or need <= room)):
                    s = PageSet()
                if s is not None and self._reserve(s, need - s.held()):
                    if s in self.free:
                        self.free.remove(s)
                    else:
                        self.sets.append(s)
                    return s
                self.cond.wait(0.1)
        return None

    def _reserve(self, s: PageSet, grow: int) -> bool:
        """Reserve `s`'s growth; False (wait for a set to come back) when the budget has no
        room now but a page in flight will give some back. With nothing in flight the page
        goes ahead unreserved: the estimate is an upper bound, its buffers' own charges say
        whether the budget holds them."""
        try:
            s.reserve(grow)
        except StorageError:
            return len(self.free) == len(self.sets)
        return True

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
        counts them, and what its reservation did not use goes back."""
        with self.cond:
            s.unreserve()
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
            self.sets, self.free = [], []
            self.cond.notify_all()
