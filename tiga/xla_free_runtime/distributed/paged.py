"""runtime/distributed: a rank's partition that is itself paged.

A store-backed partition (`tg.Graph.open`) created while a host budget is active that
cannot hold the rank's local CSR (row_ptr, column ids and global edge ids; `should_page`)
never materialises it. Two passes read the rank's own rows of the global store, a page of
`page_rows` rows (the scope's) at a time:

1. scan: each row's degree, whether it reads a source owned elsewhere (a boundary row), and
   the distinct foreign sources (the ghosts). The halo plan follows (stored.renumbering,
   with the one all-to-all of ids of any store-backed partition);
2. write: the rows again, interior rows then boundary rows (the local row order), their
   column ids renumbered to local ids (owned rows first, ghosts appended) and appended to a
   rank-private store in the scope's spill directory, with each local edge's global id as
   the edge field "edge_ids".

The rank's local relations are then paged: `full` is that store (kind "paged"), the interior
chunks and the boundary rows are row ranges of it (`RowRange`, a reader of the same store),
and the distributed runtime runs them through the paged route, page by page. What stays in
host memory: the fields (owned + ghost rows), the local row_ptr (one int64 per owned row),
the ghosts' ids and the send lists, and the local sources' out-degrees (one int64 each).
The store is deleted when its LocalStore dies (the DistributedGraph's garbage collection, or
the interpreter's exit) and at once when the partition fails part way.
"""
from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path

import numpy as np

from ...core.dtypes import as_dtype
from ...core.errors import UnsupportedError
from ...core.graph import Graph
from ..memory import scope as sc
from ..store import stores as tstore
from .halo import HaloPlan, _row_edges
from .stored import Ownership, read_runs, renumbering

EDGE_IDS = "edge_ids"     # the field of the local store: each local edge's global id


def owned_edges(reader, mine: np.ndarray) -> int:
    """Edges of the rows `mine` (ascending), from the stored row_ptr alone, one chunk range
    at a time (the column ids are not read)."""
    if not len(mine):
        return 0
    rp = reader._row_ptr
    step = max(int(rp.chunk_rows), 1 << 16)
    total = 0
    for a in range(int(mine[0]), int(mine[-1]) + 1, step):
        i, j = np.searchsorted(mine, [a, a + step])
        if j > i:
            block = rp.read_rows(a, min(a + step, reader.num_dst) + 1)
            sel = mine[i:j] - a
            total += int((block[sel + 1] - block[sel]).sum())
    return total


def local_csr_bytes(reader, mine: np.ndarray) -> int:
    """Host bytes of the rank's in-memory local CSR: row_ptr, column ids, global edge ids."""
    edges = owned_edges(reader, mine)
    return 8 * (len(mine) + 1) + edges * (np.dtype(reader.index_dtype).itemsize + 8)


def should_page(reader, mine: np.ndarray) -> bool:
    """Page the rank's local relations: a host budget is active and its room left cannot
    hold the local CSR twice over (the CSR and its renumbering's temporaries)."""
    owner = sc.budget_scope("host")
    if owner is None:
        return False
    room = owner.budgets["host"] - owner.used["host"]
    return local_csr_bytes(reader, mine) > room // 2


def _pages(n: int, rows: int):
    return ((a, min(a + rows, n)) for a in range(0, n, rows))


def _read_page(reader, own: Ownership, rank: int, ids: np.ndarray) -> tuple:
    """(row_ptr, int64 global columns, edge ids, foreign mask) of the rows `ids`."""
    rp, col, eids = read_runs(reader, ids)
    gcol = col.astype(np.int64)
    return rp, gcol, eids, own.of(gcol) != rank


def scan(reader, own: Ownership, rank: int, mine: np.ndarray, rows: int) -> tuple:
    """Pass 1: (degree per row of `mine`, boundary mask, sorted distinct foreign sources)."""
    counts = np.zeros(len(mine), np.int64)
    boundary = np.zeros(len(mine), bool)
    found: list = [np.zeros(0, np.int64)]
    held = 0
    for a, b in _pages(len(mine), rows):
        rp, gcol, _, foreign = _read_page(reader, own, rank, mine[a:b])
        counts[a:b] = np.diff(rp)
        dst = np.repeat(np.arange(b - a, dtype=np.int64), counts[a:b])
        boundary[a:b] = np.bincount(dst[foreign], minlength=b - a) > 0
        found.append(np.unique(gcol[foreign]))
        held += len(found[-1])
        if held > 4 * rows:       # merge: the ghost list, never a page list, stays in memory
            found = [np.unique(np.concatenate(found))]
            held = len(found[0])
    return counts, boundary, np.unique(np.concatenate(found))


