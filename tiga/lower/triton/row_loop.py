"""lower/triton: the row loop, the body of a propagate kernel that walks one row at a time
(kernel.py picks a body and renders the kernel; row_tiles.TiledBody and
cell_tiles.CellTiledBody extend this one).
"""
from __future__ import annotations

from ...core.dtypes import as_dtype
from ..abi import NBR_ROLE, ROW_ROLE, KernelSignature
from .emitter import TV, Emitter, eval_program, pow2, tl_dtype
from .reducers import reducer_folds, tile, valid_mask
from .walks import emit_row, emit_tile, open_loops


class _Body:
    """The kernel body: row loop, neighbour-tile loop, folds, finalize, update, stores.

    mode "main": every row (rows above the split degree get no edges: the split kernels
    write them); "part": one program row per chunk of split_degree edges of a heavy row,
    storing its raw reducer states; "comb": one program row per heavy row, merging its
    chunks' states in chunk order (deterministic), then finalize, update and store."""

    def __init__(self, params: dict, sig: KernelSignature, mode: str = "main"):
        self.sig, self.params, self.mode = sig, params, mode
        self.edge_fn, self.update = params["edge_fn"], params["update"]
        self.row_role = ROW_ROLE[sig.reduce_by]
        self.nbr_role = NBR_ROLE[self.row_role]
        self.ctx = Emitter(indent=1)
        self.ctx.edge_lanes = sig.block_neighbors
        self.row_store = ("row1", "(zero1 == 0) & live")   # (row ids, mask) of the stores
        msg_types = [t.strong() for t in self.edge_fn.out_types]
        self.folds = []
        if sig.reduce_by != "edge":
            reducer = params["reducer"]
            if sig.combine:
                from ...core.reducers import sum as sum_reducer
                reducer = sum_reducer()
            self.folds = reducer_folds(reducer, msg_types)

    # ---- loads ---------------------------------------------------------------------------

    def _gather(self, i: int, index: str, mask: str | None, lead: str) -> TV:
        """Field i's rows at `index` ([L] int64 ids) as a [L, *padded] tile."""
        shape, dtype = self.sig.field_shapes[i], as_dtype(self.sig.field_dtypes[i])
        ptr = f"field{i}"
        if not shape:
            masked = f", mask={mask}, other=0" if mask else ""
            return self.ctx.value(f"tl.load({ptr} + {index}{masked})", shape, dtype, lead, "x")
        k = len(shape)
        numel = 1
        for d in shape:
            numel *= d
        offs, fmask = _lead_offsets(shape)
        idx = f"{index}[:, {', '.join(['None'] * k)}]"
        masks = [m for m in ((f"{mask}[:, {', '.join(['None'] * k)}]" if mask else None),
                             fmask) if m]
        masked = f", mask={' & '.join(masks)}, other=0" if masks else ""
        return self.ctx.value(f"tl.load({ptr} + {idx} * {numel} + {offs}{masked})", shape,
                              dtype, lead, "x")

    def _params(self) -> dict:
        return {i: self._gather(i, "zero1", None, "row")
                for i, r in enumerate(self.sig.roles) if r == "param"}

    # ---- body ----------------------------------------------------------------------------

    def render(self) -> Emitter:
        c = self.ctx
        c.emit("pid = tl.program_id(0).to(tl.int64)")
        c.emit("nb = tl.arange(0, BLOCK_N)")
        c.emit("zero1 = tl.zeros([1], tl.int64)")
        params = self._params()
        c.emit("for i in range(0, BLOCK_R):")
        c.indent += 1
        c.emit("r = pid * BLOCK_R + i")
        c.emit("live = r < n_rows")
        c.emit("rr = tl.minimum(r, n_rows - 1)")
        split = self.sig.split_degree
        if self.mode == "main":
            emit_row(c, self.sig.relation)
            if split:   # (a heavy row would hold its program for all its tiles)
                c.emit(f"e1 = tl.where(cnt > {split}, e0, e1)")
                c.emit("cnt = e1 - e0")
        else:
            self._split_row(split)
        c.emit("row1 = zero1 + rr")
        rows = {i: self._gather(i, "row1", None, "row")
                for i, r in enumerate(self.sig.roles) if r == self.row_role}
        states = [f.init(c) for f, _ in self.folds]
        if self.mode == "comb":
            self._merge_chunks(states)
        else:
            depth = open_loops(c, self.sig.relation)
            self._tile(rows, params, states)
            c.indent -= depth
        if self.mode == "part":
            self._store_states(states)
        elif self.sig.reduce_by != "edge":
            self._finish(rows, params, states)
        c.indent -= 1
        return c

    # ---- the split path ------------------------------------------------------------------

    def state_layout(self) -> tuple:
        """(padded elements, dtype name) of every state tile, fold by fold."""
        out = []
        for fold, _ in self.folds:
            for padded, dtype in fold.layout():
                n = 1
                for d in padded:
                    n *= d
                out.append((n, as_dtype(dtype).name))
        return tuple(out)

    def _split_row(self, split: int) -> None:
        """part: split_a/split_b hold each chunk's row and first edge; comb: each heavy row
        and the index of its first chunk (its chunks are consecutive)."""
        c = self.ctx
        c.emit("rc = rr")
        c.emit("rr = tl.load(split_a + rc).to(tl.int64)")
        if self.mode == "part":
            c.emit("e0 = tl.load(split_b + rc).to(tl.int64)")
            c.emit(f"e1 = tl.where(live, tl.minimum(e0 + {split}, "
                   "tl.load(row_ptr + rr + 1).to(tl.int64)), e0)")
            c.emit("cnt = e1 - e0")
            return
        c.emit("e0 = tl.load(row_ptr + rr)")
        c.emit("e1 = tl.where(live, tl.load(row_ptr + rr + 1), e0)")
        c.emit("cnt = e1 - e0")
        c.emit("c0 = tl.load(split_b + rc).to(tl.int64)")
        c.emit(f"c1 = tl.where(live, c0 + (cnt + {split - 1}) // {split}, c0)")

    def _state_tiles(self, states: list):
        """(name, state part index, offsets, elements) of every state tile."""
        j = 0
        for (fold, _), state in zip(self.folds, states):
            for var, (padded, _) in zip(state, fold.layout()):
                n = 1
                for d in padded:
                    n *= d
                yield fold, var, j, (_lead_offsets(padded)[0] or "zero1"), n
                j += 1

    def _store_states(self, states: list) -> None:
        for _, var, j, offs, n in self._state_tiles(states):
            self.ctx.emit(f"tl.store(part{j} + rc * {n} + {offs}, {var}, "
                          f"mask=(({offs}) * 0 == 0) & live)")

    def _merge_chunks(self, states: list) -> None:
        c = self.ctx
        c.emit("for ch in range(c0, c1):")
        c.indent += 1
        loaded: dict = {}
        for fold, _, j, offs, n in self._state_tiles(states):
            loaded.setdefault(id(fold), []).append(
                c.let(f"tl.load(part{j} + ch * {n} + {offs})", "o"))
        for (fold, _), state in zip(self.folds, states):
            fold.merge(c, state, loaded[id(fold)])
        c.indent -= 1

    def _tile(self, rows: dict, params: dict, states: list) -> None:
        c = self.ctx
        emit_tile(c, self.sig.relation, "edge_perm" in self.sig.slots)
        self._messages(rows, params, states)

    def _messages(self, rows: dict, params: dict, states: list) -> None:
        """The tile's gathers, edge function and folds (or per-edge stores)."""
        c = self.ctx
        args = []
        for i, role in enumerate(self.sig.roles):
            if role == "param":
                args.append(params[i])
            elif role == self.row_role:
                args.append(rows[i])
            elif role == "edge":
                args.append(self._gather(i, "eid", "valid", "edge"))
            else:
                args.append(self._gather(i, "col", "valid", "edge"))
        msgs = eval_program(c, self.edge_fn, args)
        if self.sig.reduce_by == "edge":
            for k, m in enumerate(msgs):
                self._store(k, m, "eid", "valid", edge=True)
            return
        for (fold, at), state in zip(self.folds, states):
            fold.fold(c, state, [msgs[j] for j in at])

    def _finish(self, rows: dict, params: dict, states: list) -> None:
        outs = []
        for (fold, _), state in zip(self.folds, states):
            outs += fold.finalize(self.ctx, state)
        if self.update is not None:
            roles = self.sig.roles
            dst = [rows[i] for i, r in enumerate(roles) if r == "dst"]
            prm = [params[i] for i, r in enumerate(roles) if r == "param"]
            outs = eval_program(self.ctx, self.update, dst + outs + prm)
        for k, val in enumerate(outs):
            self._store(k, val, *self.row_store, edge=False)

    def _store(self, k: int, val: TV, index: str, mask: str, edge: bool) -> None:
        shape = tuple(self.sig.out_shapes[k])
        dtype = as_dtype(self.sig.out_dtypes[k])
        if edge:
            expr = tile(self.ctx, val, shape)
        elif val.lead == "const":
            expr = (f"tl.full([1{''.join(f', {pow2(d)}' for d in shape)}], {val.expr}, "
                    f"{tl_dtype(dtype)})")
        else:
            expr = self.ctx.expand(val, len(shape))
        expr = f"({expr}).to({tl_dtype(dtype)})"
        if not shape:
            self.ctx.emit(f"tl.store(out{k} + {index}, {expr}, mask={mask})")
            return
        n = len(shape)
        numel = 1
        for d in shape:
            numel *= d
        offs, fmask = _lead_offsets(shape)
        lifted = f"{mask if mask != 'valid' else 'valid'}"
        m = f"({lifted})[:, {', '.join(['None'] * n)}]" if not edge else valid_mask(n)
        if fmask:
            m = f"{m} & {fmask}"
        self.ctx.emit(f"tl.store(out{k} + {index}[:, {', '.join(['None'] * n)}] * {numel} + "
                      f"{offs}, {expr}, mask={m})")


def _lead_offsets(shape: tuple) -> tuple[str, str | None]:
    """(offsets, mask) of a row of `shape` as a [1, *padded] tensor (row-major, logical)."""
    k = len(shape)
    offs, masks = [], []
    stride = 1
    for axis in range(k - 1, -1, -1):
        d, p = shape[axis], pow2(shape[axis])
        sel = ", ".join(":" if j == axis + 1 else "None" for j in range(k + 1))
        idx = f"tl.arange(0, {p})[{sel}]"
        offs.append(idx if stride == 1 else f"{idx} * {stride}")
        if p != d:
            masks.append(f"({idx} < {d})")
        stride *= d
    return " + ".join(reversed(offs)), (" & ".join(masks) if masks else None)

