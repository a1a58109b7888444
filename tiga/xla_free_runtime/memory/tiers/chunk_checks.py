"""runtime: the checksums a paged run owes: chunks it read in part, checked once, whole.

A chunk's crc32c covers the whole chunk, so a range read that needs a few rows of a chunk
(the window of a page that reaches 8 rows into its neighbour's chunk, a slice of row_ptr)
used to read and check the whole chunk, once per page and reading thread: at 10M edges a
third of the loaders' chunk reads. Inside `checking()` such a part is read alone and the
chunk recorded as owed; a whole read of the chunk by any thread of the run (the
neighbouring page's) pays the debt, and `settle()` reads and checks what is still owed
before the run's results are kept. A damaged chunk is thus still a tg.StorageError from
the run that read it, never a result; it is only found at the end of that run rather than
at the page. The ledger lives in a context variable, so the run's loader threads (started
with a copy of its context) share it and nothing outlives the run.

The run also says how its chunks are read: `direct` runs (those reading more than the page
cache could keep, see paging) read a chunk the cache does not hold past it (O_DIRECT);
caching it would only evict what the next call needs. Other reads go through the cache,
so a second call over a store that fits in memory is served from it; a run that could map
its arrays reads their whole chunks `through` the mappings their storages keep, so that the
next call finds them mapped and checked (paging/mapped.py).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar


class ChunkChecks:
    """One run's ledger: (storage, chunk) pairs checked whole, and those read in part."""

    def __init__(self, direct: bool = False, through: dict | None = None, charge=None):
        self.direct = direct               # cold chunks read past the page cache
        self.through = through or {}       # id(storage) -> the kept FileMap it reads through
        self._charge = charge              # nbytes -> whether the budget took them
        self._charged: set = set()
        self._lock = threading.Lock()     # (the run's loader threads record concurrently)
        self._checked: set = set()
        self._owed: dict = {}             # (id(storage), chunk) -> storage

    def checked(self, storage, k: int) -> None:
        with self._lock:
            self._checked.add((id(storage), k))
            self._owed.pop((id(storage), k), None)

    def mapping(self, storage, k: int, nbytes: int):
        """The kept mapping (files.FileMap) the run reads chunk k of `storage` through
        (paging/mapped.reads_through), or None: none, `nbytes` are not the whole chunk, or
        the budget has no room for them (charged once a run: they stay resident while the
        run maps them)."""
        fmap = self.through.get(id(storage))
        if fmap is None or fmap.nbytes != nbytes * storage.num_chunks:
            return None
        if self._charge is None:
            return fmap
        with self._lock:
            if (id(storage), k) in self._charged:
                return fmap
            if not self._charge(nbytes):
                return None
            self._charged.add((id(storage), k))
        return fmap

    def is_checked(self, storage, k: int) -> bool:
        return (id(storage), k) in self._checked

    def owe(self, storage, k: int) -> None:
        with self._lock:
            if (id(storage), k) not in self._checked:
                self._owed[(id(storage), k)] = storage

    def settle(self) -> None:
        """Check every chunk still owed (read whole, crc32c, the manifest's record)."""
        with self._lock:
            owed, self._owed = sorted(self._owed.items(), key=lambda kv: kv[0][1]), {}
        for (_, k), storage in owed:
            storage.check_chunk(k)
            self.checked(storage, k)


_CHECKS: ContextVar[ChunkChecks | None] = ContextVar("tiga_chunk_checks", default=None)


def current() -> ChunkChecks | None:
    """The ledger of the run this thread reads for, or None (every chunk checked whole)."""
    return _CHECKS.get()


@contextmanager
def checking(direct: bool = False, through: dict | None = None, charge=None):
    """A run's ledger for its reads; settle() it before the run's results are kept."""
    checks = ChunkChecks(direct, through, charge)
    token = _CHECKS.set(checks)
    try:
        yield checks
    finally:
        _CHECKS.reset(token)
