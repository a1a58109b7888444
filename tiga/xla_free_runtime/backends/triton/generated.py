"""runtime: the generated relations (radius, kNN) on the Triton backends, built on the launch
device from the relation's coordinates.

- radius: the propagate kernel walks a cell directory (lower/triton/walks.py); the
  directory's counting sort (cell_start, cell_order) runs as torch ops on the launch device
  (torch_bridge/triton_buffers.py). The grid's origin, cell width and cell counts are
  O(dims) host numbers from the reference's rule (core.graph_generated), computed from the
  relation's host coordinates.
- kNN: `knn_tiles` (lower/triton/knn_tiles.py; up to 3 coordinates: cell shells of a
  directory counting-sorted on the device, as radius) or `knn_select` (a scan of every
  source) writes each row's k nearest sources on the device; the propagate kernel walks
  that CSR (row_ptr = k * row).
Propagates grouped by source over kNN (its VJP's source cotangents) read the reference's
transposed CSR.
"""
from __future__ import annotations

import numpy as np

from ....core import graph_generated as geo
from ....lower.triton.generated import knn_source
from ....lower.triton.knn_tiles import knn_tile_source
from ...reports.runs import COUNTERS
from .compile import launch_fixed, tensors

KNN_BLOCK = 64
KNN_SHELL_DIMS = 3     # cell shells up to here; more coordinates scan every source
KNN_TILE_ROWS = 16     # rows per knn_tiles program


def generated_walk(graph, relation: tuple, device: str) -> dict:
    """{slot: tensor} of a radius cell walk or of a kNN relation's CSR, built on `device`."""
    if relation[0] == "radius":
        return _radius_walk(graph, device)
    return _knn_walk(graph, device)


def _radius_walk(graph, device: str) -> dict:
    p = graph.params
    pos = np.asarray(p["positions"])
    query = pos if p["query"] is None else np.asarray(p["query"])
    width = geo.cell_width(pos, float(p["cutoff"]))
    lo, inv_w, dims = geo.grid_of(pos, width)
    buf = tensors()
    tpos = buf.from_array(pos, pos.dtype.name, device)
    start, order = buf.cell_directory(tpos, lo, inv_w, dims)
    exclude_self = p["query"] is None and not p["loop"]
    # the cell-tiled kernel's rows: one point set's in cell order (a program's rows share
    # their cells), a query set's in its own order
    rows = order if p["query"] is None else buf.from_array(
        np.arange(query.shape[0], dtype=np.int64), "int64", device)
    scal = np.array([inv_w, geo.squared_cutoff(float(p["cutoff"]), pos.dtype),
                     float(exclude_self)], np.float64)
    COUNTERS["radius_directories"] += 1
    return {"wpos": tpos, "wqpos": buf.from_array(query, pos.dtype.name, device),
            "cell_start": start, "cell_order": order, "row_order": rows,
            "grid_lo": buf.from_array(lo, "float64", device),
            "grid_dims": buf.from_array(dims, "int64", device),
            "walk_scal": buf.from_array(scal, "float64", device)}


def _knn_walk(graph, device: str) -> dict:
    import triton.language as tl

    backend = "triton-interpreter" if device == "cpu" else "triton"
    p = graph.params
    pos = np.asarray(p["positions"])
    query = pos if p["query"] is None else np.asarray(p["query"])
    n, k, dims = query.shape[0], int(p["k"]), pos.shape[1]
    buf = tensors()
    cols = buf.zeros((max(n * k, 1),), "int64", device)
    if n and k:
        tpos = buf.from_array(pos, pos.dtype.name, device)
        tq = buf.from_array(query, pos.dtype.name, device)
        flags = dict(EXCL=bool(p["query"] is None and not p["loop"]),
                     PT=tl.float64 if pos.dtype == np.float64 else tl.float32,
                     BLOCK=KNN_BLOCK)
        if 1 <= dims <= KNN_SHELL_DIMS:
            _knn_shells(tpos, tq, cols, pos, k, backend, device, flags,
                        same=p["query"] is None)
        else:
            launch_fixed(knn_source(), "knn", backend, "knn_select", (n,),
                         (tpos, tq, cols, pos.shape[0], k), dict(DIMS=dims, **flags))
    COUNTERS["knn_selects"] += 1
    row_ptr = buf.from_array(np.arange(n + 1, dtype=np.int64) * k, "int64", device)
    return {"row_ptr": row_ptr, "col_idx": cols, "edge_perm": None}


def knn_cell_width(pos: np.ndarray, k: int) -> float:
    """Cells of about k / 2 sources: the cube of 3^d cells around a row usually holds k."""
    w = geo.cell_width(pos, 0.0, per_cell=max(1.0, k / 2.0))
    return w if np.isfinite(w) and w > 0 else 1.0   # (every point equal: one cell)


def _knn_shells(tpos, tq, cols, pos: np.ndarray, k: int, backend: str, device: str,
                flags: dict, same: bool) -> None:
    """The k nearest per query row through a cell directory counting-sorted on `device`:
    `knn_tiles` (lower/triton/knn_tiles.py), KNN_TILE_ROWS rows per program, consecutive in
    the directory's cell order for one point set (`same`), in query order otherwise."""
    buf = tensors()
    width = knn_cell_width(pos, k)
    lo, inv_w, gdims = geo.grid_of(pos, width)
    start, order = buf.cell_directory(tpos, lo, inv_w, gdims)
    n = tq.shape[0]
    rows = order if same else buf.from_array(np.arange(n, dtype=np.int64), "int64", device)
    launch_fixed(knn_tile_source(pos.shape[1]), f"knn_tiles{pos.shape[1]}", backend,
                 "knn_tiles", (-(-n // KNN_TILE_ROWS),),
                 (tpos, tq, cols, start, order, rows, buf.from_array(lo, "float64", device),
                  buf.from_array(gdims, "int64", device),
                  buf.from_array(np.array([inv_w, width], np.float64), "float64", device),
                  n, pos.shape[0], k), dict(BLOCK_R=KNN_TILE_ROWS, **flags))
    COUNTERS["knn_shell_walks"] += 1
