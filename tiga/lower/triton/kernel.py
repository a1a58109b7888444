"""lower/triton: one fused Triton kernel per `propagate` over compressed rows (an
abi.KernelSource: source text + signature; the runtime compiles and launches it:
xla_free_runtime/backends/triton/launch.py).

    kernel[(cdiv(n_rows, BLOCK_R),)](row_ptr, col_idx, [edge_perm,] fields..., outs...,
                                     n_rows, BLOCK_R=..., BLOCK_N=...)

Each program owns BLOCK_R consecutive rows. For each row it loads the row's fields once,
walks the row's edges in tiles of BLOCK_N neighbours (a degree guard masks the last tile),
gathers the neighbour and edge rows of the tile, evaluates the edge function on the tile
(rules/<family>.py), folds the tile into the reducer state (reducers.py), finalises, applies
`update` and stores the row. No (num_edges, F) message array exists. reduce_by="src" walks
the transposed relation (rows are sources: implicit kinds natively, walks_transposed.py; a
stored relation its transposed CSR, edge ids through its permutation); "edge" stores each
message at its edge id; "all" (sum or mean without update) stores one partial sum per row,
which the launcher adds up. A stored CSR folded by dst or src whose schedule has the tile
row_tile renders row_tiles.TiledBody instead: the program's BLOCK_R rows walk together as
one [BLOCK_R, BLOCK_N] tile of edges per trip (same arguments, same launch); a radius cell
walk with that tile renders cell_tiles.CellTiledBody (one more argument: row_order).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...core.dtypes import as_dtype
from ...core.types import GraphType
from ..abi import (
    NBR_ROLE,
    ROW_ROLE,
    TRANSPOSED_KINDS,
    KernelSignature,
    KernelSource,
    operand_slots,
    propagate_operands,
    walk_of,
)
from .emitter import TV, Emitter, TritonUnsupported, eval_program, pow2, tl_dtype
from .reducers import reducer_folds, tile, valid_mask
from .walks import emit_row, emit_tile, open_loops, walk_slots

# _tiga_max / _tiga_min: NaN wins, as numpy's maximum/minimum (the reference); tl.max and
# tl.maximum's default drop it. One max.NaN instruction on the GPU; np.maximum interpreted
HELPERS = {"_tiga_mul": "@triton.jit\ndef _tiga_mul(a, b):\n    return a * b\n",
           "_tiga_max": "@triton.jit\ndef _tiga_max(a, b):\n    return tl.maximum(a, b, "
                        "propagate_nan=tl.PropagateNan.ALL)\n",
           "_tiga_min": "@triton.jit\ndef _tiga_min(a, b):\n    return tl.minimum(a, b, "
                        "propagate_nan=tl.PropagateNan.ALL)\n"}


@dataclass(frozen=True)
class TritonSchedule:
    """What the source and the launch depend on (from the launch's Kernel IR Schedule)."""

    block_rows: int = 1
    block_neighbors: int = 16
    num_warps: int = 4
    num_stages: int = 1
    split_degree: int = 0     # rows of a larger degree run in the split kernels (0: none)
    row_tile: bool = False    # a stored CSR's rows gathered as one tile (row_tiles.py)


def signature_of(params: dict, in_types: list, index_dtype, has_perm: bool,
                 schedule: TritonSchedule, symbol: str,
                 relation: tuple = ("csr",)) -> KernelSignature:
    graph_t, fields = in_types[0], list(in_types[1:])
    if not isinstance(graph_t, GraphType):
        raise TritonUnsupported("a propagate whose first operand is not a relation")
    index = as_dtype(index_dtype)
    if index.name not in ("int32", "int64"):
        raise TritonUnsupported(f"index dtype {index.name} (int32/int64 are rendered)")
    reduce_by, roles = params["reduce_by"], tuple(params["roles"])
    combine = _combine(params)
    if params["update"] is not None and reduce_by != "dst":
        raise TritonUnsupported("an update function needs reduce_by='dst'")
    operands = propagate_operands(params, graph_t, fields)
    if "bool" in operands["field_dtypes"] + operands["out_dtypes"]:
        raise TritonUnsupported("a bool field or output (stored as bytes, not rendered)")
    walk = walk_of(reduce_by)
    # by source: the implicit kinds' transposed walks, the symmetric radius walk (the same
    # walk), else the transposed CSR
    if walk == "src" and relation[0] != "radius" and relation[0] not in TRANSPOSED_KINDS:
        relation = ("csr",)
    if walk == "dst" and relation[0] in TRANSPOSED_KINDS:
        raise TritonUnsupported(f"the walk by source {relation[0]!r} for a propagate grouped "
                                "by destination")
    if relation[0] == "radius" and ("edge" in roles or reduce_by == "edge"):
        raise TritonUnsupported("edge fields over a radius cell walk (its edges are not "
                                "numbered in the reference's order)")
    perm = (relation == ("csr",) and (has_perm or walk == "src")) or relation == ("csr_rows",)
    walked = walk_slots(relation)
    if relation[0] == "radius" and schedule.row_tile and reduce_by in ("dst", "src"):
        walked += ("row_order",)    # (rows in cell order: cell_tiles.py)
    slots = operand_slots(walked, perm, len(fields), len(operands["out_dtypes"]))
    # the split path needs a row's edges as one id range of a stored CSR and a reducer state
    split = (schedule.split_degree if relation == ("csr",) and reduce_by in ("dst", "src")
        else 0)
    return KernelSignature(target="triton", symbol=symbol, walk=walk, reduce_by=reduce_by,
                           slots=slots, index_dtype=index.name, relation=tuple(relation),
                           block_rows=schedule.block_rows,
                           block_neighbors=schedule.block_neighbors,
                           num_warps=schedule.num_warps, num_stages=schedule.num_stages,
                           combine=combine, split_degree=split, **operands)


def _combine(params: dict) -> str:
    """reduce_by="all": how the per-row partials are added ("sum" | "mean"); else ""."""
    if params["reduce_by"] != "all":
        return ""
    r = params["reducer"]
    if (params["update"] is not None or r is None or not r.builtin or
            r.name not in ("sum", "mean")):
        raise TritonUnsupported("reduce_by='all' with a reducer other than sum/mean or "
                                "with an update (per-row partials are added)")
    return r.name


def render_propagate(params: dict, in_types: list, index_dtype, has_perm: bool = False,
                     schedule: TritonSchedule | None = None, *,
                     symbol: str = "tiga_propagate",
                     relation: tuple = ("csr",)) -> KernelSource:
    """Triton source and signature of one fused kernel for a propagate equation.
    Raises TritonUnsupported (a tg.UnsupportedError) naming what is not rendered."""
    schedule = schedule or TritonSchedule()
    sig = signature_of(params, list(in_types), index_dtype, has_perm, schedule, symbol,
                       relation)
    from .row_tiles import main_body  # (row_tiles extends _Body, defined below)
    main = main_body(params, sig, schedule.row_tile)
    if sig.split_degree:
        sig = replace(sig, split_states=main.state_layout())
    args = [s.replace(":", "") for s in sig.slots]
    tail = ["n_rows", "BLOCK_R: tl.constexpr", "BLOCK_N: tl.constexpr"]
    bodies = [(symbol, args, main.render())]
    if sig.split_degree:
        extra = [f"part{j}" for j in range(len(sig.split_states))] + ["split_a", "split_b"]
        bodies += [(f"{symbol}_{mode}", args + extra, _Body(params, sig, mode).render())
                   for mode in ("part", "comb")]
    head = ["# generated by tiga (lower/triton); do not edit",
            "import triton", "import triton.language as tl", ""]
    helpers = [HELPERS[h] for h in sorted(set().union(*(b.helpers for _, _, b in bodies)))]
    text = "\n".join(head) + "\n" + "\n".join(helpers) + ("\n" if helpers else "")
    text += "\n\n".join(f"@triton.jit\ndef {name}({', '.join(a + tail)}):\n" +
                         "\n".join(b.lines) + "\n" for name, a, b in bodies)
    return KernelSource(text, sig)


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

