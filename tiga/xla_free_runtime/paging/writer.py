"""runtime: the writer thread of a paged run whose result lives on disk.

A page's output rows go to disk while the next page computes: the computing thread hands
each page's rows (with the page's buffer set, which holds them) to this thread through a
bounded queue and goes on; the writer writes them and gives the buffer set back. Disk
writes bypass the page cache (storage/disk), so they cost the disk's time, not the CPU's,
and that time overlaps compute. An error in a write is raised on the computing thread at
its next hand-over or at close(), never lost.
"""
from __future__ import annotations

import contextvars
import queue
import threading
import time

WRITE_QUEUE = 2      # pages written behind the computing thread at most


class PageWriter:
    def __init__(self, buffers, stats):
        self.buffers, self.stats = buffers, stats
        self.q: queue.Queue = queue.Queue(maxsize=WRITE_QUEUE)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=contextvars.copy_context().run,
                                       args=(self._loop,), daemon=True,
                                       name="tiga-page-writer")
        self.thread.start()

    def put(self, pending: list, bufs) -> None:
        """Write `pending` [(storage, first row, rows)] and then release `bufs`."""
        self.raise_error()
        self.q.put((pending, bufs))

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            pending, bufs = item
            try:
                if self.error is None:
                    t0 = time.perf_counter()
                    for stor, row, rows in pending:
                        stor.write_rows(row, rows)
                    self.stats.seconds["write"] += time.perf_counter() - t0
            except BaseException as exc:       # raised on the computing thread
                self.error = exc
            finally:
                self.buffers.release(bufs)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, check: bool = True) -> None:
        """Wait for every queued write (check: raise a write's error here)."""
        self.q.put(None)
        self.thread.join()
        if check:
            self.raise_error()
