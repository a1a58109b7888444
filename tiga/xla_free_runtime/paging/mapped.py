"""runtime/paging: the pages of a warm run read where the page cache holds them (mapped).

A warm paged run used to copy every byte it needs out of the page cache into page buffers,
then gather each page's distinct source rows and remap its ids: at 10M edges 26 ms of
copies and 7 ms of crc32c on one core for a kernel of 17 ms on two (benchmarks/
PAGING_NOTES.md). When every disk array a run reads is a read-only store or tg.load array
in the direct layout, and the run is small enough for the cache to keep (not one that
reads past it: chunk_checks), the run maps them instead (DiskStorage.mapped: the cache's
own pages back to back, read in as huge folios where the cache lacks them, no copy). A
page's kernel then reads the source field's rows where they lie, by their stored ids: no
distinct gather, no remap, and the kernel takes every core, since the loaders only check.

Every chunk a run uses is checked (crc32c against its trailer and the manifest):
- the relation's row_ptr and column-id chunks of a page, on its loader, before its kernel
  runs (they index memory);
- every other mapped chunk before the run's results are kept: a page's loader checks its
  rows (a field of the page's own rows or edges) and its share of each gathered field's
  chunks (pages read an unknown subset of a gathered field: all of them are checked, spread
  over the pages), and chunk_checks.settle() what is still owed.
A storage keeps its mapping from run to run (DiskStorage.mapped), and a chunk an earlier run
checked is not checked again when all its pages are still mapped at the start of the next
run (the kernel unmaps a page before evicting it) and its file shows no change. So a warm
call costs the kernel and little more, where it used to cost a copy and a crc32c of every
byte.

What mapping trusts that reading into buffers did not:
- that a page evicted while a run maps it and read in again during that run (by the kernel
  that faults it) reads back the bytes that were checked: the disk returning other bytes
  within one run. A read copies once and uses the bytes it checked;
- that a committed store's chunk files keep their length while a run maps them: a file cut
  short by another process during the run would be SIGBUS rather than a StorageError.
  Files changed or cut short between runs are mapped anew or refused (DiskStorage.mapped,
  files.map_files) and fail on the read path as before.
The resident set counts the mapped store pages (the page cache's, shared and clean: the
kernel takes them back under memory pressure); they are not charged to the host budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..memory.tiers import chunk_checks
from .pages import reads_past_cache, tier_of


@dataclass
class MappedArray:
    """A disk storage mapped for one run: its rows and its chunk bodies' bytes."""

    storage: object
    rows: np.ndarray
    fmap: object          # files.FileMap

    def check(self, lo: int, hi: int) -> int:
        """Check the chunks of rows [lo, hi) not yet checked in this run; their bytes."""
        return self.check_chunks(lo // self.storage.chunk_rows,
                                 -(-hi // self.storage.chunk_rows))

    def check_chunks(self, a: int, b: int) -> int:
        checks, stor, done = chunk_checks.current(), self.storage, 0
        for k in range(a, min(b, stor.num_chunks)):
            if checks is None or not checks.is_checked(stor, k):
                stor.load_mapped(k)
                done += self.fmap.nbytes // stor.num_chunks
        return done


@dataclass
class MappedRun:
    """A run's mapped arrays: the walked relation's column ids and each disk field (by
    its position among the propagate's fields; host fields are read in place)."""

    reader: object
    row_ptr: MappedArray
    col: MappedArray
    fields: dict
    pages: int

    def relation(self, task, out) -> tuple:
        """(row_ptr local to the page (into `out`), its column ids (mapped), first edge,
        bytes checked) of a page, both checked before its kernel may index with them."""
        a, b = task.rows
        nbytes = self.row_ptr.check(a, b + 1)
        rp, lo = self.reader.local_offsets(self.row_ptr.rows[a:b + 1], a, out)
        hi = lo + int(rp[-1])
        return rp, self.col.rows[lo:hi], lo, nbytes + self.col.check(lo, hi)

    def field(self, i: int, op, stor) -> tuple:
        """(the rows a page's kernel reads of field i, bytes checked for it): the whole
        field by stored id (kind "gather", the page checking its share of the chunks), or
        the page's own rows or edges."""
        m = self.fields.get(i)
        if op.kind != "gather":
            a, b = op.rows
            return (stor.read_rows(a, b), 0) if m is None else (m.rows[a:b], m.check(a, b))
        if m is None:
            return stor._live(), 0
        n = m.storage.num_chunks
        return m.rows, m.check_chunks(op.page * n // self.pages, (op.page + 1) * n // self.pages)

    def owe_all(self, checks) -> None:
        """Owe every mapped field chunk to the run: settle() checks what no page did."""
        for m in self.fields.values():
            for k in range(m.storage.num_chunks):
                checks.owe(m.storage, k)


def mappable(walk, fields: list, roles, triton=None) -> bool:
    """Whether a run's pages read their arrays mapped (a property of its plan: its page
    kernels then take every core): the CPU route's pages over a stored relation, walked in
    stored edge order where a field has edge rows, with fields on the host or on disk, each
    disk array in a layout that maps (DiskStorage.can_map), the whole run small enough for
    the page cache to keep (otherwise it reads past it: chunk_checks). `fields`: (storage,
    tier) of each propagate field (storage None: on the host)."""
    reader = walk.reader
    if triton is not None or reader is None or tier_of(reader) != "disk" or \
            not hasattr(reader, "row_offsets") or \
            (walk.edge_perm is not None and "edge" in roles) or \
            any(tier not in ("host", "disk", "param") for _, tier in fields) or \
            reads_past_cache(walk, fields):
        return False
    disk = [reader.row_ptr, reader.col_idx] + [s for s, tier in fields if tier == "disk"]
    return all(getattr(s, "can_map", lambda: False)() for s in disk)


def open_mapped(walk, fields: list, pages: int) -> MappedRun | None:
    """The mapped arrays of a mappable run, or None where mapping them failed (mmap
    refused: the run reads its pages as before)."""
    reader = walk.reader
    rp, col = _mapped(reader.row_ptr), _mapped(reader.col_idx)
    mapped = {i: _mapped(stor) for i, (stor, tier) in enumerate(fields) if tier == "disk"}
    if rp is None or col is None or any(m is None for m in mapped.values()):
        return None
    return MappedRun(reader, rp, col, mapped, pages)


def _mapped(stor) -> MappedArray | None:
    got = stor.mapped()
    return None if got is None else MappedArray(stor, *got)


__all__ = ["MappedRun", "mappable", "open_mapped"]
