"""lower/llvm: one fused kernel per `propagate` over a relation (LLVM IR text + its
abi.KernelSignature).

    void kernel(i64 row_begin, i64 row_end, ptr argv)

`argv` holds one pointer per signature slot: the walk's arrays (row_ptr (int64) and
col_idx for compressed rows; small per-call tables or nothing for dense, triangular,
cu_seqlens and stencil relations, whose rows and sources are computed: walks.py),
edge_perm (when the walk has one), every field/parameter operand, every output. For each row in
[row_begin, row_end) the kernel initialises the reducer state in stack buffers, walks the
row's edges, evaluates the edge function per edge with every row value held in a small
stack buffer (or a register), folds it into the state, finalises, applies `update` and
stores the row. No (num_edges, F) message array exists. reduce_by="src" walks the
transposed relation (rows are sources): implicit kinds natively, CSR through its transpose
(walks_transposed.py); "edge" stores each message at its edge id; "all" folds
every edge into one state and must run as one call over all rows. Sums over float32/float64
keep schedule.edge_unroll accumulators per row (merged at the row's end). Next to the kernel,
`<kernel>_drive` claims row chunks with an atomic counter, so each thread of a parallel call
enters native code once (emit_chunk_driver); on x86-64 Linux the module also carries the
native worker pool protocol that runs those drivers (pool.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ...core.dtypes import as_dtype
from ...core.types import GraphType, TensorType
from .. import schedule as knobs
from ..abi import (
    NBR_ROLE,
    ROW_ROLE,
    TRANSPOSED_KINDS,
    KernelSignature,
    operand_slots,
    propagate_operands,
    walk_of,
)
from ..ir.kernel import Schedule
from . import pool
from .emitter import Emitter, check_row
from .reducers import SimpleState, reducer_codegen
from .stencil_window import WindowEmitter, window_plan
from .values import I8, I64, PTR, CodegenUnsupported, Val, cast, i64, numel, storage_type
from .walks import walk_for

DRIVER_SUFFIX = "_drive"    # the chunk-loop entry point next to every kernel
PREFETCH_LOCALITY = 3    # llvm.prefetch locality: 3 = all cache levels (prefetcht0)
PREFETCH_MAX_BYTES = 512  # rows longer than this are prefetched on their first lines only
CACHE_LINE = 64


@dataclass(frozen=True)
class KernelSchedule:
    """Compile-time choices the kernel depends on. `launch` is the cpu-llvm Kernel IR
    schedule select_kernel_schedule chose for this launch (the renderer reads edge_unroll,
    prefetch_distance and parallel; the runtime chunks rows by its threads, row_partition
    and chunks_per_thread); without one the kernel asks lower/schedule.py itself (the same
    functions that pass calls)."""

    has_edge_perm: bool = False   # the walked CSR order differs from the user's edge order
    relation: tuple = ("csr",)    # abi.relation_descriptor: how rows find their edges
    launch: Schedule | None = None


def codegen_propagate(params: dict, in_types: list, index_dtype, schedule=None, *,
                      symbol: str = "tiga_propagate") -> tuple[str, KernelSignature]:
    """LLVM IR text and signature of one fused kernel for a propagate equation.

    `in_types` are the equation's operand types (the relation first, or only the fields).
    Raises CodegenUnsupported (a tg.UnsupportedError) naming what is not compiled.
    """
    schedule = schedule or KernelSchedule()
    sig = _signature(params, list(in_types), as_dtype(index_dtype), schedule, symbol)
    module = ir.Module(name=symbol)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]), name=symbol)
    ctx = Emitter(module, fn)
    _KernelBuilder(ctx, params, sig, _launch_schedule(params, sig, schedule)).emit(*fn.args)
    ctx.b.ret_void()
    ctx.close_hoist()
    ctx.finish()
    emit_chunk_driver(module, fn)
    return str(module), sig


def _launch_schedule(params, sig: KernelSignature, schedule: KernelSchedule,
                     traversal: str | None = None) -> Schedule:
    """The schedule this kernel renders: the one it was handed (checked against the walk the
    runtime binds), else the schedule functions' answer for the same launch."""
    traversal = traversal or knobs.traversal_of_walk(sig.relation, sig.walk)
    if schedule.launch is not None:
        if schedule.launch.target != "cpu-llvm":
            raise CodegenUnsupported(f"a {schedule.launch.target} schedule (the LLVM renderer "
                                     "renders cpu-llvm launches)")
        if schedule.launch.parallel != sig.parallel:
            raise CodegenUnsupported(f"schedule parallel={schedule.launch.parallel!r} but the "
                                     f"launch runs {sig.parallel!r}")
        return schedule.launch
    r = params["reducer"]
    if sig.reduce_by == "edge" or r is None:
        unroll = 1
    else:
        states = [t.strong() for t in params["edge_fn"].out_types][::max(1, r.arity)]
        unroll = knobs.edge_unroll(r.name, r.builtin, states, sig.reduce_by, traversal)
    return Schedule(target="cpu-llvm", threads=1, row_partition=knobs.row_partition(traversal),
                    chunks_per_thread=knobs.CHUNKS_PER_THREAD, edge_unroll=unroll,
                    prefetch_distance=knobs.prefetch_distance(traversal),
                    parallel=sig.parallel)