class RowRange:
    """Rows [start, stop) of a local store as a relation's reader (what the paged route
    reads: read_rows, page_bounds and the counts): the interior chunks and the boundary
    rows. `row_ptr` is the store's, held in memory, so page bounds cost no read."""

    transposed = None      # only destination-grouped launches run on a row range

    def __init__(self, store, row_ptr: np.ndarray, start: int, stop: int, num_src: int):
        self.store, self.start, self.stop = store, start, stop
        self.path, self.version = store.path, store.version
        self.vdir = f"{store.vdir}[{start}:{stop}]"     # (the page caches' key)
        self.num_src, self.num_dst = num_src, stop - start
        self.first = int(row_ptr[start])
        self.num_edges = int(row_ptr[stop]) - self.first
        self.index_dtype = store.index_dtype
        self._bounds = row_ptr[start:stop + 1]

    def read_rows(self, start: int, stop: int, out: tuple = (None, None)) -> tuple:
        rp, ci, first = self.store.read_rows(start + self.start, stop + self.start, out)
        return rp, ci, first - self.first

    def page_bounds(self, page_rows: int) -> np.ndarray:
        at = np.append(np.arange(0, self.num_dst, page_rows, dtype=np.int64), self.num_dst)
        return self._bounds[at] - self.first

    def read_csr(self) -> tuple:
        raise UnsupportedError(f"{self.path}: rows [{self.start}, {self.stop}) of a paged "
                               "partition are read page by page, never whole")


class LocalStore:
    """The rank-private store of a paged partition, and its relations."""

    def __init__(self, path: Path, src_degrees: np.ndarray):
        self.path = path
        self.store = tstore.open(path)
        self.src_degrees = src_degrees        # local out-degree of owned + ghost rows
        self._edge_ids = None                 # the edge_ids field's storage, once opened
        self.remove = weakref.finalize(self, shutil.rmtree, str(path), True)

    def relation(self, row_ptr: np.ndarray, start: int, stop: int, num_src: int) -> Graph:
        """The rows [start, stop) over sources [0, num_src) as a paged relation."""
        st = self.store
        reader = (st if (start, stop) == (0, st.num_dst) and num_src == st.num_src else
            RowRange(st, row_ptr, start, stop, num_src))
        return Graph(kind="paged", num_src=num_src, num_dst=reader.num_dst,
                     num_edges=reader.num_edges, index_dtype=as_dtype(st.index_dtype),
                     params={"path": str(self.path), "version": st.version, "reader": reader,
                             "local_store": self})    # (the store lives while they do)

    def edge_ids(self, a: int, b: int) -> np.ndarray:
        """Global ids of the local edges [a, b)."""
        if b <= a:
            return np.zeros(0, np.int64)
        if self._edge_ids is None:
            self._edge_ids = self.store[EDGE_IDS]._storage
        return np.asarray(self._edge_ids.read_rows(a, b), np.int64)


def spill_store_path(rank: int) -> Path:
    return sc.spill_dir() / f"tiga-dist-r{rank}-{os.getpid()}-{os.urandom(6).hex()}"


def write(reader, own: Ownership, rank: int, r, boundary: np.ndarray, path: Path,
          rows: int) -> np.ndarray:
    """Pass 2: interior then boundary rows, renumbered, into a new store at `path`; returns
    the local sources' out-degrees. Each pass reads the rank's rows in whole pages and
    keeps the rows of its kind (sequential reads, not one per run of a kind)."""
    n_owned, n_local = len(r.mine), len(r.mine) + len(r.ghosts)
    degrees = np.zeros(n_local, np.int64)
    with tstore.create(path, num_src=n_local, num_dst=n_owned,
                       index_dtype=np.dtype(reader.index_dtype).name) as w:
        for kind in (False, True):
            for a, b in _pages(n_owned, rows):
                keep = np.flatnonzero(boundary[a:b] == kind)
                if not len(keep):
                    continue
                rp, gcol, eids, foreign = _read_page(reader, own, rank, r.mine[a:b])
                pos, counts = _row_edges(rp, keep)
                lcol = r.columns(gcol[pos], foreign[pos])
                degrees += np.bincount(lcol, minlength=n_local)
                w.append_csr_chunk(np.concatenate([[0], np.cumsum(counts)]),
                                   lcol.astype(reader.index_dtype))
                if len(pos):
                    w.append_field(EDGE_IDS, eids[pos], role="edge")
    return degrees


def paged_store_plan(reader, own: Ownership, rank: int, exchange_ids) -> tuple:
    """(HaloPlan without column or edge id arrays, LocalStore) of this rank, read and
    written a page of rows at a time (the module docstring)."""
    rows = sc.page_rows()
    mine = own.mine(rank)
    counts, boundary, distinct = scan(reader, own, rank, mine, rows)
    r = renumbering(own, rank, mine, boundary, distinct, exchange_ids)
    path = spill_store_path(rank)
    try:
        degrees = write(reader, own, rank, r, boundary, path, rows)
        local = LocalStore(path, degrees)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    plan = HaloPlan(rank=rank, owned=mine[r.rows], n_interior=r.n_interior, ghosts=r.ghosts,
                    recv=r.recv, send=r.send,
                    row_ptr=np.concatenate([[0], np.cumsum(counts[r.rows])]).astype(np.int64),
                    col_idx=None, edge_ids=None)
    return plan, local


__all__ = ["paged_store_plan", "should_page", "local_csr_bytes", "owned_edges", "LocalStore",
           "RowRange"]
