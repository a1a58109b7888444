"""runtime/paging: the pages of a warm run read where the page cache holds them (mapped).

A warm paged run used to copy every byte it needs out of the page cache into page buffers,
then gather each page's distinct source rows and remap its ids: at 10M edges 26 ms of
copies and 7 ms of crc32c on one core for a kernel of 17 ms on two (benchmarks/
PAGING_NOTES.md). When every disk array a run reads is a read-only store or tg.load array
in the direct layout, and the run is small enough for the cache to keep (not one that
reads past it: chunk_checks), already in the cache (WARM: a cold run reads, and so brings
the store in) and within the host budget, the run maps them instead (DiskStorage.mapped:
the cache's own pages back to back, no copy). A page's kernel then reads the source
field's rows where they lie, by their stored ids: no distinct gather, no remap, and the
kernel takes every core, since the loaders only check.

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
byte. A cold run that could map (reads_through) reads its pages into buffers, but through
those same kept mappings, so the warm run after it finds its chunks mapped and checked.

What mapping trusts that reading into buffers did not:
- that a page evicted while a run maps it and read in again during that run (by the kernel
  that faults it) reads back the bytes that were checked: the disk returning other bytes
  within one run. A read copies once and uses the bytes it checked;
- that a committed store's chunk files keep their length while a run maps them: a file cut
  short by another process during the run would be SIGBUS rather than a StorageError.
  Files changed or cut short between runs are mapped anew or refused (DiskStorage.mapped,
  files.map_files) and fail on the read path as before.
The resident set counts the mapped store pages (the page cache's, shared and clean: the
kernel takes them back under memory pressure). A run charges them to the host budget while
it runs, so a run maps only what its budget can hold; they stay mapped after it (that is
what spares the next run its checks) until the storage goes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.errors import StorageError
from ...core.graph import Graph
from ..memory import scope as sc
from ..memory.tiers import chunk_checks
from .pages import reads_past_cache, tier_of

# mapped when the page cache holds this share of the run's arrays: a cold run reads its
# pages into buffers, where checks and kernel work on cache-hot copies; mapped, the first
# touch of freshly read pages by the checks and the kernel cost more CPU than the copy saves
# (100M edges, cold, result on the host: 1.2-2.9 s mapped against 1.15-1.5 s read, a
# spread across runs this machine's memory gives both). A proactive reclaimer (DAMON here)
# takes a few pages of a warm store now and then: those fault back in where they are read.
WARM = 0.9


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
                stor.load_mapped(k, self.fmap)
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

    def page(self, task, index_dtype) -> tuple:
        """(the page's CSR over the stored ids (its row_ptr local, its column ids mapped),
        its first edge, bytes checked): row offsets and column ids checked before its
        kernel may index with them. The page's CSR is made once per mapping of the
        relation and kept with it (FileMap.derived): a later run checks the same chunks,
        which hold the same bytes, and reuses it, and with it what the kernel's launch
        derived from it (its row chunks, its bound arguments)."""
        a, b = task.rows
        nbytes = self.row_ptr.check(a, b + 1)
        kept = self.row_ptr.fmap.derived.get(("page", a, b))
        if kept is None or kept[0] is not self.col.fmap or kept[1].index_dtype != index_dtype:
            rp, lo = self.reader.local_offsets(np.array(self.row_ptr.rows[a:b + 1]), a)
            ci = self.col.rows[lo:lo + int(rp[-1])]
            kept = self.row_ptr.fmap.derived[("page", a, b)] = (self.col.fmap, Graph(
                kind="csr", num_src=self.reader.num_src, num_dst=b - a, num_edges=len(ci),
                index_dtype=index_dtype, csr=(rp, ci)), lo)
        _, graph, lo = kept
        return graph, lo, nbytes + self.col.check(lo, lo + graph.num_edges)

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

    def checked(self) -> bool:
        """Whether every chunk of the run's arrays was checked through their mappings
        before (and stayed mapped): its pages then have nothing to read or check."""
        return all(len(m.fmap.derived["checked"]) == m.storage.num_chunks
                   for m in (self.row_ptr, self.col, *self.fields.values()))

    def owe_all(self, checks) -> None:
        """Owe every mapped field chunk to the run: settle() checks what no page did."""
        for m in self.fields.values():
            for k in range(m.storage.num_chunks):
                checks.owe(m.storage, k)


def mappable(walk, fields: list, roles, triton=None, reserved: int = 0) -> bool:
    """Whether a run's pages read their arrays mapped (a property of its plan: its page
    kernels then take every core): a run that could map (could_map) whose arrays the page
    cache holds now (warm)."""
    disk = could_map(walk, fields, roles, triton, reserved)
    return disk is not None and warm(disk)


def warm(disk: list) -> bool:
    """Whether the page cache holds WARM of these disk arrays' bytes now."""
    return (sum(s.cached_fraction() * s.nbytes for s in disk) >=
        WARM * sum(s.nbytes for s in disk))


