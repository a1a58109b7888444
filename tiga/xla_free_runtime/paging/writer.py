"""runtime: the writer threads of a paged run whose result lives on disk.

A page's output rows go to disk while the next page computes: the computing thread hands
each page's rows (with the page's buffer set, which holds them) to the writers through a
bounded queue and goes on; a writer writes them and gives the buffer set back. Disk
writes bypass the page cache (storage/disk), so they cost the disk's time, not the CPU's,
and that time overlaps compute. Pages that write whole chunks only are written by WRITERS
threads at once (a disk keeps two requests in flight faster than one: 800 MB in 4 MiB
chunk files took 0.70-0.82 s from one thread, 0.61-0.69 s from two, on this machine); a
page that writes part of a chunk rewrites it whole, so such runs keep one writer, and the
pages' order. An error in a write is raised on the computing thread at its next hand-over
or at close(), never lost.
"""
from __future__ import annotations

import contextvars
import queue
import threading
import time

WRITE_QUEUE = 3      # pages handed to the writers and not yet written, at most
WRITERS = 2          # pages being written at once, at most


class PageWriter:
    def __init__(self, buffers, stats, threads: int = 1):
        self.buffers, self.stats = buffers, stats
        # (queued or being written: one depth for any number of writers, so a run holds no
        # more page buffers for two than it did for one)
        self.q: queue.Queue = queue.Queue(maxsize=max(1, WRITE_QUEUE - threads))
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=contextvars.copy_context().run,
                                         args=(self._loop,), daemon=True,
                                         name=f"tiga-page-writer-{i}")
                        for i in range(threads)]
        for t in self.threads:
            t.start()

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
                    with self.lock:
                        self.stats.seconds["write"] += time.perf_counter() - t0
            except BaseException as exc:       # raised on the computing thread
                self.error = self.error or exc
            finally:
                self.buffers.release(bufs)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, check: bool = True) -> None:
        """Wait for every queued write (check: raise a write's error here)."""
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            t.join()
        if check:
            self.raise_error()
