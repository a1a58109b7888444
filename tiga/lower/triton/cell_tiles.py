"""lower/triton: the cell-tiled body of a radius propagate (schedule tile row_tile over a
cell-directory walk).

The row loop (walks.py) takes one query row at a time through its 3^dims neighbour cells.
Here a program owns BLOCK_R rows that are consecutive in `row_order`: for one point set
(radius_graph: rows are the points) that is the directory's cell order, so a program's rows
are the points of one cell (or of two adjacent ones) and read the same neighbour cells.
The program walks the 3^dims neighbour cells of its rows together, each as tiles of
BLOCK_R x BLOCK_N lanes (lane l: row l // BLOCK_N, candidate slot l % BLOCK_N):

    rows  = row_order[pid * BLOCK_R + arange(BLOCK_R)]        (query ids; stores go there)
    for cell in 3^dims offsets:                               each row's own neighbour cell
        e0, e1 = cell_start[cell of the lane's row], [.. + 1]
        for s0 in range(0, max(e1 - e0), BLOCK_N):
            col = cell_order[e0 + s0 + slot]                   rows of one cell: the same ids
            valid = d2(col, row) <= c2 (and col != row without loops)
            state = fold(state, msgs by row)

so candidates of a cell are loaded once per tile for all its rows (the other rows' loads of
the same ids hit the cache) and BLOCK_R x BLOCK_N distance tests run at once. A relation
with its own query points passes the query order (each row then walks its own cells).
Distances are the reference's (src - dst per axis, summed in axis order, in the
coordinates' dtype), so the neighbour sets equal the row loop's; each row's degree is
counted as its tiles go (mean, online_softmax read it).
"""
from __future__ import annotations

from .row_tiles import TiledBody
from .walks import emit_cell_range, emit_radius_candidates, emit_radius_query


class CellTiledBody(TiledBody):
    """row_tiles.TiledBody over a radius relation's cell directory instead of a CSR: its
    rows and walk; the gathers, folds and finish are TiledBody's, the cell walk's pieces
    walks.py's (on the lanes' query ids `lr` instead of a row's `rr`)."""

    def _rows(self) -> None:
        """The tile's rows (`rr` ids, `live`, degrees `cnt`), each lane's row `lr`, slot
        `nb`, the lane's query coordinates and cell, and the walk's scalars."""
        c = self.ctx
        c.emit("pos = pid * BLOCK_R + tl.arange(0, BLOCK_R)")
        c.emit("live = pos < n_rows")
        c.emit("rr = tl.load(row_order + tl.minimum(pos, n_rows - 1)).to(tl.int64)")
        c.emit("cnt = rr * 0")
        c.emit("lane = tl.arange(0, BLOCK_R * BLOCK_N)")
        c.emit("nb = lane % BLOCK_N")
        c.emit("lpos = pid * BLOCK_R + lane // BLOCK_N")
        c.emit("llive = lpos < n_rows")
        c.emit("lr = tl.load(row_order + tl.minimum(lpos, n_rows - 1)).to(tl.int64)")
        emit_radius_query(c, self.sig.relation[1], "lr")

    def _walk(self, rows: dict, params: dict) -> list:
        """The reducer states after each lane's row's 3^dims neighbour cells, BLOCK_N
        candidates of the fullest cell a trip; degrees counted per row."""
        c, dims = self.ctx, self.sig.relation[1]
        states = [f.init(c) for f, _ in self.folds]
        c.emit(f"for cell in range(0, {3 ** dims}):")
        c.indent += 1
        emit_cell_range(c, dims, "llive", "lr")
        c.emit("for s0 in range(0, tl.max(e1 - e0, axis=0), BLOCK_N):")
        c.indent += 1
        emit_radius_candidates(c, dims, "e0 + s0 + nb")
        c.emit("cnt = cnt + tl.sum(tl.reshape(valid.to(tl.int64), [BLOCK_R, BLOCK_N]), axis=1)")
        self._messages(rows, params, states)
        c.indent -= 2
        return states
