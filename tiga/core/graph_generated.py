"""core: generated relations: input checks, the cell directory and exact CSR.

`radius` and `knn` relations are generated from coordinates. Their exact semantics live
here, in numpy, so the reference path (resolve_csr) and every compiled traversal agree:

- distances are computed in the coordinates' dtype as `sqrt(sum_k (p_src[k] - p_dst[k])**2)`
  with the squares added in axis order (no fused multiply-add);
- radius keeps a source when `distance <= cutoff` (inclusive); with `max_neighbors` a row
  keeps its `max_neighbors` nearest accepted sources (ties by smaller source index) and the
  rows that lost sources are counted, never silently;
- knn keeps the k nearest sources per destination, ties by smaller source index;
- `loop=False` drops the pair (i, i) when the query set is the source set itself. The pair is
  dropped by index, never by distance: with coordinates near the dtype's range squared
  distances overflow to +inf, and a point must still not list itself among the inf ties.

Non-finite distances: coordinates are finite (checked), so a squared distance is a sum of
non-negative terms in [0, +inf] and is never NaN; +inf (overflow) orders after every finite
distance and inf ties go to the smaller source index, like every other tie. (Were a NaN ever
to arise it would sort last, after +inf: numpy's sort order, which the compiled kernels'
fallback scan also follows.)

Coordinates may have any number of dims. The reference computes distances in bounded tiles
(at most TILE_ELEMENTS pair-coordinate elements at once), so no N x N array exists.

Edge order: radius rows list sources in ascending index; knn rows list them nearest first.

The directory bins points into uniform cells at least `cutoff` wide (counting sort by cell,
stable, so each cell holds its points in ascending index) with cell start offsets; the
compiled kernels (lower/llvm/generated.py) walk the same directory.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import GraphValidationError
from .graph_validate import as_numpy

FAST_DIMS = 3            # cell directory up to here; beyond it a tiled scan over all sources
TILE_ELEMENTS = 1 << 22  # reference tiles: pairs x dims held at once (32 MiB of float64)
WIDTH_MARGIN = 1.0 + 2.0 ** -20   # cells a hair wider than the cutoff absorb binning rounding
MAX_CELLS_PER_POINT = 2  # the directory never has many more cells than points


def read_positions(obj: Any, name: str) -> np.ndarray:
    """(n, d) float32/float64 coordinates, d >= 1 (any number of dims), every entry finite."""
    arr = as_numpy(obj, name)
    if arr.dtype.kind in "iub":
        arr = arr.astype(np.float64)
    if arr.dtype not in (np.float32, np.float64):
        raise GraphValidationError(f"{name}: has dtype {arr.dtype}, expected float32 or "
                                   "float64 coordinates")
    if arr.ndim != 2:
        raise GraphValidationError(f"{name}: has shape {tuple(arr.shape)}, expected "
                                   "(num_points, dims)")
    if arr.shape[1] < 1:
        raise GraphValidationError(f"{name}: has {arr.shape[1]} coordinate dims, expected "
                                   "at least 1")
    bad = ~np.isfinite(arr)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise GraphValidationError(f"{name}: entry [{row}, {col}] is {arr[row, col]}, "
                                   "expected finite coordinates (no NaN or inf)")
    return np.ascontiguousarray(arr)


def read_query(query: Any, positions: np.ndarray) -> np.ndarray | None:
    if query is None:
        return None
    q = read_positions(query, "query")
    if q.shape[1] != positions.shape[1]:
        raise GraphValidationError(f"query: has {q.shape[1]} coordinate dims, positions have "
                                   f"{positions.shape[1]}; expected the same")
    if q.dtype != positions.dtype:
        raise GraphValidationError(f"query: has dtype {q.dtype}, positions have "
                                   f"{positions.dtype}; expected the same")
    return q


def read_cutoff(cutoff: Any) -> float:
    """A positive cutoff; +inf makes every pair a neighbour (one cell holds every point)."""
    try:
        c = float(cutoff)
    except (TypeError, ValueError):
        raise GraphValidationError(f"cutoff: is {cutoff!r}, expected a positive number "
                                   "(or math.inf)") from None
    if isinstance(cutoff, bool) or np.isnan(c) or c <= 0:
        raise GraphValidationError(f"cutoff: is {cutoff!r}, expected a positive number "
                                   "(cutoff > 0, or math.inf for every pair)")
    return c


def read_flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise GraphValidationError(f"{name}: is {value!r}, expected True or False")
    return bool(value)


def read_k(k: Any, candidates: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise GraphValidationError(f"k: is {k!r}, expected an integer >= 1")
    k = int(k)
    if k < 1 or k > candidates:
        raise GraphValidationError(f"k: is {k}, expected 1 <= k <= {candidates} (the number "
                                   "of candidate sources per destination)")
    return k


def read_max_neighbors(m: Any) -> int | None:
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or int(m) < 1:
        raise GraphValidationError(f"max_neighbors: is {m!r}, expected None or an integer "
                                   ">= 1")
    return int(m)


def candidates_per_row(num_src: int, same: bool, loop: bool) -> int:
    return num_src - (1 if same and not loop else 0)


# ---- the cell directory --------------------------------------------------------------------

def cell_width(positions: np.ndarray, minimum: float, per_cell: float = 1.0) -> float:
    """Width of the uniform cells: at least `minimum`, aiming at `per_cell` points per cell,
    and never more than MAX_CELLS_PER_POINT cells per point (float64)."""
    n, d = positions.shape
    if n == 0:
        return max(minimum, 1.0)
    extents = _extents(positions)
    extent = extents.max()
    w = minimum * WIDTH_MARGIN
    if extent > 0:
        target = extent * (per_cell / n) ** (1.0 / d)
        w = max(w, target * WIDTH_MARGIN)
        # cap the cell count: prod over axes of (extent / w + 1) <= MAX_CELLS_PER_POINT * n
        while np.prod(np.floor(extents / w) + 1.0) > MAX_CELLS_PER_POINT * n + 8:
            w *= 1.25
    return float(w)


def squared_cutoff(cutoff: float, dtype) -> float:
    """The largest v of `dtype` with sqrt(v) <= cutoff (in dtype): `d2 <= v` is exactly the
    predicate `sqrt(d2) <= cutoff` (sqrt is correctly rounded and monotonic)."""
    t = np.dtype(dtype).type
    c = t(cutoff)
    inf, zero = t(np.inf), t(0)
    with np.errstate(over="ignore"):    # a cutoff past sqrt(max) squares to +inf
        v = t(c * c)
        while v > 0 and np.sqrt(v) > c:
            v = np.nextafter(v, zero)
        while np.isfinite(v) and np.sqrt(np.nextafter(v, inf)) <= c:
            v = np.nextafter(v, inf)
    return float(v)


def _extents(positions: np.ndarray) -> np.ndarray:
    lo, hi = bounds(positions)
    return hi - lo


def bounds(positions: np.ndarray) -> tuple:
    """(per-axis min, per-axis max) as float64, one column at a time: numpy's axis-0
    reduction of an (N, 3) array runs an inner loop of 3 and took ~4 ms at N = 131,072,
    a column's ~0.2 ms (same values, NaN included)."""
    cols = range(positions.shape[1])
    return (np.array([positions[:, k].min() for k in cols], np.float64),
            np.array([positions[:, k].max() for k in cols], np.float64))


