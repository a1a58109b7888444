"""lower/triton: how a propagate program finds the edges of its destination row.

A walk is named by a relation descriptor (lower/abi.py's relation_descriptor with
target="triton"; part of the kernel's cache key): ("csr",) walks row_ptr / col_idx (a
stored relation, its transpose by source, and the relations a walk below does not
express); implicit kinds by source walk their transpose natively (walks_transposed.py);
the implicit relations are walked from indices, with no resolved CSR:

- ("dense",): row r owns edges [r*S, r*S + S), edge r*S + j reads source j (S: walk_params).
- ("triangular",): row r owns edges [r(r+1)/2, ... + r + 1), edge start + j reads source j.
- ("cu_seqlens", causal): row r's sequence k by a binary search over cu_ext (K + 2 entries);
  sources cu[k] .. r (causal) or cu[k] .. cu[k+1]-1; seq_edges (K + 1) counts the edges
  before each sequence, so the walk reads O(K) integers and nothing per edge.
- ("stencil", shape, offsets, periodic): row r's lattice coordinates from the static shape,
  plus each offset (stencil_offsets, K x d) gives the neighbour; outside ones are masked (or
  wrapped when periodic). Edge ids: r*K + j (periodic) or the edges before row r (a closed
  form over the lattice, no per-point array) + the number of inside neighbours before j.
- ("radius", dims): a generated relation walked through a cell directory of the source
  points (cells at least `cutoff` wide, counting-sorted on the launch device: cell_start,
  cell_order; grid_lo, grid_dims, walk_scal = (1 / width, squared cutoff, exclude self)).
  Everything but dims is launch data, so the Kernel IR alone names the walk that runs
  (program.ir("triton", ...) prints it).
  The row's cell from its query coordinates (clamped to the grid), then the 3^dims
  neighbour cells, each in tiles of BLOCK_N candidates with the exact test d2 <= c2 (d2
  summed over axes in axis order in the coordinates' dtype; c2 the largest value whose
  sqrt is <= cutoff, so the test is the reference's sqrt(d2) <= cutoff). Edges are not
  numbered (no edge fields), the degree is counted as the tiles go. Symmetric radius (one
  point set, no max_neighbors) is walked the same way by source.

Each walk emits, in the row loop, `e0`, `e1` (the row's edge range) and `cnt` (its degree),
the neighbour-tile loop header, and per tile `valid`, `col` and `eid` (the edge ids). The
radius walk's pieces (emit_radius_query, emit_cell_range, emit_radius_candidates) take the
query ids' name, so the cell-tiled body (cell_tiles.py) emits the same walk per lane.
"""
from __future__ import annotations

from ..abi import TRANSPOSED_KINDS
from .walks_transposed import (
    emit_coords,
    emit_edge_start,
    emit_neighbours,
    emit_sequence,
    emit_transposed_row,
    emit_transposed_tile,
    inside_test,
    transposed_slots,
)

RADIUS_SLOTS = ("wpos", "wqpos", "cell_start", "cell_order", "grid_lo", "grid_dims",
                "walk_scal")


def walk_slots(relation: tuple) -> tuple:
    """The pointer arguments a walk reads, in kernel-argument order."""
    kind = relation[0]
    if kind == "csr":
        return ("row_ptr", "col_idx")
    if kind == "dense":
        return ("walk_params",)
    if kind == "triangular":
        return ()
    if kind == "cu_seqlens":
        return ("walk_params", "cu_ext", "seq_edges")
    if kind == "radius":
        return RADIUS_SLOTS
    if kind in TRANSPOSED_KINDS:
        return transposed_slots(relation)
    return ("stencil_offsets",)


