"""lower/triton: the kNN relation's neighbour lists over cell tiles (1..3 coordinates), as
Triton source: the cell-shell selection (generated.py's cube helpers) with a program per
BLOCK_R rows (it was one program per row, `knn_shells`).

`knn_tiles`: a program owns BLOCK_R rows consecutive in `row_order` (one point set: the
directory's cell order, so its rows are the points of one or two adjacent cells; a query
set: its own order). Each row's cube of cells within Chebyshev distance s of its own cell
is read run by run (a run: the cells along the last axis, one range of cell_order) as
[BLOCK_R, BLOCK] tiles of candidates (row i's lanes hold its own run's candidates: rows of
one cell load the same ids), and the k-round selection (the smallest
(d2, index) pair strictly after the previous round's) runs on every row of the tile at
once. s is the program's: it grows until every live row's cube holds k (+1 when a row's
own point is excluded) candidates or covers the grid, then until every row's cube is safe
(no source outside it is nearer than its k-th candidate), as for one row; a larger cube
than a row needs only adds candidates farther than its k nearest, so each row's list is
the full scan's (the reference's order: nearest first, ties by the smaller index).
"""
from __future__ import annotations

from .generated import KNN_SHELL_HELPERS, _linear, _names

TAKE_BEST_ROWS = '''

@triton.jit
def _take_best_rows(ok, d2, c, r, prev_d, prev_i, best_d, best_i, n_src, EXCL: tl.constexpr,
                    PT: tl.constexpr):
    # generated._take_best per row of a [rows, BLOCK] tile: rows' states are [rows] vectors
    if EXCL:
        ok = ok & (c != r[:, None])
    ok = ok & ((d2 > prev_d[:, None]) | ((d2 == prev_d[:, None]) & (c > prev_i[:, None])))
    dm = tl.where(ok, d2, float("inf")).to(PT)
    tmin = tl.min(dm, axis=1)
    imin = tl.min(tl.where(ok & (dm == tmin[:, None]), c, n_src), axis=1)
    better = (tmin < best_d) | ((tmin == best_d) & (imin < best_i))
    return tl.where(better, tmin, best_d), tl.where(better, imin, best_i)
'''

TILE_SOURCE = '''

@triton.jit
def _tile_select(pos, cols, cell_order, cell_start, r, live, s, n_src, K, {qx}, {qc}, {gd},
                 EXCL: tl.constexpr, PT: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK: tl.constexpr):
    lane = tl.arange(0, BLOCK)
    side = 2 * s + 1
    prev_d = tl.full([BLOCK_R], float("-inf"), PT)
    prev_i = r * 0 - 1
    for j in range(0, K):
        best_d = tl.full([BLOCK_R], float("inf"), PT)
        best_i = r * 0 + n_src
        for cell in range(0, {cells}):
            c0, c1 = _cell_range(cell_start, cell, s, {qc}, {gd})
            c1 = tl.where(live, c1, c0)
            for start in range(0, tl.max(c1 - c0, axis=0), BLOCK):
                p = c0[:, None] + start + lane[None, :]
                ok = p < c1[:, None]
                c = tl.load(cell_order + p, mask=ok, other=0).to(tl.int64)
{distance}
                best_d, best_i = _take_best_rows(ok, d2, c, r, prev_d, prev_i, best_d, best_i,
                                                 n_src, EXCL, PT)
        tl.store(cols + r * K + j, best_i, mask=live)
        prev_d = best_d
        prev_i = best_i
    return prev_d


@triton.jit
def knn_tiles(pos, qpos, cols, cell_start, cell_order, row_order, grid_lo, grid_dims,
              walk_scal, n_rows, n_src, K, EXCL: tl.constexpr, PT: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    rp = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rp < n_rows
    r = tl.load(row_order + tl.minimum(rp, n_rows - 1)).to(tl.int64)
    inv_w = tl.load(walk_scal)
    w = tl.load(walk_scal + 1)
{setup}
    need = K
    if EXCL:
        need = K + 1
    s = tl.program_id(0).to(tl.int64) * 0
    full = _cube_full(s, {qc}, {gd})
    found = _cube_count(cell_start, s, {qc}, {gd})
    while tl.max(tl.where(live & (found < need) & (full == 0), 1, 0), axis=0) > 0:
        s += 1
        full = _cube_full(s, {qc}, {gd})
        found = _cube_count(cell_start, s, {qc}, {gd})
    kth = _tile_select(pos, cols, cell_order, cell_start, r, live, s, n_src, K, {qx}, {qc},
                       {gd}, EXCL, PT, BLOCK_R, BLOCK).to(tl.float64)
    s2 = s
    # (a relative margin for d2's rounding in PT, an absolute one for the binning's)
    safe = _cube_bound(s2, w, {qx64}, {lo}, {qc}, {gd}) - w * 1e-6
    while tl.max(tl.where(live & (full == 0) &
                          ((safe <= 0) | (safe * safe <= kth * (1.0 + 1e-4))), 1, 0),
                 axis=0) > 0:
        s2 += 1
        full = _cube_full(s2, {qc}, {gd})
        safe = _cube_bound(s2, w, {qx64}, {lo}, {qc}, {gd}) - w * 1e-6
    if s2 > s:
        _tile_select(pos, cols, cell_order, cell_start, r, live, s2, n_src, K, {qx}, {qc},
                     {gd}, EXCL, PT, BLOCK_R, BLOCK)
'''