def reads_through(disk: list) -> list | None:
    """The kept mappings a run that could map (could_map: its disk arrays `disk`) but does
    not (a cold one) reads its chunks through ([(storage, its FileMap)], for chunk_checks),
    or None where one cannot be mapped. Its pages are read into buffers as before, but each
    chunk read whole is read in and checked through the mapping its storage keeps
    (DiskStorage.mapped) rather than a temporary one (files.read_chunk_file), where the
    host budget has room for it beside the run's page buffers (PagedRun.charge_through);
    map_rest() maps the rest once the buffers are gone. The next call then maps every chunk,
    checked, and checks none of them again."""
    got = [(s, s.mapped()) for s in disk]
    return None if any(m is None for _, m in got) else [(s, fmap) for s, (_, fmap) in got]


def map_rest(through: list) -> None:
    """After a run read through `through` (reads_through) and gave its page buffers back:
    the chunks it did not read through, read in (the page cache holds them: the run just
    read them) and checked through their kept mappings, for the next call. A chunk that
    fails is left unmapped: the run's own reads were checked, and the next call checks it
    again."""
    for stor, fmap in through:
        for k in range(stor.num_chunks):
            if k not in fmap.derived["checked"]:
                try:
                    stor.load_mapped(k, fmap)
                except StorageError:
                    continue


def could_map(walk, fields: list, roles, triton=None, reserved: int = 0) -> list | None:
    """The disk arrays of a run that could read them mapped, or None: the CPU route's pages
    over a stored relation, walked in stored edge order where a field has edge rows, with
    fields on the host or on disk, each disk array in a layout that maps
    (DiskStorage.can_map), the whole run small enough for the page cache to keep (otherwise
    it reads past it: chunk_checks), and within what the host budget has left, `reserved`
    bytes the run will still charge aside (a run's mapped pages are charged to it:
    mapped_bytes). `fields`: (storage, tier) of each propagate field (storage None: on the
    host)."""
    reader = walk.reader
    if (triton is not None or reader is None or tier_of(reader) != "disk" or
            not hasattr(reader, "row_offsets") or
            (walk.edge_perm is not None and "edge" in roles) or
            any(tier not in ("host", "disk", "param") for _, tier in fields) or
            reads_past_cache(walk, fields)):
        return None
    disk = [reader.row_ptr, reader.col_idx] + [s for s, tier in fields if tier == "disk"]
    if not all(getattr(s, "can_map", lambda: False)() for s in disk):
        return None
    owner = sc.budget_scope("host")
    if (owner is not None and owner.used["host"] + reserved + mapped_bytes(walk, fields) >
            owner.budgets["host"]):
        return None         # (the charge PagedRun.charge_mapped would make)
    return disk


def mapped_bytes(walk, fields: list) -> int:
    """Bytes a mapped run maps (and charges to the host budget: they are resident while
    it runs, and after, as the page cache's clean pages), with its pages' local row
    offsets (MappedRun.page)."""
    reader = walk.reader
    return (2 * reader.row_ptr.nbytes + reader.col_idx.nbytes +
        sum(s.nbytes for s, tier in fields if tier == "disk"))


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


__all__ = ["MappedRun", "could_map", "map_rest", "mappable", "mapped_bytes", "open_mapped",
           "reads_through", "warm"]
