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


class CellTiledBody(TiledBody):
    """row_tiles.TiledBody over a radius relation's cell directory instead of a CSR."""

    def render(self):
        c, dims = self.ctx, self.sig.relation[1]
        c.emit("pid = tl.program_id(0).to(tl.int64)")
        c.emit("zero1 = tl.zeros([1], tl.int64)")
        params = self._params()
        self._cell_rows(dims)
        rows = {i: self._gather(i, "lr", None, "edge")
                for i, r in enumerate(self.sig.roles) if r == self.row_role}
        states = [f.init(c) for f, _ in self.folds]
        c.emit(f"for cell in range(0, {3 ** dims}):")
        c.indent += 1
        self._cell_range(dims)
        c.emit("for s0 in range(0, tl.max(e1 - e0, axis=0), BLOCK_N):")
        c.indent += 1
        self._candidates(dims)
        self._messages(rows, params, states)
        c.indent -= 2
        c.lanes = "BLOCK_R"   # finalize, update and stores run on the tile's rows
        c.edge_lanes = self.sig.block_rows
        rows = {} if self.update is None else {
            i: self._gather(i, "rr", None, "edge")
            for i, r in enumerate(self.sig.roles) if r == self.row_role}
        self._finish(rows, params, states)
        return c

    def _cell_rows(self, dims: int) -> None:
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
        c.emit("inv_w = tl.load(walk_scal)")
        c.emit("c2 = tl.load(walk_scal + 1)")
        # walk_scal[2] = 1.0: one point set without loops (a row's own point is no neighbour)
        c.emit("skip = tl.where(tl.load(walk_scal + 2) != 0.0, lr, -1)")
        for k in range(dims):
            c.emit(f"qx{k} = tl.load(wqpos + lr * {dims} + {k})")
            c.emit(f"gd{k} = tl.load(grid_dims + {k})")
            c.emit(f"qc{k} = tl.floor((qx{k}.to(tl.float64) - tl.load(grid_lo + {k})) * "
                   "inv_w).to(tl.int64)")
            c.emit(f"qc{k} = tl.minimum(tl.maximum(qc{k}, 0), gd{k} - 1)")

    def _cell_range(self, dims: int) -> None:
        """Each lane's [e0, e1) of cell_order: its row's neighbour cell `cell`."""
        c = self.ctx
        c.emit("ok = llive")
        c.emit("lin = lr * 0")
        for k in range(dims):
            c.emit(f"nc = qc{k} + (cell // {3 ** (dims - 1 - k)}) % 3 - 1")
            c.emit(f"ok = ok & (nc >= 0) & (nc < gd{k})")
            c.emit(f"lin = lin * gd{k} + nc")
        c.emit("lin = tl.where(ok, lin, 0)")
        c.emit("e0 = tl.load(cell_start + lin)")
        c.emit("e1 = tl.where(ok, tl.load(cell_start + lin + 1), e0)")

    def _candidates(self, dims: int) -> None:
        """`col`, `valid` (inside the cutoff) and `eid` of one tile; degrees counted."""
        c = self.ctx
        c.emit("p = e0 + s0 + nb")
        c.emit("valid = p < e1")
        c.emit("col = tl.load(cell_order + p, mask=valid, other=0).to(tl.int64)")
        for k in range(dims):   # the reference's order: (src - dst) per axis, summed in order
            c.emit(f"dx = tl.load(wpos + col * {dims} + {k}, mask=valid, other=0) - qx{k}")
            c.emit("d2 = dx * dx" if k == 0 else "d2 = d2 + dx * dx")
        # (no select of col back to 0 past the test: walks.py says why)
        c.emit("valid = valid & (d2 <= c2) & (col != skip)")
        c.emit("eid = p")
        c.emit("cnt = cnt + tl.sum(tl.reshape(valid.to(tl.int64), [BLOCK_R, BLOCK_N]), axis=1)")