def knn_tile_source(dims: int) -> str:
    """The `knn_tiles` module for points of `dims` (1..3) coordinates."""
    ax = range(dims)
    last = dims - 1
    decode = "\n".join(f"    n{k} = qc{k} - s + rem % side\n    rem = rem // side"
                       for k in reversed(range(last)))
    inside = [f"(n{k} >= 0) & (n{k} < gd{k})" for k in range(last)] + ["(a <= b)"]
    faces = "\n".join(
        f"    b = tl.where(qc{k} - s > 0, tl.minimum(b, qx{k} - (lo{k} + (qc{k} - s) * w)), b)\n"
        f"    b = tl.where(qc{k} + s < gd{k} - 1, tl.minimum(b, lo{k} + (qc{k} + s + 1) * w - "
        f"qx{k}), b)" for k in ax)
    distance = "\n".join(
        f"                dx = tl.load(pos + c * {dims} + {k}, mask=ok, other=0) - "
        f"qx{k}[:, None]\n"
        + ("                d2 = dx * dx" if k == 0 else "                d2 = d2 + dx * dx")
        for k in ax)
    setup = "\n".join(
        f"    qx{k} = tl.load(qpos + r * {dims} + {k})\n"
        f"    qx64_{k} = qx{k}.to(tl.float64)\n"
        f"    gd{k} = tl.load(grid_dims + {k})\n"
        f"    lo{k} = tl.load(grid_lo + {k})\n"
        f"    f{k} = tl.floor((qx64_{k} - lo{k}) * inv_w)\n"
        f"    qc{k} = tl.minimum(tl.maximum(f{k}, 0.0), (gd{k} - 1).to(tl.float64))"
        ".to(tl.int64)" for k in ax)
    subs = dict(
        qc=_names("qc", dims), gd=_names("gd", dims), qx=_names("qx", dims),
        qx64=_names("qx64_", dims), lo=_names("lo", dims),
        decode=decode, inside=" & ".join(inside), last=last,
        linear_a=_linear(dims, "a"), linear_b=_linear(dims, "b"),
        cells=" * ".join(["side"] * last) or "1",
        full=" & ".join(f"(qc{k} - s <= 0) & (qc{k} + s >= gd{k} - 1)" for k in ax),
        faces=faces, distance=distance, setup=setup)
    head = ("# generated by tiga (lower/triton/knn_tiles.py); do not edit\n"
            "import triton\nimport triton.language as tl\n" + TAKE_BEST_ROWS)
    return head + KNN_SHELL_HELPERS.format(**subs) + TILE_SOURCE.format(**subs)