def emit_row(c, relation: tuple) -> None:
    """`e0`, `e1`, `cnt` of row `rr` (`live` false past the last row: no edges)."""
    kind = relation[0]
    if kind == "csr":
        c.emit("e0 = tl.load(row_ptr + rr)")
        c.emit("e1 = tl.where(live, tl.load(row_ptr + rr + 1), e0)")
    elif kind == "dense":
        c.emit("n_src = tl.load(walk_params)")
        c.emit("e0 = rr * n_src")
        c.emit("e1 = tl.where(live, e0 + n_src, e0)")
        c.emit("s0 = rr * 0")
    elif kind == "triangular":
        c.emit("e0 = rr * (rr + 1) // 2")
        c.emit("e1 = tl.where(live, e0 + rr + 1, e0)")
        c.emit("s0 = rr * 0")
    elif kind == "cu_seqlens":
        _emit_sequence_row(c, relation[1])
    elif kind == "radius":
        _emit_radius_row(c, relation)
        return
    elif kind in TRANSPOSED_KINDS:
        emit_transposed_row(c, relation)
    else:
        _emit_stencil_row(c, relation)
    c.emit("cnt = e1 - e0")


def _emit_sequence_row(c, causal: bool) -> None:
    emit_sequence(c)
    c.emit("i_seq = rr - s0")
    if causal:
        c.emit("e0 = tl.load(seq_edges + lo) + i_seq * (i_seq + 1) // 2")
        c.emit("e1 = tl.where(live, e0 + i_seq + 1, e0)")
    else:
        c.emit("n_seq = tl.load(cu_ext + lo + 1) - s0")
        c.emit("e0 = tl.load(seq_edges + lo) + i_seq * n_seq")
        c.emit("e1 = tl.where(live, e0 + n_seq, e0)")


def _emit_stencil_row(c, relation: tuple) -> None:
    _, shape, offsets, periodic = relation
    emit_coords(c, shape)
    if periodic:
        c.emit(f"e0 = rr * {len(offsets)}")
        c.emit(f"e1 = tl.where(live, e0 + {len(offsets)}, e0)")
    else:
        _emit_stencil_offsets(c, shape, offsets)
    c.emit("seen = e0 * 0")


def _emit_stencil_offsets(c, shape: tuple, offsets: tuple) -> None:
    """e0 / e1 of a non-periodic stencil row from its coordinates (the closed form of
    lower/llvm/walks.py's stencil_edge_start), so no per-point array exists."""
    names = [f"coord{a}" for a in range(len(shape))]
    emit_edge_start(c, names, shape, offsets, "e0")
    c.emit("deg = rr * 0")
    for off in offsets:
        c.emit(f"deg = deg + ({inside_test(names, shape, off)}).to(tl.int64)")
    c.emit("e1 = tl.where(live, e0 + deg, e0)")


def _emit_radius_row(c, relation: tuple) -> None:
    emit_radius_query(c, relation[1], "rr")
    c.emit("cnt = rr * 0")


def emit_radius_query(c, dims: int, row: str) -> None:
    """The walk's scalars (`inv_w`, `c2`, `skip`) and, per query id in `row` (the row
    loop's `rr`, a cell tile's per-lane `lr`), its coordinates `qx*`, the grid's `gd*` and
    its cell `qc*` (query coordinates in float64, as the directory places the sources)."""
    c.emit("inv_w = tl.load(walk_scal)")
    c.emit("c2 = tl.load(walk_scal + 1)")
    # walk_scal[2] = 1.0: one point set without loops (a row's own point is no neighbour)
    c.emit(f"skip = tl.where(tl.load(walk_scal + 2) != 0.0, {row}, -1)")
    for k in range(dims):
        c.emit(f"qx{k} = tl.load(wqpos + {row} * {dims} + {k})")
        c.emit(f"gd{k} = tl.load(grid_dims + {k})")
        c.emit(f"qc{k} = tl.floor((qx{k}.to(tl.float64) - tl.load(grid_lo + {k})) * inv_w)"
               ".to(tl.int64)")
        c.emit(f"qc{k} = tl.minimum(tl.maximum(qc{k}, 0), gd{k} - 1)")


def open_loops(c, relation: tuple) -> int:
    """Emit the neighbour-tile loop header(s) (indenting `c`); returns how many it opened."""
    if relation[0] in ("stencil", "stencil_t"):
        c.emit(f"for start in range(0, {len(relation[2])}, BLOCK_N):")
    elif relation[0] == "radius":
        _open_radius_loops(c, relation[1])
        return 2
    else:
        c.emit("for start in range(e0, e1, BLOCK_N):")
    c.indent += 1
    return 1


