"""Brute-force numpy oracle of the generated relations (every pair, no directory)."""
from __future__ import annotations

import numpy as np


def pair_distances(positions: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(num_query, num_src) distances in the coordinates' dtype, squares added in axis order."""
    d2 = None
    for k in range(positions.shape[1]):
        diff = positions[None, :, k] - query[:, None, k]
        d2 = diff * diff if d2 is None else d2 + diff * diff
    return np.sqrt(d2)


def radius_rows(positions, cutoff, query=None, loop=False, max_neighbors=None):
    """[sorted source list per destination] (ascending source ids)."""
    q = positions if query is None else query
    dist = pair_distances(positions, q)
    ok = dist <= positions.dtype.type(cutoff)
    if query is None and not loop:
        np.fill_diagonal(ok, False)
    rows = []
    for i in range(len(q)):
        src = np.nonzero(ok[i])[0]
        if max_neighbors is not None and len(src) > max_neighbors:
            near = sorted(src.tolist(), key=lambda j: (dist[i, j], j))[:max_neighbors]
            src = np.array(sorted(near), dtype=np.int64)
        rows.append(src.astype(np.int64))
    return rows


def knn_rows(positions, k, query=None, loop=False):
    """[k source ids per destination, nearest first, ties by smaller id]."""
    q = positions if query is None else query
    dist = pair_distances(positions, q)
    rows = []
    for i in range(len(q)):
        cand = [j for j in range(len(positions)) if loop or query is not None or j != i]
        rows.append(np.array(sorted(cand, key=lambda j: (dist[i, j], j))[:k], np.int64))
    return rows


def truncated(positions, cutoff, max_neighbors, query=None, loop=False):
    full = radius_rows(positions, cutoff, query, loop)
    return sum(len(r) > max_neighbors for r in full)


def csr_rows(graph) -> list:
    row_ptr, col_idx = graph.resolve_csr()
    return [np.asarray(col_idx[row_ptr[i]:row_ptr[i + 1]], np.int64)
            for i in range(len(row_ptr) - 1)]


def dense_weights(rows, num_src, weight=None):
    """(num_dst, num_src) matrix with weight(i, j) (default 1) at every edge."""
    w = np.zeros((len(rows), num_src))
    for i, src in enumerate(rows):
        for j in src:
            w[i, j] += 1.0 if weight is None else weight(i, j)
    return w


def point_sets(rng, kind: str, n: int, d: int, dtype=np.float64) -> np.ndarray:
    if kind == "uniform":
        p = rng.random((n, d))
    elif kind == "clustered":
        centres = rng.random((4, d))
        p = centres[rng.integers(0, 4, n)] + 0.02 * rng.standard_normal((n, d))
    elif kind == "duplicated":
        base = rng.random((max(1, n // 4), d))
        p = base[rng.integers(0, len(base), n)]
    elif kind == "grid":
        side = int(np.ceil(n ** (1.0 / d)))
        axes = np.meshgrid(*[np.arange(side)] * d, indexing="ij")
        p = np.stack([a.reshape(-1) for a in axes], axis=1)[:n] * 0.125
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(p, dtype=dtype)
