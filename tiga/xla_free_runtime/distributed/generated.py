"""runtime/distributed: `Graph.radius` over a spatial partition.

Each rank owns the points recursive coordinate bisection gives it and the box around them;
its ghosts are the other ranks' points within the cutoff of that box (a superset of the
sources its rows read: a point within the cutoff of an owned point is within it of the
box). Every rank computes every box from the same coordinates, so what rank r sends to q
(r's points near q's box) is exactly what q expects from r, in the same order, with no
message. The rank then searches its own rows only, against owned + ghost points: no rank
builds the global relation. Rows list sources in ascending global id and local edges carry
their global edge ids, as in one process.

The coordinates are a hidden source field of every propagate (`edge.displacement`,
`edge.distance`), so the runtime exchanges them with the values on each call and a
gradient with respect to them sends its ghost rows back to their owners like any other.
"""
from __future__ import annotations

import numpy as np

from ...core.errors import GraphValidationError, ShapeError, UnsupportedError
from ...core.graph_generated import radius_csr
from .halo import HaloPlan

BOX_SLACK = 1.0 + 1e-9     # box distances in float64 vs the search's dtype: err on more ghosts


def check_radius(graph, method: str, positions) -> None:
    """A radius relation partitions spatially over its own coordinates, one point set."""
    p = graph.params
    if method != "spatial":
        raise UnsupportedError(f"method: a radius relation partitions with method='spatial' "
                               f"(boxes and ghosts within the cutoff), found {method!r}")
    if positions is not None:
        raise GraphValidationError("positions: a radius relation partitions over its own "
                                   "coordinates; pass positions=None")
    if p.get("query") is not None or p.get("max_neighbors") is not None:
        raise UnsupportedError(
            "graph: a distributed radius relation needs one point set (query=None) and no "
            f"max_neighbors, found query={'set' if p.get('query') is not None else None}, "
            f"max_neighbors={p.get('max_neighbors')}")


def boxes(pos: np.ndarray, owner: np.ndarray, size: int) -> np.ndarray:
    """(size, 2, dims) float64 bounding boxes of each rank's points (NaN when it has none)."""
    out = np.full((size, 2, pos.shape[1]), np.nan)
    for r in range(size):
        mine = pos[owner == r]
        if len(mine):
            out[r, 0], out[r, 1] = mine.min(axis=0), mine.max(axis=0)
    return out


def near_box(pos: np.ndarray, box: np.ndarray, cutoff: float) -> np.ndarray:
    """Boolean mask of the points within `cutoff` of `box` (none for an empty box)."""
    if np.isnan(box).any():
        return np.zeros(len(pos), bool)
    gap = np.maximum(np.maximum(box[0] - pos, pos - box[1]), 0.0)
    return np.sqrt((gap * gap).sum(axis=1)) <= cutoff * BOX_SLACK


def radius_plan(graph, owner: np.ndarray, rank: int, size: int, degrees_of) -> tuple:
    """(HaloPlan, owned coordinates in local row order) of `rank`.

    `degrees_of(owned_sorted, counts)` returns the global in-degree of every point (ranks
    exchange their rows' counts: no rank searches another's rows)."""
    p = graph.params
    pos, cutoff, loop = p["positions"], float(p["cutoff"]), bool(p["loop"])
    pos64 = np.asarray(pos, np.float64)
    box = boxes(pos64, owner, size)
    mine = np.flatnonzero(owner == rank).astype(np.int64)
    near_me = near_box(pos64, box[rank], cutoff) & (owner != rank)
    ghost_ids = np.flatnonzero(near_me).astype(np.int64)
    ghost_ids = ghost_ids[np.argsort(owner[ghost_ids], kind="stable")]
    ids = np.concatenate([mine, ghost_ids])
    row_ptr, col, _ = radius_csr(pos[ids], pos[mine], cutoff, True, None)
    dst = np.repeat(np.arange(len(mine), dtype=np.int64), np.diff(row_ptr))
    keep = loop | (col != dst)          # dropped by index, as the one-process search does
    dst, col = dst[keep], col[keep]
    gcol = ids[col]
    order = np.lexsort((gcol, dst))     # rows list sources in ascending global id
    dst, col, gcol = dst[order], col[order], gcol[order]
    counts = np.bincount(dst, minlength=len(mine))
    degree = degrees_of(mine, counts)
    starts = np.concatenate([[0], np.cumsum(degree)[:-1]]).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    edge_ids = (starts[mine[dst]] + np.arange(len(dst)) - first[dst] if len(dst) else
        np.zeros(0, np.int64))
    # interior rows (every source owned) first, then boundary rows
    boundary = np.bincount(dst[col >= len(mine)], minlength=len(mine)) > 0
    rows = np.concatenate([np.flatnonzero(~boundary), np.flatnonzero(boundary)])
    local = np.empty(len(ids), np.int64)
    local[rows] = np.arange(len(rows))
    local[len(mine):] = np.arange(len(mine), len(ids))
    by_row = np.argsort(local[dst], kind="stable")
    new_counts = counts[rows]
    peers, starts_g = np.unique(owner[ghost_ids], return_index=True)
    stops = np.append(starts_g[1:], len(ghost_ids))
    recv = tuple((int(q), int(a), int(b)) for q, a, b in zip(peers, starts_g, stops))
    send = []
    for q in range(size):
        if q == rank:
            continue
        out = mine[near_box(pos64[mine], box[q], cutoff)]    # ascending global id
        if len(out):
            send.append((q, local[np.searchsorted(mine, out)]))
    plan = HaloPlan(rank=rank, owned=mine[rows], n_interior=int((~boundary).sum()),
                    ghosts=ghost_ids, recv=recv, send=tuple(send),
                    row_ptr=np.concatenate([[0], np.cumsum(new_counts)]).astype(np.int64),
                    col_idx=local[col[by_row]], edge_ids=edge_ids[by_row].astype(np.int64))
    return plan, np.ascontiguousarray(pos[plan.owned])


def generated_params(graph, owned_pos: np.ndarray) -> dict:
    """The params a DistributedGraph over a radius relation shows the tracer: its owned
    coordinates are the hidden source and destination fields of every propagate."""
    p = graph.params
    return {"cutoff": p["cutoff"], "loop": p["loop"], "max_neighbors": None, "query": None,
            "positions": owned_pos, "dims": owned_pos.shape[1], "inputs": (owned_pos, None)}


def checked_positions(dg, positions):
    """`positions` as this rank's owned coordinates (n_owned, dims) for `dg.at`."""
    shape = tuple(positions.shape if hasattr(positions, "shape") else np.shape(positions))
    want = (dg.plan.n_owned, dg.params["dims"])
    if shape != want:
        raise ShapeError(f"positions: expected this rank's owned coordinates of shape "
                         f"{want} (local row order, see dg.positions), found {shape}")
    return positions


__all__ = ["check_radius", "radius_plan", "generated_params", "checked_positions", "boxes",
           "near_box"]
