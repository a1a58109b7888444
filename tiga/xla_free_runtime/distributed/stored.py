"""runtime/distributed: partitions of a store-backed relation (`tg.Graph.open(path)`).

Ownership is contiguous destination ranges ("rows", or "edges" balanced on row_ptr, which
is read in pages, never the column indices). Each rank reads only its own rows of the CSR
from the store; its ghosts are the foreign sources those rows read. Send lists come from
the owners' side of the same facts: every rank tells each owner which of its rows it needs
(one all-to-all of ids), so no rank ever holds another rank's edges or the global graph.
"""
from __future__ import annotations

import numpy as np

from ...core.errors import UnsupportedError
from .halo import HaloPlan
from .partition import owners


def check_store_method(method: str, positions) -> None:
    if method not in ("rows", "edges") or positions is not None:
        raise UnsupportedError(
            f"method: a store-backed relation partitions by contiguous rows ('rows' or "
            f"'edges'), found method={method!r}"
            + (" with positions" if positions is not None else ""),
            hint="a spatial partition needs every point's coordinates; load the relation "
                 "with Graph.from_csr for method='spatial'")


def store_bounds(reader, size: int, method: str) -> np.ndarray:
    """(size + 1) int64 first rows of each rank's contiguous range: as partition.owners
    splits an in-memory relation ("edges" reads row_ptr, never the column indices)."""
    n = reader.num_dst
    if method == "rows":
        return (np.arange(size + 1, dtype=np.int64) * n) // size
    owner = owners(reader.page_bounds(1), size, "edges")
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=size))]).astype(
        np.int64)


def store_plan(reader, bounds: np.ndarray, rank: int, exchange_ids) -> HaloPlan:
    """This rank's plan from its own rows of the store.

    `exchange_ids(per_peer)` sends each peer the ids of its rows this rank reads and
    returns, per peer, the ids of this rank's rows that peer reads (an all-to-all)."""
    a, b = int(bounds[rank]), int(bounds[rank + 1])
    rp, col, first_edge = reader.read_rows(a, b)
    rp, col = np.asarray(rp, np.int64), np.asarray(col)
    n_rows = b - a
    dst = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(rp))
    gcol = col.astype(np.int64)
    owner_of = np.searchsorted(bounds, gcol, side="right") - 1
    foreign = owner_of != rank
    boundary = np.bincount(dst[foreign], minlength=n_rows) > 0
    rows = np.concatenate([np.flatnonzero(~boundary), np.flatnonzero(boundary)])
    ghosts = np.unique(gcol[foreign])          # contiguous ranges: ascending = by owner
    ghost_owner = np.searchsorted(bounds, ghosts, side="right") - 1
    size = len(bounds) - 1
    wanted = [ghosts[ghost_owner == q] for q in range(size)]
    peers_read = exchange_ids(wanted)
    local = np.empty(n_rows, np.int64)
    local[rows] = np.arange(n_rows)
    peers, starts = np.unique(ghost_owner, return_index=True)
    stops = np.append(starts[1:], len(ghosts))
    recv = tuple((int(q), int(s), int(e)) for q, s, e in zip(peers, starts, stops))
    send = tuple((q, local[ids - a]) for q, ids in enumerate(peers_read)
                 if q != rank and len(ids))
    lcol = np.where(foreign, 0, gcol - a)
    lcol = np.where(foreign, n_rows + np.searchsorted(ghosts, gcol), local[np.clip(lcol, 0,
                                                                                    None)])
    by_row = np.argsort(local[dst], kind="stable")
    edge_ids = first_edge + np.arange(len(gcol), dtype=np.int64)
    counts = np.diff(rp)[rows]
    return HaloPlan(rank=rank, owned=(a + rows).astype(np.int64),
                    n_interior=int((~boundary).sum()), ghosts=ghosts.astype(np.int64),
                    recv=recv, send=send,
                    row_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                    col_idx=lcol[by_row].astype(col.dtype), edge_ids=edge_ids[by_row])


__all__ = ["check_store_method", "store_bounds", "store_plan"]