def _open_radius_loops(c, dims: int) -> None:
    c.emit(f"for cell in range(0, {3 ** dims}):")
    c.indent += 1
    emit_cell_range(c, dims, "live", "rr")
    c.emit("for start in range(e0, e1, BLOCK_N):")
    c.indent += 1


def emit_cell_range(c, dims: int, live: str, row: str) -> None:
    """[`e0`, `e1`) of cell_order: the neighbour cell number `cell` (of 3^dims) of the
    query ids `row` (empty outside the grid or where `live` is false)."""
    c.emit(f"ok = {live}")
    c.emit(f"lin = {row} * 0")
    for k in range(dims):
        c.emit(f"nc = qc{k} + (cell // {3 ** (dims - 1 - k)}) % 3 - 1")
        c.emit(f"ok = ok & (nc >= 0) & (nc < gd{k})")
        c.emit(f"lin = lin * gd{k} + nc")
    c.emit("lin = tl.where(ok, lin, 0)")
    c.emit("e0 = tl.load(cell_start + lin)")
    c.emit("e1 = tl.where(ok, tl.load(cell_start + lin + 1), e0)")


def emit_tile(c, relation: tuple, has_perm: bool) -> None:
    """`valid`, `col` (int64 source ids) and `eid` (edge ids) of one neighbour tile."""
    kind = relation[0]
    if kind == "stencil":
        _emit_stencil_tile(c, relation)
        return
    if kind == "radius":
        _emit_radius_tile(c, relation)
        return
    if kind in TRANSPOSED_KINDS:
        emit_transposed_tile(c, relation)
        return
    c.emit("p = start + nb")
    c.emit("valid = p < e1")
    if kind == "csr":
        c.emit("col = tl.load(col_idx + p, mask=valid, other=0).to(tl.int64)")
    else:   # a contiguous source range from s0
        c.emit("col = tl.where(valid, s0 + (p - e0), 0)")
    if has_perm:
        c.emit("eid = tl.load(edge_perm + p, mask=valid, other=0).to(tl.int64)")
    else:
        c.emit("eid = p")


def _emit_stencil_tile(c, relation: tuple) -> None:
    _, shape, offsets, periodic = relation
    emit_neighbours(c, shape, len(offsets), periodic, "+")
    if periodic:
        c.emit("eid = tl.where(valid, e0 + j, 0)")
    else:   # edges are numbered over the inside neighbours only, in offset order
        c.emit("inside = valid.to(tl.int64)")
        c.emit("eid = tl.where(valid, e0 + seen + tl.cumsum(inside, axis=0) - 1, 0)")
        c.emit("seen = seen + tl.sum(inside, axis=0)")


def _emit_radius_tile(c, relation: tuple) -> None:
    emit_radius_candidates(c, relation[1], "start + nb")
    c.emit("cnt = cnt + tl.sum(valid.to(tl.int64), axis=0)")


def emit_radius_candidates(c, dims: int, first: str) -> None:
    """`valid` (inside [e0, e1) and the cutoff, not `skip`), `col` and `eid` of the
    candidates at cell_order positions `p` = `first` (the caller counts degrees)."""
    c.emit(f"p = {first}")
    c.emit("valid = p < e1")
    c.emit("col = tl.load(cell_order + p, mask=valid, other=0).to(tl.int64)")
    for k in range(dims):   # the reference's order: (src - dst) per axis, summed in order
        c.emit(f"dx = tl.load(wpos + col * {dims} + {k}, mask=valid, other=0) - qx{k}")
        c.emit("d2 = dx * dx" if k == 0 else "d2 = d2 + dx * dx")
    c.emit("valid = valid & (d2 <= c2) & (col != skip)")
    # (col is not reset to 0 past the test: every lane already holds a source id, the
    # load's 0 or a real one, and every use is masked by valid; the reset's select failed
    # Triton 3.6's TritonGPURemoveLayoutConversions for 2-D positions, the H100 image's
    # version: benchmarks/results/gpu-2026-11-26-h100.txt)
    c.emit("eid = p")
