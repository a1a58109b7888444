"""runtime/distributed: one rank's halo plan and its renumbered local CSR (pure numpy).

Local numbering: the owned rows first, interior rows (every source owned here) before
boundary rows (some source owned elsewhere), each in ascending global id; then the ghost
source rows, grouped by owner rank and ascending within a rank. Interior rows therefore
read only sources < n_owned and their edges form the prefix [0, interior_edges) of the
local CSR: they can run before the halo arrives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class HaloPlan:
    rank: int
    owned: np.ndarray            # int64 global ids, interior rows first
    n_interior: int
    ghosts: np.ndarray           # int64 global ids of ghost source rows (local n_owned + i)
    recv: tuple                  # ((peer rank, start, stop) into ghosts), by peer rank
    send: tuple                  # ((peer rank, int64 local owned rows the peer reads), ...)
    row_ptr: np.ndarray          # local CSR over owned rows (int64)
    col_idx: np.ndarray | None   # local source ids (owned, then ghosts); None: paged (on disk)
    edge_ids: np.ndarray | None  # global edge id of each local edge (local edge order)

    @property
    def n_owned(self) -> int:
        return len(self.owned)

    @property
    def n_ghost(self) -> int:
        return len(self.ghosts)

    @property
    def num_edges(self) -> int:
        return int(self.row_ptr[-1])

    @property
    def interior_edges(self) -> int:
        return int(self.row_ptr[self.n_interior])

    def peers(self) -> list:
        return sorted({q for q, _, _ in self.recv} | {q for q, _ in self.send})


def _row_edges(row_ptr: np.ndarray, rows: np.ndarray) -> tuple:
    """(storage positions of the edges of `rows`, in row order; per-row counts)."""
    starts = row_ptr[rows]
    counts = row_ptr[rows + 1] - starts
    total = int(counts.sum())
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(rows) else np.zeros(0)
    pos = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets.astype(np.int64),
                                                       counts)
    return pos, counts


def build_plan(row_ptr, col_idx, edge_perm, owner: np.ndarray, rank: int) -> HaloPlan:
    """The halo plan of `rank` for the global CSR (row_ptr, col_idx, optional edge_perm)
    whose source and destination rows are both owned as `owner` says."""
    row_ptr = np.asarray(row_ptr, np.int64)
    col_idx = np.asarray(col_idx)
    n = len(row_ptr) - 1
    dst_of_edge = np.repeat(np.arange(n, dtype=np.int64), np.diff(row_ptr))
    src_owner = owner[col_idx]
    dst_owner = owner[dst_of_edge]
    foreign = src_owner != dst_owner
    boundary_row = np.bincount(dst_of_edge[foreign], minlength=n) > 0
    mine = np.flatnonzero(owner == rank)
    interior = mine[~boundary_row[mine]]
    owned = np.concatenate([interior, mine[boundary_row[mine]]]).astype(np.int64)
    pos, counts = _row_edges(row_ptr, owned)
    cols = col_idx[pos].astype(np.int64)
    ghost_ids = np.unique(cols[owner[cols] != rank])
    ghosts = ghost_ids[np.argsort(owner[ghost_ids], kind="stable")]
    local = np.full(n, -1, np.int64)
    local[owned] = np.arange(len(owned))
    local[ghosts] = len(owned) + np.arange(len(ghosts))
    peers, starts = np.unique(owner[ghosts], return_index=True)
    stops = np.append(starts[1:], len(ghosts))
    recv = tuple((int(q), int(a), int(b)) for q, a, b in zip(peers, starts, stops))
    # what the others read from me: my sources on edges into their rows, ascending per peer
    out = (src_owner == rank) & foreign
    pairs = (np.unique(np.stack([dst_owner[out].astype(np.int64),
                                 col_idx[out].astype(np.int64)]), axis=1) if out.any()
        else np.zeros((2, 0), np.int64))
    send = tuple((int(q), local[pairs[1, pairs[0] == q]])
                 for q in np.unique(pairs[0]))
    perm = None if edge_perm is None else np.asarray(edge_perm, np.int64)
    return HaloPlan(rank=rank, owned=owned, n_interior=len(interior), ghosts=ghosts,
                    recv=recv, send=send,
                    row_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    col_idx=local[cols].astype(col_idx.dtype),
                    edge_ids=pos if perm is None else perm[pos])


__all__ = ["HaloPlan", "build_plan"]
