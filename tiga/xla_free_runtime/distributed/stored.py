"""runtime/distributed: partitions of a store-backed relation (`tg.Graph.open(path)`).

Ownership is contiguous destination ranges ("rows", or "edges" balanced on row_ptr, which
is read in pages, never the column indices) or, with method="spatial", recursive
coordinate bisection of positions: a src/dst field of the store (one N x dims field is
read whole: the bisection needs every coordinate) or an array. Each rank reads only its
own rows of the CSR, as runs of consecutive ids (one row-range read per run); its ghosts
are the foreign sources those rows read. Send lists come from the owners' side of the same
facts: every rank tells each owner which of its rows it needs (one all-to-all of ids), so
no rank ever holds another rank's edges or the global graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.errors import GraphValidationError
from .halo import HaloPlan
from .partition import METHODS, owners


def check_store_method(method: str, positions) -> None:
    if method not in METHODS:
        raise GraphValidationError(f"method: must be one of {METHODS}, found {method!r}")
    if method != "spatial" and positions is not None:
        raise GraphValidationError(f"positions: only method='spatial' reads positions, "
                                   f"found method={method!r}")
    if method == "spatial" and positions is None:
        raise GraphValidationError(
            "positions: method='spatial' over a store needs positions: the name of a src/dst "
            "field of the store, or an array (num_dst, dims); found None")


def store_positions(reader, positions) -> np.ndarray:
    """The coordinates for a spatial partition: a store field (read whole) or an array."""
    if not isinstance(positions, str):
        return np.asarray(positions)
    info = reader.fields.get(positions)
    if info is None:
        raise GraphValidationError(f"positions: the store has no field {positions!r}; its "
                                   f"fields are {sorted(reader.fields)}")
    if info["role"] == "edge":
        raise GraphValidationError(f"positions: field {positions!r} has role 'edge'; "
                                   "coordinates are one row per node (role 'src' or 'dst')")
    return np.asarray(reader[positions])


@dataclass(frozen=True)
class Ownership:
    """Who owns each destination row: contiguous `bounds` (size + 1 first rows) or an
    `owner` table (one rank per row, from the spatial bisection)."""

    size: int
    bounds: np.ndarray | None = None
    owner: np.ndarray | None = None

    def of(self, ids: np.ndarray) -> np.ndarray:
        if self.owner is not None:
            return self.owner[ids].astype(np.int64)
        return np.searchsorted(self.bounds, ids, side="right") - 1

    def mine(self, rank: int) -> np.ndarray:
        """This rank's rows, ascending global id."""
        if self.owner is not None:
            return np.flatnonzero(self.owner == rank).astype(np.int64)
        return np.arange(self.bounds[rank], self.bounds[rank + 1], dtype=np.int64)


def store_ownership(reader, size: int, method: str, positions=None) -> Ownership:
    if method == "spatial":
        pos = store_positions(reader, positions)
        table = owners(np.zeros(reader.num_dst + 1, np.int64), size, "spatial", pos)
        return Ownership(size, owner=table)
    return Ownership(size, bounds=store_bounds(reader, size, method))


def runs(ids: np.ndarray) -> list:
    """[(start, stop)] of the runs of consecutive ids in an ascending id array."""
    if not len(ids):
        return []
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cut])
    stops = np.concatenate([cut, [len(ids)]])
    return [(int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, stops)]


def read_runs(reader, ids: np.ndarray) -> tuple:
    """(row_ptr, col_idx, global edge ids) of the rows `ids` (ascending), one row-range read
    per run of consecutive ids."""
    counts, cols, eids = [np.zeros(0, np.int64)], [], [np.zeros(0, np.int64)]
    for a, b in runs(ids):
        rp, col, first = reader.read_rows(a, b)
        rp = np.asarray(rp, np.int64)
        counts.append(np.diff(rp))
        cols.append(np.asarray(col))
        eids.append(int(first) + np.arange(len(col), dtype=np.int64))
    col = np.concatenate(cols) if cols else np.zeros(0, getattr(reader, "index_dtype",
                                                                 np.int64))
    counts = np.concatenate(counts)
    return (np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), col,
        np.concatenate(eids))


def store_bounds(reader, size: int, method: str) -> np.ndarray:
    """(size + 1) int64 first rows of each rank's contiguous range: as partition.owners
    splits an in-memory relation ("edges" reads row_ptr, never the column indices)."""
    n = reader.num_dst
    if method == "rows":
        return (np.arange(size + 1, dtype=np.int64) * n) // size
    owner = owners(reader.page_bounds(1), size, "edges")
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=size))]).astype(
        np.int64)


