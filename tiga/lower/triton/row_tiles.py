"""lower/triton: the row-tiled gather body of a stored-CSR propagate (schedule tile row_tile).

The row loop (row_loop._Body) walks one row at a time: BLOCK_N column ids, then BLOCK_N
neighbour rows, each tile waiting on the one before. Here a program owns BLOCK_R rows as one
tile of BLOCK_R x BLOCK_N lanes (lane l: row l // BLOCK_N, neighbour slot l % BLOCK_N):

    rows   = pid * BLOCK_R + arange(BLOCK_R)        cnt: [BLOCK_R] degrees
    lane l = (row, slot)                            e0, e1: [BLOCK_R * BLOCK_N] its row's range
    for s0 in range(0, max(cnt), BLOCK_N):          one trip per BLOCK_N edges of the longest row
        p     = e0 + s0 + slot                      each row's ids: one coalesced vector
        col   = col_idx[p]                          (the stored index dtype)
        x     = field[col, 0:F]                     [BLOCK_R * BLOCK_N, F], F a padded constant
        state = fold(state, msgs by row)            [BLOCK_R, BLOCK_N, F] -> [BLOCK_R, F]

so a program has BLOCK_R x BLOCK_N independent row gathers in flight. Per-lane addresses are
one int64 row base per lane plus int32 offsets inside the row, hinted contiguous and
aligned (tl.max_contiguous / tl.multiple_of) so the row loads vectorise. The edge function
runs unchanged on the flattened [BLOCK_R * BLOCK_N, ...] lanes (destination fields are
loaded per lane); folds regroup the lanes by row (reducers.grouped); finalize, update and
the stores run on [BLOCK_R, ...]. Rows above the split degree get no edges here: the split
kernels (kernel.py) fold them, as in the row loop.
"""
from __future__ import annotations

from ...core.dtypes import as_dtype
from .emitter import TV
from .row_loop import _Body, _lead_offsets

TILED_RELATIONS = (("csr",),)


class TiledBody(_Body):
    """row_loop._Body with a [BLOCK_R, BLOCK_N] tile of edges per trip instead of a row loop."""

    def __init__(self, params: dict, sig):
        super().__init__(params, sig, "main")
        self.ctx.row_tile = "BLOCK_R"
        self.ctx.lanes = "BLOCK_R * BLOCK_N"
        self.ctx.edge_lanes = sig.block_rows * sig.block_neighbors
        self.row_store = ("rr", "live")

    def render(self):
        """The tile's rows (_rows), its walk (_walk: every trip's gathers, edge function
        and folds), then finalize, update and the stores on the tile's BLOCK_R rows."""
        c = self.ctx
        c.emit("pid = tl.program_id(0).to(tl.int64)")
        c.emit("zero1 = tl.zeros([1], tl.int64)")
        params = self._params()
        self._rows()
        states = self._walk(self._row_fields("lr"), params)
        c.lanes = "BLOCK_R"   # finalize, update and stores run on the tile's rows
        c.edge_lanes = self.sig.block_rows
        self._finish({} if self.update is None else self._row_fields("rr"), params, states)
        return c

    def _row_fields(self, index: str) -> dict:
        """The fields of the reducing side at row ids `index` (`lr`: per lane, `rr`: per
        row of the tile), by field number."""
        return {i: self._gather(i, index, None, "edge")
                for i, r in enumerate(self.sig.roles) if r == self.row_role}

    def _walk(self, rows: dict, params: dict) -> list:
        """The reducer states after the trips over each row's CSR range, BLOCK_N edges of
        the longest row a trip."""
        c = self.ctx
        states = [f.init(c) for f, _ in self.folds]
        c.emit("for s0 in range(0, tl.max(cnt, axis=0), BLOCK_N):")
        c.indent += 1
        c.emit("p = tl.max_contiguous(e0 + s0 + nb, BLOCK_N)")
        c.emit("valid = p < e1")
        c.emit("col = tl.load(col_idx + p, mask=valid, other=0)")
        if "edge_perm" in self.sig.slots:
            c.emit("eid = tl.load(edge_perm + p, mask=valid, other=0)")
        else:
            c.emit("eid = p")
        self._messages(rows, params, states)
        c.indent -= 1
        return states

    def _rows(self) -> None:
        """The tile's rows (`rows`, `live`, `rr`, degrees `cnt`) and each lane's row `lr`,
        neighbour slot `nb` and edge range [e0, e1) (empty for rows the split path takes)."""
        c, split = self.ctx, self.sig.split_degree
        c.emit("rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)")
        c.emit("live = rows < n_rows")
        c.emit("rr = tl.minimum(rows, n_rows - 1)")
        c.emit("cnt = tl.where(live, tl.load(row_ptr + rr + 1) - tl.load(row_ptr + rr), 0)")
        if split:
            c.emit(f"cnt = tl.where(cnt > {split}, 0, cnt)")
        c.emit("lane = tl.arange(0, BLOCK_R * BLOCK_N)")
        c.emit("nb = lane % BLOCK_N")
        c.emit("lrow = pid * BLOCK_R + lane // BLOCK_N")
        c.emit("lr = tl.minimum(lrow, n_rows - 1)")
        c.emit("e0 = tl.load(row_ptr + lr)")
        c.emit("e1 = tl.load(row_ptr + lr + 1)")
        keep = "lrow < n_rows" + (f") & (e1 - e0 <= {split}" if split else "")
        c.emit(f"e1 = tl.where(({keep}), e1, e0)")

    def _gather(self, i: int, index: str, mask: str | None, lead: str) -> TV:
        """Field i's rows at `index` ([lanes] ids of any int dtype): an int64 row base per
        lane, int32 offsets inside the row."""
        shape, dtype = self.sig.field_shapes[i], as_dtype(self.sig.field_dtypes[i])
        ptr = f"field{i}"
        if not shape or index == "zero1":
            return super()._gather(i, index, mask, lead)
        numel = 1
        for d in shape:
            numel *= d
        offs, fmask = _lead_offsets(shape)
        if len(shape) == 1 and fmask is None:   # an unpadded row: contiguous from its start
            offs = (f"tl.max_contiguous(tl.multiple_of(tl.arange(0, {numel}), {numel}), "
                    f"{numel})[None, :]")
        align = numel & -numel   # (the largest power of two dividing the row's elements)
        base = self.ctx.let(f"{ptr} + tl.multiple_of({index}.to(tl.int64) * {numel}, {align})",
                            "rowp")
        idx = f"{base}[:, {', '.join(['None'] * len(shape))}]"
        masks = [m for m in ((f"{mask}[:, {', '.join(['None'] * len(shape))}]" if mask
                              else None), fmask) if m]
        masked = f", mask={' & '.join(masks)}, other=0" if masks else ""
        return self.ctx.value(f"tl.load({idx} + {offs}{masked})", shape, dtype, lead, "x")
