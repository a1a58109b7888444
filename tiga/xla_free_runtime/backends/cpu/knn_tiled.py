"""runtime: the per-call arrays of the knn-tiled-scan walk (lower/llvm/knn_tiled.py).

Per relation (cached with it: its coordinates are frozen) the sources are packed into
coordinate-major panels of W points with their filter norms `(1 - c) |p|^2` (padding lanes
+inf), and the queries get `(1 - c) |q|^2`. Per call each row gets a top-k state (distances,
source ids, count, filter threshold): O(N k) scratch, like the relation's own edge list, and
never an N x M array. After a call over every row the state's ids are the relation's exact
CSR (nearest first, ties by smaller index, as core/graph_generated.knn_csr), so the relation
keeps them (not as its CSR: its forward propagates keep the fused walk); its VJP's
source-grouped propagates adopt them as the CSR instead of re-running the selection in
the numpy reference.
"""
from __future__ import annotations

import numpy as np

from ....core import graph_build as gb
from ....lower.llvm.knn_tiled import filter_constants
from ...caches.relations import memo

# (rows per query tile and source chunk bytes are the launch's schedule tiles:
# lower/schedule.knn_tiles)
FIT_MARGIN = 8.0             # |q|^2 + |p|^2 below max / 8: the expanded form cannot overflow
MATERIALIZED = ("source panels (coordinate-major blocks of vector width, padded) and norms, "
                "query norms, per-row top-k state (k distances and ids, count, threshold)",
                "packed per relation (O(N d)), state per call (O(N k)); no N x M distances")


def _sq_norms(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        x64 = x.astype(np.float64)
        return np.einsum("ij,ij->i", x64, x64)


def expanded_form_fits(graph) -> bool:
    """Whether |q|^2 + |p|^2 stays far below the coordinates' largest value, so the filter's
    `|p|^2 - 2 q.p` never overflows (else the kernel would be the plain exact scan)."""
    pos, q = graph.params["positions"], graph.query_positions
    if len(pos) == 0 or len(q) == 0:
        return True
    top = float(np.finfo(pos.dtype).max)
    worst = float(_sq_norms(pos).max()) + float(_sq_norms(q).max())
    return bool(np.isfinite(worst) and worst * FIT_MARGIN < top)


def tiled_arrays(pos: np.ndarray, q: np.ndarray, spec, tiles: dict) -> dict:
    """geo_f, geo_i, panel, pnorm, qpos, qnorm for the knn-tiled-scan kernel; `tiles` are
    the launch's schedule tiles (rows_per_tile queries scan chunk_bytes of panels)."""
    lanes, _, vectors = spec.block
    m, d = pos.shape
    dtype = pos.dtype
    c, delta = filter_constants(d, dtype.name)
    blocks = -(-max(m, 1) // lanes)
    blocks = -(-blocks // vectors) * vectors            # whole groups of V panels
    padded = np.zeros((blocks * lanes, d), dtype)
    padded[:m] = pos
    panel = np.ascontiguousarray(padded.reshape(blocks, lanes, d).transpose(0, 2, 1))
    pnorm = np.full(blocks * lanes, np.inf, dtype)
    pnorm[:m] = ((1.0 - c) * _sq_norms(pos)).astype(dtype)
    qnorm = ((1.0 - c) * _sq_norms(q)).astype(dtype)
    per_panel = lanes * d * dtype.itemsize
    chunk = max(vectors, (tiles["chunk_bytes"] // per_panel) // vectors * vectors)
    geo_f = np.array([1.0 + c, delta, float(np.finfo(dtype).max)], np.float64)
    geo_i = np.array([m, blocks, chunk, tiles["rows_per_tile"]], np.int64)
    return {"geo_f": geo_f, "geo_i": geo_i, "panel": panel, "pnorm": pnorm,
            "qpos": np.ascontiguousarray(q), "qnorm": qnorm}


def scratch(n: int, spec) -> dict:
    """Per-call top-k state of every destination row."""
    k = spec.k
    dtype = np.dtype(spec.pos_dtype)
    return {"tile_d": np.empty(max(n * k, 1), dtype), "tile_i": np.empty(max(n * k, 1),
                                                                          np.int64),
            "tile_thr": np.empty(max(n, 1), dtype), "tile_n": np.empty(max(n, 1), np.int64)}


def keep_csr(graph, arrays: dict, spec) -> None:
    """Keep the ids a call over every row selected (its scratch state: no copy) with the
    relation, for adopt_csr."""
    n, k = graph.num_dst, spec.k
    kept = memo(graph)
    if (getattr(graph, "_csr", None) is None and "knn_cols" not in kept
            and bool((arrays["tile_n"][:n] == k).all())):
        kept["knn_cols"] = arrays["tile_i"][:n * k]


def adopt_csr(graph) -> None:
    """A propagate that needs the relation's CSR (grouped by source: the VJP's source and
    coordinate cotangents) takes the ids a knn-tiled-scan call selected (they equal
    core/graph_generated.knn_csr's) instead of re-running the selection in numpy."""
    cols = memo(graph).pop("knn_cols", None) if graph.kind == "knn" else None
    if cols is None or getattr(graph, "_csr", None) is not None:
        return
    graph._csr = gb.freeze(np.arange(graph.num_dst + 1, dtype=np.int64) * graph.params["k"],
                           cols)


def panel_bytes(m: int, n: int, spec) -> int:
    lanes, _, vectors = spec.block
    itemsize = np.dtype(spec.pos_dtype).itemsize
    blocks = -(-max(m, 1) // lanes)
    blocks = -(-blocks // vectors) * vectors            # whole groups of V panels
    panels = blocks * lanes * (spec.dims + 1) * itemsize
    return panels + n * itemsize + n * (spec.k * (itemsize + 8) + itemsize + 8)


def describe_walk(spec, tiles: dict) -> str:
    lanes, rows, vectors = spec.block
    return (f"knn-tiled-scan (a tiled scan; {spec.dims}-D coordinates: above 3 dims the "
            f"cell directory degenerates; tiles of {tiles['rows_per_tile']} queries x chunks "
            f"of source panels sized for L2; a register-blocked {rows} x {vectors * lanes} "
            "product |p|^2 - 2 q.p filters against each row's k-th exact distance (a proven "
            "lower bound), and the lanes that pass are re-scored exactly in the reference's "
            "float order and kept in a sorted top-k state, ties by smaller source index; "
            "exact, O(N*M*d) work, no N x M array)")