def grid_of(positions: np.ndarray, width: float) -> tuple:
    """(lo float64[d], inv_width, dims int64[d]) of the directory over `positions`."""
    d = positions.shape[1]
    if positions.shape[0] == 0:
        return np.zeros(d), 1.0 / width, np.ones(d, np.int64)
    lo = positions.min(axis=0).astype(np.float64)
    dims = (np.floor(_extents(positions) / width) + 1).astype(np.int64)
    return lo, 1.0 / width, dims


def cell_coords(points: np.ndarray, lo: np.ndarray, inv_w: float,
                dims: np.ndarray) -> np.ndarray:
    """Clamped integer cell coordinates (points outside the grid go to its border cells)."""
    c = np.floor((points.astype(np.float64) - lo) * inv_w)
    return np.clip(c, 0, dims - 1).astype(np.int64)


def linear_cell(coords: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """C order: the last axis is contiguous, so a run along it is one index range."""
    lin = np.zeros(coords.shape[0], np.int64)
    for k in range(coords.shape[1]):
        lin = lin * dims[k] + coords[:, k]
    return lin


def directory(positions: np.ndarray, width: float) -> dict:
    """Counting sort of the points by cell: {lo, inv_w, dims, cell_start, order}."""
    lo, inv_w, dims = grid_of(positions, width)
    cells = int(np.prod(dims))
    lin = linear_cell(cell_coords(positions, lo, inv_w, dims), dims)
    counts = np.bincount(lin, minlength=cells)
    cell_start = np.zeros(cells + 1, np.int64)
    np.cumsum(counts, out=cell_start[1:])
    order = np.argsort(lin, kind="stable").astype(np.int64)
    return {"lo": lo, "inv_w": inv_w, "dims": dims, "cell_start": cell_start, "order": order}


# ---- exact relations (the oracle semantics, materialised) ----------------------------------

def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum over axes, in axis order and in the coordinates' dtype, of (a - b)**2 (overflow
    to +inf is a valid distance: see the module docstring)."""
    with np.errstate(over="ignore"):
        diff = b[..., 0] - a[..., 0]
        d2 = diff * diff
        for k in range(1, a.shape[-1]):
            diff = b[..., k] - a[..., k]
            d2 = d2 + diff * diff
    return d2


def _candidate_pairs(positions, query, width):
    """All (dst, src) pairs whose cells are neighbours (d <= 3) or every pair (tiled)."""
    n, d = query.shape
    m = positions.shape[0]
    if d > FAST_DIMS or m == 0 or n == 0:
        step = max(1, TILE_ELEMENTS // max(m * d, 1))   # the gathered (pairs, d) stay bounded
        for start in range(0, n, step):
            stop = min(n, start + step)
            dst = np.repeat(np.arange(start, stop, dtype=np.int64), m)
            src = np.tile(np.arange(m, dtype=np.int64), stop - start)
            yield dst, src
        return
    dirx = directory(positions, width)
    qc = cell_coords(query, dirx["lo"], dirx["inv_w"], dirx["dims"])
    dims, cs, order = dirx["dims"], dirx["cell_start"], dirx["order"]
    for off in np.array(np.meshgrid(*[[-1, 0, 1]] * d, indexing="ij")).reshape(d, -1).T:
        c = qc + off
        ok = np.all((c >= 0) & (c < dims), axis=1)
        rows = np.nonzero(ok)[0]
        lin = linear_cell(c[rows], dims)
        start, stop = cs[lin], cs[lin + 1]
        counts = stop - start
        dst = np.repeat(rows, counts)
        first = np.repeat(start - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        yield dst, order[first + np.arange(len(dst))]


def radius_csr(positions: np.ndarray, query: np.ndarray | None, cutoff: float, loop: bool,
               max_neighbors: int | None) -> tuple:
    """(row_ptr int64, col_idx int64, truncated_rows) of the exact radius relation."""
    same = query is None
    q = positions if same else query
    c = positions.dtype.type(cutoff)
    dsts, srcs, d2s = [], [], []
    for dst, src in _candidate_pairs(positions, q, cell_width(positions, cutoff)):
        d2 = squared_distances(q[dst], positions[src])
        keep = np.sqrt(d2) <= c
        if same and not loop:
            keep &= dst != src
        dsts.append(dst[keep])
        srcs.append(src[keep])
        d2s.append(d2[keep])
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    d2 = np.concatenate(d2s) if d2s else np.zeros(0, positions.dtype)
    counts = np.bincount(dst, minlength=q.shape[0])
    truncated = 0
    if max_neighbors is not None:
        truncated = int(np.count_nonzero(counts > max_neighbors))
        by_near = np.lexsort((src, d2, dst))
        dst, src = dst[by_near], src[by_near]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(len(dst)) - np.repeat(starts, counts)
        keep = rank < max_neighbors
        dst, src = dst[keep], src[keep]
        counts = np.minimum(counts, max_neighbors)
    perm = np.lexsort((src, dst))
    row_ptr = np.zeros(q.shape[0] + 1, np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    return row_ptr, src[perm].astype(np.int64), truncated


def knn_csr(positions: np.ndarray, query: np.ndarray | None, k: int, loop: bool) -> tuple:
    """(row_ptr int64, col_idx int64): the k nearest sources per row, nearest first, ties by
    smaller source index (exact). Rows are scanned in tiles of TILE_ELEMENTS distances; per
    row the (k+1)-th smallest distance bounds the candidates (every tie of it included), which
    are then ordered by (distance, index). With loop=False and query=None the row's own
    index is removed from its candidates (by index: see the module docstring)."""
    same = query is None
    q = positions if same else query
    n, m = q.shape[0], positions.shape[0]
    drop_self = same and not loop
    need = k + 1 if drop_self else k        # candidates that survive removing oneself
    cols = np.empty((n, k), np.int64)
    step = max(1, TILE_ELEMENTS // max(m, 1))
    for start in range(0, n, step):
        stop = min(n, start + step)
        d2 = squared_distances(q[start:stop, None, :], positions[None, :, :])
        cols[start:stop] = _nearest(d2, np.arange(start, stop), need, k, drop_self)
    return np.arange(n + 1, dtype=np.int64) * k, cols.reshape(-1)


def _nearest(d2: np.ndarray, rows: np.ndarray, need: int, k: int, drop_self: bool):
    """(rows, k) source indices: per row of d2 the k smallest by (distance, index)."""
    m = d2.shape[1]
    if need < m:
        bound = np.partition(d2, need - 1, axis=1)[:, need - 1]
        cand = ~(d2 > bound[:, None])     # every tie of the bound (NaN, if any, last)
    else:
        cand = np.ones(d2.shape, bool)
    if drop_self:
        cand[np.arange(len(rows)), rows] = False
    r, c = np.nonzero(cand)
    order = np.lexsort((c, d2[r, c], r))
    r, c = r[order], c[order]
    counts = np.bincount(r, minlength=len(rows))
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(r)) - np.repeat(first, counts)
    return c[rank < k].reshape(len(rows), k)
