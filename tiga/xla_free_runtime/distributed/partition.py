"""runtime/distributed: which rank owns each destination row ("rows", "edges", "spatial").

Pure numpy, deterministic: every rank computes the same owner array from the same graph, so
no rank has to ask another who owns what.
"""
from __future__ import annotations

import numpy as np

from ...core.errors import GraphValidationError, ShapeError

METHODS = ("rows", "edges", "spatial")


def owners(row_ptr: np.ndarray, size: int, method: str, positions=None) -> np.ndarray:
    """int32 owner rank of each destination row (len(row_ptr) - 1 rows) over `size` ranks."""
    n = len(row_ptr) - 1
    if method not in METHODS:
        raise GraphValidationError(f"method: must be one of {METHODS}, found {method!r}")
    if method == "spatial":
        return _spatial(_checked_positions(positions, n), size)
    if positions is not None:
        raise GraphValidationError(f"positions: only method='spatial' reads positions, "
                                   f"found method={method!r}")
    if n == 0:
        return np.zeros(0, np.int32)
    if method == "rows":
        bounds = (np.arange(size + 1, dtype=np.int64) * n) // size
    else:
        # contiguous row blocks with about the same number of edges (rows break ties, so
        # a graph without edges still splits by rows)
        work = np.asarray(row_ptr, np.int64) + np.arange(n + 1, dtype=np.int64)
        targets = (np.arange(1, size, dtype=np.float64) * work[-1]) / size
        inner = np.clip(np.searchsorted(work, targets, side="left"), 1, n)
        below = np.abs(work[inner - 1] - targets) <= np.abs(work[inner] - targets)
        inner = np.maximum.accumulate(inner - below)     # the cut nearest each target
        bounds = np.concatenate([[0], inner, [n]]).astype(np.int64)
    return np.repeat(np.arange(size, dtype=np.int32), np.diff(bounds))


def _checked_positions(positions, n: int) -> np.ndarray:
    if positions is None:
        raise GraphValidationError("positions: method='spatial' needs positions, an array "
                                   "(num_dst, dims) of coordinates; found None")
    pos = np.asarray(positions, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[0] != n:
        raise ShapeError(f"positions: expected shape ({n}, dims) (one point per destination "
                         f"row), found {pos.shape}")
    if not np.isfinite(pos).all():
        raise GraphValidationError("positions: coordinates must be finite, found NaN or inf")
    return pos


def _spatial(pos: np.ndarray, size: int) -> np.ndarray:
    """Recursive coordinate bisection: split the longest extent at the point that gives
    each half its share of ranks, until one rank per box."""
    owner = np.zeros(len(pos), np.int32)
    stack = [(np.arange(len(pos), dtype=np.int64), 0, size)]
    while stack:
        ids, first, parts = stack.pop()
        if parts == 1 or len(ids) == 0:
            owner[ids] = first
            continue
        left = parts // 2
        pts = pos[ids]
        axis = int(np.argmax(pts.max(axis=0) - pts.min(axis=0)))
        order = np.argsort(pts[:, axis], kind="stable")
        cut = (len(ids) * left) // parts
        stack.append((ids[order[:cut]], first, left))
        stack.append((ids[order[cut:]], first + left, parts - left))
    return owner


__all__ = ["owners", "METHODS"]