def emit_chunk_driver(module: ir.Module, kernel: ir.Function) -> ir.Function:
    """`void <kernel>_drive(i64* bounds, i64 n, i64* next, ptr argv)`: claim chunk
    `atomic next++` until none is left and run the kernel on rows [bounds[2i], bounds[2i+1]).

    Every thread of a parallel call makes one native call into this loop, so a chunk never
    waits for the GIL between two kernels (with one Python call per chunk, threads woken
    late by the OS starve behind the GIL and the call runs serially).
    """
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, PTR, PTR]),
                     name=kernel.name + DRIVER_SUFFIX)
    bounds, n, nxt, argv = fn.args
    entry, head, body, done = (fn.append_basic_block(x) for x in ("entry", "head", "body",
                                                                   "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    i = b.atomic_rmw("add", nxt, i64(1), "monotonic")
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    lo = b.load(b.gep(bounds, [b.shl(i, i64(1))], source_etype=I64), typ=I64)
    hi = b.load(b.gep(bounds, [b.add(b.shl(i, i64(1)), i64(1))], source_etype=I64), typ=I64)
    b.call(kernel, [lo, hi, argv])
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    if pool.supported():
        pool.emit_pool(module, kernel.name)
    return fn


def _signature(params, in_types, index_dtype, schedule, symbol) -> KernelSignature:
    reduce_by = params["reduce_by"]
    if in_types and isinstance(in_types[0], GraphType):
        graph_t, fields = in_types[0], in_types[1:]
    else:
        graph_t, fields = GraphType("csr", 0, 0, 0, index_dtype), in_types
    if index_dtype.name not in ("int32", "int64"):
        raise CodegenUnsupported(f"index dtype {index_dtype.name} (int32/int64 are compiled)")
    operands = propagate_operands(params, graph_t, fields)
    for t, s in zip(fields, operands["field_shapes"]):
        check_row(TensorType(s, t.dtype), "a field row")
    for s, d in zip(operands["out_shapes"], operands["out_dtypes"]):
        check_row(TensorType(s, as_dtype(d)), "an output row")
    walk = walk_of(reduce_by)
    relation = _walk_relation(walk, tuple(schedule.relation))
    # a walk by source over stored rows reaches edge ids through the transpose's permutation
    has_perm = (relation in (("csr",), ("csr_rows",)) if walk == "src" else
        schedule.has_edge_perm)
    if relation != ("csr",) and has_perm and walk == "dst":
        raise CodegenUnsupported("an implicit relation walk with an edge permutation")
    slots = operand_slots(walk_for(relation).slots, has_perm, len(fields),
                          len(operands["out_dtypes"]))
    return KernelSignature(target="cpu-llvm", symbol=symbol, walk=walk, reduce_by=reduce_by,
                           slots=slots, index_dtype=index_dtype.name,
                           parallel=_parallel(params), relation=relation, **operands)


def _walk_relation(walk: str, relation: tuple) -> tuple:
    """The walk a kernel renders: by source, the transposed walk of the relation (a
    destination-major descriptor there means its transposed CSR)."""
    transposed = relation[0] in TRANSPOSED_KINDS
    if walk == "src":
        return relation if transposed else ("csr",)
    if transposed:
        raise CodegenUnsupported(f"the walk by source {relation[0]!r} for a propagate "
                                 "grouped by destination")
    return relation


def _parallel(params) -> str:
    if params["reduce_by"] != "all":
        return "rows"
    r = params["reducer"]
    return knobs.parallel_mode("all", r.name, r.builtin, params["update"] is not None)


class _KernelBuilder:
    """Emits the row loop, the edge loop and the reducer folds of one propagate kernel."""

    def __init__(self, ctx: Emitter, params: dict, sig: KernelSignature,
                 launch: Schedule | None = None, traversal: str | None = None):
        if launch is None:
            launch = _launch_schedule(params, sig, KernelSchedule(), traversal)
        self.ctx, self.sig, self.b, self.launch = ctx, sig, ctx.b, launch
        self.edge_fn, self.update = params["edge_fn"], params["update"]
        self.reduce_by = sig.reduce_by
        self.row_role = ROW_ROLE[sig.reduce_by]
        self.nbr_role = NBR_ROLE[self.row_role]
        self.index_t = storage_type(as_dtype(sig.index_dtype))
        self.walk = walk_for(sig.relation)
        msg_types = [t.strong() for t in self.edge_fn.out_types]
        for t in msg_types:
            check_row(t, "an edge message")
        self.reds = []
        if sig.reduce_by != "edge":
            reducer, k = params["reducer"], params["reducer"].arity
            self.reds = [reducer_codegen(reducer, msg_types[i:i + k])
                         for i in range(0, len(msg_types), k)]
            self.arity = k

    # ---- arguments ---------------------------------------------------------------------

    def _load_args(self, argv) -> None:
        b = self.b
        self.argv = argv
        self.ptr = {}
        for j, slot in enumerate(self.sig.slots):
            self.ptr[slot] = b.load(b.gep(argv, [i64(j)], source_etype=PTR), typ=PTR,
                                    name=slot.replace(":", ""))
        self.params = {i: self._param(i) for i, r in enumerate(self.sig.roles) if r == "param"}

    def _param(self, i: int) -> Val:
        dtype = as_dtype(self.sig.field_dtypes[i])
        self.ctx.invariant.add(id(self.ptr[f"field:{i}"]))
        return self.ctx.scalar_of(Val(self.sig.field_shapes[i], dtype,
                                      ptr=self.ptr[f"field:{i}"]))

    def _row_of(self, slot: str, shape, dtype, index) -> Val:
        n = numel(shape)
        start = index if n == 1 else self.b.mul(index, i64(n), flags=["nsw"])
        ptr = self.b.gep(self.ptr[slot], [start], source_etype=storage_type(dtype))
        return Val(shape, dtype, ptr=ptr)

    def _field_row(self, i: int, index) -> Val:
        dtype = as_dtype(self.sig.field_dtypes[i])
        row = self._row_of(f"field:{i}", self.sig.field_shapes[i], dtype, index)
        return self.ctx.scalar_of(row)

    def _load_index(self, slot: str, p, ty) -> ir.Value:
        v = self.b.load(self.b.gep(self.ptr[slot], [p], source_etype=ty), typ=ty)
        return self.b.sext(v, I64) if ty != I64 else v

    # ---- loops -------------------------------------------------------------------------

    def emit(self, begin, end, argv) -> None:
        self._load_args(argv)
        self.begin = begin      # (a walk may position itself at the call's first row)
        self.walk.setup(self)
        self.ctx.open_hoist()
        if self.walk.gathers:
            # the last edge of this call's rows bounds the look-ahead of the gather prefetch
            self.last_edge = self.b.sub(self.walk.edge_start(self, end), i64(1))
        if self.reduce_by == "all":
            self._emit_all(begin, end)
            return
        plan = self._window_plan()
        if plan is None:
            self.ctx.loop(begin, end, self._row, name="row")
        else:
            self.walk.row_runs(self, begin, end, self._row, WindowEmitter(self, plan).run)

    def _window_plan(self):
        """The sliding-window plan of a stencil sum whose messages are functions of their
        source (stencil_window.py), where the schedule takes it; else None."""
        if not getattr(self.walk, "lane_folds", False) or "edge_perm" in self.ptr:
            return None
        used = self.edge_fn.read_inputs()
        if any(r not in ("param", self.nbr_role) for i, r in enumerate(self.sig.roles)
               if i in used) or not self.reds or not all(
                isinstance(red, SimpleState) and red.reassociable for red in self.reds):
            return None
        plan = window_plan(self.walk.shape, self.walk.offsets)
        traversal = knobs.traversal_of_walk(self.sig.relation, self.sig.walk)
        if plan is None or not knobs.stencil_window(traversal, self.reduce_by, plan.evals,
                                                    plan.edges):
            return None
        return plan

    def _row_vals(self, r) -> dict:
        return {i: self._field_row(i, r) for i, role in enumerate(self.sig.roles)
                if role == self.row_role}

    def _row(self, r) -> None:
        row = self.walk.row(self, r)
        e0, e1 = row[0], row[1]
        rows = self._row_vals(r)
        if self.reduce_by == "edge":
            self.walk.edges(self, r, row, lambda p, c: self._store_messages(p, rows, c))
            return
        states = [red.init(self.ctx) for red in self.reds]
        lanes = self._lanes()
        if lanes > 1 and self.walk.contiguous:
            self._unrolled_edges(row, rows, states, lanes)
        elif lanes > 1:
            self._lane_edges(r, row, rows, states, lanes)
        else:
            self.walk.edges(self, r, row, lambda p, c: self._fold(p, rows, states, c))
        outs = self._finish(states, self.b.sub(e1, e0), rows)
        self._store_row(outs, r)

    def _lanes(self) -> int:
        """How many independent accumulators the edge loop keeps (1: edge order). The
        schedule decides; a walk or fold that cannot reorder edges refuses a wrong one."""
        lanes = self.launch.edge_unroll
        spreads = self.walk.contiguous or getattr(self.walk, "lane_folds", False)
        if lanes > 1 and (not spreads or not all(
                getattr(red, "reassociable", False) for red in self.reds)):
            raise CodegenUnsupported(f"edge_unroll = {lanes} on a walk or reducer that keeps "
                                     "edge order")
        return lanes

    def _unrolled_edges(self, row, rows: dict, states: list, lanes: int) -> None:
        """Edges in groups of `lanes`, edge k of a group folding into accumulator k; the
        remainder folds into accumulator 0; the accumulators are merged in lane order."""
        b = self.b
        e0, e1 = row[0], row[1]
        extra = [[red.init(self.ctx) for red in self.reds] for _ in range(lanes - 1)]
        acc = [states] + extra
        count = b.sub(e1, e0)
        body_end = b.add(e0, b.and_(count, i64(-lanes)), flags=["nsw"])

        def group(p):
            for k in range(lanes):
                q = p if k == 0 else b.add(p, i64(k), flags=["nsw"])
                self._fold(q, rows, acc[k], self.walk.col(self, q, row))

        self.ctx.loop(e0, body_end, group, name="edge4", step=lanes)
        self.ctx.loop(body_end, e1, lambda p: self._fold(p, rows, states,
                                                         self.walk.col(self, p, row)),
                      name="edge")
        for lane in extra:
            for red, state, other in zip(self.reds, states, lane):
                red.merge(self.ctx, state, other)

    def _lane_edges(self, r, row, rows: dict, states: list, lanes: int) -> None:
        """A walk of a static pattern (stencil offsets): edge k of the pattern folds into
        accumulator k % lanes, so consecutive folds do not wait on each other; the
        accumulators are merged in lane order."""
        extra = [[red.init(self.ctx) for red in self.reds] for _ in range(lanes - 1)]
        acc = [states] + extra
        self.walk.edges(self, r, row, lambda p, c, k: self._fold(p, rows, acc[k % lanes], c),
                        lanes=True)
        for lane in extra:
            for red, state, other in zip(self.reds, states, lane):
                red.merge(self.ctx, state, other)

    def _emit_all(self, begin, end) -> None:
        states = [red.init(self.ctx) for red in self.reds]

        def row(r):
            bounds = self.walk.row(self, r)
            rows = self._row_vals(r)
            self.walk.edges(self, r, bounds, lambda p, c: self._fold(p, rows, states, c))

        self.ctx.loop(begin, end, row, name="row")
        count = self.b.sub(self.walk.edge_start(self, end), self.walk.edge_start(self, begin))
        outs = self._finish(states, count, {})
        self._store_row(outs, i64(0))

    # ---- per edge ----------------------------------------------------------------------

    def _prefetch(self, p) -> None:
        """Ask for the rows prefetch_distance edges ahead: neighbour rows (and edge rows read
        through a permutation) are random gathers the hardware prefetcher cannot predict,
        and their latency bounds the kernel. The look-ahead is clamped to this call's last
        edge, so it never reads out of bounds."""
        if not self.walk.gathers:
            return   # implicit walks read contiguous or lattice-regular sources
        permuted = "edge_perm" in self.ptr
        used = self.edge_fn.read_inputs()
        gathers = [i for i, r in enumerate(self.sig.roles) if i in used and
                   (r == self.nbr_role or (r == "edge" and permuted))]
        distance = self.launch.prefetch_distance
        if not gathers or distance <= 0:
            return
        b = self.b
        ahead = b.add(p, i64(distance), flags=["nsw"])
        q = b.select(b.icmp_signed("<", ahead, self.last_edge), ahead, self.last_edge)
        index = {self.nbr_role: self.walk.ahead_col(self, q)}
        if permuted:
            index["edge"] = self._load_index("edge_perm", q, I64)
        for i in gathers:
            dtype = as_dtype(self.sig.field_dtypes[i])
            row = self._row_of(f"field:{i}", self.sig.field_shapes[i], dtype,
                               index[self.sig.roles[i]])
            # every cache line the row may touch (its alignment is the caller's): numpy
            # rows of 128 bytes often start mid-line and span three lines. Rows whose size
            # is a multiple of the line share the array's alignment: their last line is
            # asked for only when the array is misaligned (a loop-invariant branch), since
            # prefetches compete with the loads for the load ports
            nbytes = numel(self.sig.field_shapes[i]) * dtype.itemsize
            offsets = _prefetch_offsets(nbytes, dtype.itemsize)
            whole_lines = (nbytes % CACHE_LINE == 0 and len(offsets) > 1 and
                offsets[-1] == nbytes - 1)
            for off in offsets[:-1] if whole_lines else offsets:
                self._prefetch_at(row.ptr, off)
            if whole_lines:
                with b.if_then(self._misaligned(i), likely=False):
                    self._prefetch_at(row.ptr, offsets[-1])

    def _prefetch_at(self, ptr, off: int) -> None:
        b, i32 = self.b, ir.IntType(32)
        addr = ptr if off == 0 else b.gep(ptr, [i64(off)], source_etype=I8)
        b.call(self.ctx.prefetch_fn(), [addr, ir.Constant(i32, 0),
                                        ir.Constant(i32, PREFETCH_LOCALITY),
                                        ir.Constant(i32, 1)])

    def _misaligned(self, i: int):
        """Whether field i's array starts mid cache line (computed once, in the entry)."""
        cache = self.__dict__.setdefault("_misaligned_flags", {})
        if i not in cache:
            eb = ir.IRBuilder(self.ctx.entry)
            eb.position_at_start(self.ctx.entry)
            base = eb.load(eb.gep(self.argv, [i64(self.sig.slots.index(f"field:{i}"))],
                                  source_etype=PTR), typ=PTR)
            low = eb.and_(eb.ptrtoint(base, I64), i64(CACHE_LINE - 1))
            cache[i] = eb.icmp_unsigned("!=", low, i64(0))
        return cache[i]

    def _edge_args(self, p, rows: dict, c) -> tuple:
        self._prefetch(p)
        eid = self._load_index("edge_perm", p, I64) if "edge_perm" in self.ptr else p
        args = []
        for i, role in enumerate(self.sig.roles):
            if role == "param":
                args.append(self.params[i])
            elif role == self.row_role:
                args.append(rows[i])
            elif role == "edge":
                args.append(self._field_row(i, eid))
            else:
                args.append(self._field_row(i, c))
        return args, eid

    def _source_args(self, c) -> list:
        """The edge function's arguments for source c where it reads only source rows and
        parameters (the window loop: no edge id, no destination row)."""
        return [self.params[i] if role == "param" else
                self._field_row(i, c) if role == self.nbr_role else None
                for i, role in enumerate(self.sig.roles)]

    def _fold(self, p, rows: dict, states: list, c) -> None:
        args, _ = self._edge_args(p, rows, c)
        msgs = self.ctx.eval_program(self.edge_fn, args)
        k = self.arity
        for j, (red, state) in enumerate(zip(self.reds, states)):
            red.fold(self.ctx, state, msgs[j * k:(j + 1) * k])

    def _store_messages(self, p, rows: dict, c) -> None:
        args, eid = self._edge_args(p, rows, c)
        msgs = self.ctx.eval_program(self.edge_fn, args)
        self._store_row(msgs, eid)

    # ---- per row -----------------------------------------------------------------------

    def _finish(self, states: list, count, rows: dict) -> list:
        outs = []
        for red, state in zip(self.reds, states):
            outs += red.finalize(self.ctx, state, count)
        if self.update is None:
            return outs
        if self.reduce_by != "dst":
            raise CodegenUnsupported("an update function needs reduce_by='dst'")
        roles = self.sig.roles
        dst = [rows[i] for i, r in enumerate(roles) if r == "dst"]
        params = [self.params[i] for i, r in enumerate(roles) if r == "param"]
        return self.ctx.eval_program(self.update, dst + outs + params)

    def _store_row(self, outs: list, index) -> None:
        b = self.b
        for k, val in enumerate(outs):
            dtype = as_dtype(self.sig.out_dtypes[k])
            dst = self._row_of(f"out:{k}", self.sig.out_shapes[k], dtype, index)
            self.ctx.loop_nest(dst.shape, lambda idx, dst=dst, val=val, dtype=dtype: dst.store(
                b, idx, cast(b, val.load(b, idx), val.dtype, dtype)))



def _prefetch_offsets(nbytes: int, itemsize: int) -> list:
    """Byte offsets that touch every cache line of an `nbytes` row at any alignment (rows
    are aligned to their element size, so a single element never straddles two lines)."""
    if nbytes <= 0:
        return []
    if nbytes <= itemsize:
        return [0]
    span = min(nbytes, PREFETCH_MAX_BYTES)
    offs = list(range(0, span, CACHE_LINE))
    if nbytes <= PREFETCH_MAX_BYTES and (nbytes - 1) % CACHE_LINE:
        offs.append(nbytes - 1)
    return offs


__all__ = ["codegen_propagate", "emit_chunk_driver", "DRIVER_SUFFIX", "KernelSchedule",
           "CodegenUnsupported"]