def read_tensor_rows(x, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` (any order) of a field tensor on any tier, reading only their chunks."""
    order = np.argsort(ids, kind="stable")
    st = getattr(x, "_storage", None)
    if st is not None and hasattr(st, "take_rows"):
        got = np.asarray(st.take_rows(np.asarray(ids, np.int64)[order]))
    else:
        got = np.asarray(x)[np.asarray(ids, np.int64)[order]]
    out = np.empty_like(got)
    out[order] = got
    return out


@dataclass(frozen=True, eq=False)
class Renumbering:
    """A rank's local numbering (halo.py conventions) from the facts about its own rows:
    `rows` (positions in `mine`, interior first), `local` (position in `mine` -> local row),
    ghosts (grouped by owner), recv / send, and `distinct` / `slot` to renumber a ghost."""

    mine: np.ndarray
    rows: np.ndarray
    local: np.ndarray
    n_interior: int
    ghosts: np.ndarray
    distinct: np.ndarray
    slot: np.ndarray
    recv: tuple
    send: tuple

    def columns(self, gcol: np.ndarray, foreign: np.ndarray) -> np.ndarray:
        """int64 local source ids of global ids `gcol` (`foreign`: owned elsewhere)."""
        lcol = np.empty(len(gcol), np.int64)
        lcol[foreign] = len(self.mine) + self.slot[np.searchsorted(self.distinct,
                                                                   gcol[foreign])]
        lcol[~foreign] = self.local[np.searchsorted(self.mine, gcol[~foreign])]
        return lcol


def renumbering(own: Ownership, rank: int, mine: np.ndarray, boundary: np.ndarray,
                distinct: np.ndarray, exchange_ids) -> Renumbering:
    """The numbering of `rank`'s rows `mine` (ascending) whose `boundary` rows read the
    foreign sources `distinct` (ascending): one all-to-all of ids (`exchange_ids(per_peer)`
    sends each peer the ids of its rows this rank reads and returns, per peer, the ids of
    this rank's rows that peer reads)."""
    n_rows = len(mine)
    rows = np.concatenate([np.flatnonzero(~boundary), np.flatnonzero(boundary)])
    by_owner = np.argsort(own.of(distinct), kind="stable")
    ghosts = distinct[by_owner].astype(np.int64)        # grouped by owner, ascending within
    ghost_owner = own.of(ghosts)
    peers_read = exchange_ids([ghosts[ghost_owner == q] for q in range(own.size)])
    local = np.empty(n_rows, np.int64)
    local[rows] = np.arange(n_rows)
    peers, starts = np.unique(ghost_owner, return_index=True)
    stops = np.append(starts[1:], len(ghosts))
    recv = tuple((int(q), int(s), int(e)) for q, s, e in zip(peers, starts, stops))
    send = tuple((q, local[np.searchsorted(mine, ids)]) for q, ids in enumerate(peers_read)
                 if q != rank and len(ids))
    slot = np.empty(len(distinct), np.int64)
    slot[by_owner] = np.arange(len(distinct))
    return Renumbering(mine, rows, local, int((~boundary).sum()), ghosts, distinct, slot,
                       recv, send)


def store_plan(reader, own: Ownership, rank: int, exchange_ids) -> HaloPlan:
    """This rank's plan from its own rows of the store, read at once (the conventions of
    halo.build_plan; paged.py builds it page by page when the host budget is small)."""
    mine = own.mine(rank)
    rp, col, edge_ids = read_runs(reader, mine)
    n_rows = len(mine)
    dst = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(rp))
    gcol = col.astype(np.int64)
    foreign = own.of(gcol) != rank
    boundary = np.bincount(dst[foreign], minlength=n_rows) > 0
    r = renumbering(own, rank, mine, boundary, np.unique(gcol[foreign]), exchange_ids)
    lcol = r.columns(gcol, foreign)
    by_row = np.argsort(r.local[dst], kind="stable")
    counts = np.diff(rp)[r.rows]
    return HaloPlan(rank=rank, owned=mine[r.rows], n_interior=r.n_interior, ghosts=r.ghosts,
                    recv=r.recv, send=r.send,
                    row_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    col_idx=lcol[by_row].astype(col.dtype), edge_ids=edge_ids[by_row])


__all__ = ["check_store_method", "store_bounds", "store_plan", "store_ownership",
           "store_positions", "Ownership", "Renumbering", "renumbering", "runs", "read_runs",
           "read_tensor_rows"]
