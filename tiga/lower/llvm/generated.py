"""lower/llvm: fused propagate kernels over generated relations (radius, knn).

    void kernel(i64 t_begin, i64 t_end, ptr argv)

No edge list exists. Per call the runtime passes a cell directory of the source points
(points sorted by cell, cell start offsets, sorted coordinates; core/graph_generated.py) and
the order in which destination rows are visited (by cell, for locality). For each visited
row the kernel

- radius: walks the 3^d cells around the row's cell (one index range per run of cells along
  the last axis), applies the exact predicate `sqrt(sum (p - q)^2) <= cutoff` in the
  coordinates' dtype (as `d2 <= v*`, v* the largest square whose sqrt is <= cutoff) without
  branches, and folds every accepted source straight into the reducer state (a row's
  accepted sorted positions pass through a small stack buffer, never an edge list);
- knn rows first take the sources within an estimated k-th distance (same branch-free test)
  into the top-k state below, and stop there when that provably is the answer;
- radius with max_neighbors: keeps the row's nearest `max_neighbors` accepted sources in a
  bounded sorted state (ties by smaller index), counts rows that had more (one atomic add),
  then folds the kept ones nearest first;
- knn: keeps a bounded sorted top-k state (distance, then smaller index) and visits cells
  in growing Chebyshev shells until the k-th distance is below the distance from the query
  to the unvisited cells (or no cell is left), then folds the k sources nearest first.

With more than FAST_DIMS coordinate dims kNN takes the knn-tiled-scan walk (knn_tiled.py: a
register-blocked distance product, a filter and an exact re-check), and radius scans every
source (one range over all of them; still exact, O(N*M) work). The edge function itself,
the reducer folds, the finalize and `update` come from the generic kernel (kernel.py) by
subclassing; positions reach the edge function as its hidden fields. Source fields are
passed in directory order (the runtime permutes them once per call, O(N*F)), so every
source row an edge reads is near the previous one: the kernel indexes them by sorted
position, never by a random id.

Only destination-grouped walks are generated. A propagate grouped by source over a
symmetric relation (radius over one point set, no max_neighbors) reaches this kernel with
its src/dst roles exchanged (runtime/generated.py): its rows are then the sources.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from llvmlite import ir

from ...core.dtypes import as_dtype, int64
from ..abi import KernelSignature
from ..schedule import host_wide_vectors as geo_lanes_wide
from .emitter import Emitter
from .geo_vector import RANK_MAX, VectorTest, rank_select
from .kernel import KernelSchedule, _KernelBuilder, _signature, emit_chunk_driver
from .values import F64, I8, I64, PTR, CodegenUnsupported, i64, storage_type
from .walk_base import Walk

# geo_f (float64): cutoff, inv_width, width, squared cutoff, lo[d];
# geo_i (int64): num_src, dims[d], number of cells, reach (cells walked each side, radius)
GEO_SLOTS = ("geo_f", "geo_i", "cell_start", "sorted_idx", "sorted_pos", "row_order", "qpos",
             "stats")
MAX_TOPK = 4096            # bounded state lives on the stack
GAP_SAFETY = 1.0 - 1e-5    # distances are rounded in the coordinates' dtype (float32 too)
ROW_AHEAD = 4              # rows whose random destination reads are prefetched ahead
LEVEL_GROWTH = 2.0         # a kNN row's next block takes sources within sqrt(2) x the last d
COMPACT_BLOCK = 64          # candidates tested branch-free between two buffer checks
COMPACT_BUFFER = 512        # accepted sorted positions held before a fold


@dataclass(frozen=True)
class GeoSpec:
    kind: str            # "radius" | "knn"
    mode: str            # "cells" (d <= FAST_DIMS) | "tiled" (knn above: knn_tiled.py) |
    #                      "scan" (every source, one at a time: radius above FAST_DIMS, and
    #                      knn whose norms would overflow the tiled scan's expanded form)
    dims: int
    k: int               # knn k, or radius max_neighbors (0: no bound)
    exclude_self: bool   # loop=False with query=None: skip source == destination
    pos_dtype: str
    block: tuple = ()    # "tiled": (lanes W, query rows R, vectors V) of the product

    def descriptor(self) -> tuple:
        return ("generated", self.kind, self.mode, self.dims, self.k, self.exclude_self,
                self.pos_dtype, self.block)

    @classmethod
    def from_descriptor(cls, d: tuple) -> GeoSpec:
        return cls(*d[1:])


class _NoWalk(Walk):
    gathers = False
    contiguous = False
    hierarchy = "cell-directory"


def codegen_generated(params: dict, in_types: list, spec: GeoSpec, *,
                      symbol: str = "tiga_generated", builder: type | None = None,
                      slots: tuple = GEO_SLOTS) -> tuple:
    """LLVM IR text and signature of the fused kernel of a propagate (reduce_by='dst') over
    a radius/knn relation. The tiled kNN scan's kernel is knn_tiled.codegen_tiled (its
    builder extends this module's)."""
    if params["reduce_by"] != "dst":
        raise CodegenUnsupported("a generated-relation walk grouped by anything but dst")
    if spec.k > MAX_TOPK:
        raise CodegenUnsupported(f"a bounded neighbour state of {spec.k} > {MAX_TOPK}")
    if spec.pos_dtype not in ("float32", "float64"):
        raise CodegenUnsupported(f"coordinates of dtype {spec.pos_dtype}")
    if spec.mode == "tiled" and builder is None:
        raise CodegenUnsupported("the tiled kNN scan: knn_tiled.codegen_tiled renders it")
    base = _signature(params, list(in_types), int64, KernelSchedule(), symbol)
    builder = builder or _GeoBuilder
    sig = dataclasses.replace(base, slots=slots + base.slots[2:], relation=spec.descriptor())
    module = ir.Module(name=symbol)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]), name=symbol)
    ctx = Emitter(module, fn)
    builder(ctx, params, base, sig, spec).emit(*fn.args)
    ctx.b.ret_void()
    ctx.close_hoist()
    ctx.finish()
    emit_chunk_driver(module, fn)
    return str(module), sig


class _GeoBuilder(_KernelBuilder):
    def __init__(self, ctx, params, base_sig, sig, spec: GeoSpec):
        super().__init__(ctx, params, base_sig, traversal=f"{_NoWalk.hierarchy}-row")
        self.sig, self.spec = sig, spec
        self.walk = _NoWalk()
        self.pdt = as_dtype(spec.pos_dtype)
        self.pty = storage_type(self.pdt)
        if params["reducer"].arity and not self.reds:
            raise CodegenUnsupported("a generated relation with no reducer")

    # ---- plain IR helpers (no contraction: distances must round like numpy's) ----------

    def _ld(self, slot, idx, ty):
        return self.b.load(self.b.gep(self.ptr[slot], [idx], source_etype=ty), typ=ty)

    def _st(self, ptr, idx, ty, val):
        self.b.store(val, self.b.gep(ptr, [idx], source_etype=ty))

    def _imax(self, a, b):
        return self.b.select(self.b.icmp_signed(">", a, b), a, b)

    def _imin(self, a, b):
        return self.b.select(self.b.icmp_signed("<", a, b), a, b)

    def _fmin(self, a, b):
        return self.b.select(self.b.fcmp_ordered("<", a, b), a, b)

    # ---- entry -------------------------------------------------------------------------

    def _enter(self, argv) -> None:
        """Load the arguments and open the once-per-call hoist block, as the generic
        kernel does (kernel.py): the edge function's weights read along a strided axis are
        then re-laid out there and multiplied by the same fused matvec (rules/linalg.py).
        Without it they took the plain loop, whose messages round differently, and the
        max/min VJP, which finds the winning edge by recomputing messages in the generic
        kernel and comparing them with this kernel's result, lost the cotangent."""
        self._load_args(argv)
        self.ctx.open_hoist()

    def emit(self, begin, end, argv) -> None:
        self._enter(argv)
        b, d = self.b, self.spec.dims
        self.cutoff = self._ld("geo_f", i64(0), F64)
        if self.pty != F64:
            self.cutoff = b.fptrunc(self.cutoff, self.pty)
        self.inv_w = self._ld("geo_f", i64(1), F64)
        self.width = self._ld("geo_f", i64(2), F64)
        self.sq_cutoff = self._ld("geo_f", i64(3), F64)
        if self.pty != F64:
            self.sq_cutoff = b.fptrunc(self.sq_cutoff, self.pty)
        self.lo = [self._ld("geo_f", i64(4 + k), F64) for k in range(d)]
        self.num_src = self._ld("geo_i", i64(0), I64)
        self.dims = [self._ld("geo_i", i64(1 + k), I64) for k in range(d)]
        self.reach = self._ld("geo_i", i64(2 + d), I64)
        self.floor = self.ctx.intrinsic("llvm.floor", F64)
        self.last_row = b.sub(end, i64(1))
        if self.spec.mode == "cells":
            self.vtest = VectorTest(self, geo_lanes_wide())
        self.ctx.loop(begin, end, self._geo_row, name="row")

    # ---- one destination row ------------------------------------------------------------

    def _geo_row(self, t) -> None:
        b, d, spec = self.b, self.spec.dims, self.spec
        r = self._ld("row_order", t, I64)
        self._prefetch_rows(t)
        rows = self._row_vals(r)
        # query=None: the runtime passes the directory's own order as the row order, and
        # row t's coordinates are then sorted_pos[t] (near the last row's, not a random
        # read of qpos[r])
        same = b.icmp_unsigned("==", b.ptrtoint(self.ptr["row_order"], I64),
                               b.ptrtoint(self.ptr["sorted_idx"], I64))
        qrow = b.select(same, b.gep(self.ptr["sorted_pos"], [b.mul(t, i64(d))],
                                    source_etype=self.pty),
                        b.gep(self.ptr["qpos"], [b.mul(r, i64(d))], source_etype=self.pty))
        q = [b.load(b.gep(qrow, [i64(k)], source_etype=self.pty), typ=self.pty)
             for k in range(d)]
        states = [red.init(self.ctx) for red in self.reds]
        count = self.ctx.alloca(I64, 1)
        b.store(i64(0), count)

        def fold(idx):
            self._fold(i64(0), rows, states, idx)
            b.store(b.add(b.load(count, typ=I64), i64(1)), count)

        # with query=None rows are visited in directory order: row t is sorted point t
        self.own = t
        cells = self._cells(q) if spec.mode == "cells" else None
        if spec.kind == "radius" and spec.k == 0:
            self._compacted(cells, q, fold)
        else:
            self._top_k(cells, q, r, fold)
        outs = self._finish(states, b.load(count, typ=I64), rows)
        self._store_row(outs, r)

    def _prefetch_rows(self, t) -> None:
        """Rows are visited in cell order, so their destination fields and outputs (in the
        callers' order) are random reads and writes: fetch those of the row ROW_AHEAD
        visits ahead (a row's walk is long enough to hide one miss behind it)."""
        b, i32 = self.b, ir.IntType(32)
        ahead = self._ld("row_order", self._imin(b.add(t, i64(ROW_AHEAD)), self.last_row), I64)
        slots = [(f"field:{i}", self.sig.field_shapes[i], self.sig.field_dtypes[i], 0)
                 for i, role in enumerate(self.sig.roles) if role == "dst"]
        slots += [(f"out:{k}", s, dt, 1) for k, (s, dt) in
                  enumerate(zip(self.sig.out_shapes, self.sig.out_dtypes))]
        for slot, shape, dtype, write in slots:
            ptr = self._row_of(slot, shape, as_dtype(dtype), ahead).ptr
            b.call(self.ctx.prefetch_fn(), [ptr, ir.Constant(i32, write), ir.Constant(i32, 3),
                                            ir.Constant(i32, 1)])

    def _compacted(self, cells, q, fold, final=None, reach=None, cut=None) -> None:
        """Radius rows without a bound: the test is branch-free (accepted sorted positions
        are appended to a stack buffer) and the buffer is folded in one tight loop when it
        may overflow and at the row's end; a branch per candidate would mispredict on about
        a third of them. Cell walks test W candidates per vector (geo_vector.py). (The kNN
        prefilter uses it too: then `fold` inserts into the top-k state, and `final(buf,
        nbuf, flushed, flush)` takes the buffer at the row's end.)"""
        b, ctx = self.b, self.ctx
        buf = ctx.alloca(I64, COMPACT_BUFFER)
        nbuf = ctx.alloca(I64, 1)
        b.store(i64(0), nbuf)
        flushed = ctx.alloca(I8, 1)
        b.store(ir.Constant(I8, 0), flushed)

        def flush():
            ctx.loop(i64(0), b.load(nbuf, typ=I64), lambda j: fold(b.load(
                b.gep(buf, [j], source_etype=I64), typ=I64)), name="acc")
            b.store(i64(0), nbuf)

        def mid_flush():
            b.store(ir.Constant(I8, 1), flushed)
            flush()

        if cells is not None:
            self.vtest.row(q, self.sq_cutoff if cut is None else cut)
            run = lambda t0, t1: self.vtest.test_range(t0, t1, buf, COMPACT_BUFFER, nbuf,
                                                       mid_flush)
        else:
            run = self._scalar_blocks(q, buf, nbuf, mid_flush)
        self._visit(cells, self.reach if reach is None else reach, None, ring=False, run=run)
        if final is None:
            flush()
        else:
            final(buf, nbuf, b.load(flushed, typ=I8), flush)

    def _scalar_blocks(self, q, buf, nbuf, flush):
        """run(t0, t1) of the scan mode (any dims): COMPACT_BLOCK candidates at a time."""
        b, ctx = self.b, self.ctx
        flags = ctx.alloca(I8, COMPACT_BLOCK)

        def run(t0, t1):
            # (t1 >= t0, and COMPACT_BLOCK is a power of two: a shift, not a division)
            blocks = b.ashr(b.add(b.sub(t1, t0), i64(COMPACT_BLOCK - 1)),
                            i64(COMPACT_BLOCK.bit_length() - 1))

            def block(j):
                near_full = b.icmp_signed(">", b.load(nbuf, typ=I64),
                                          i64(COMPACT_BUFFER - COMPACT_BLOCK))
                with b.if_then(near_full, likely=False):
                    flush()
                start = b.add(t0, b.mul(j, i64(COMPACT_BLOCK)))
                stop = self._imin(b.add(start, i64(COMPACT_BLOCK)), t1)

                # two passes: the test alone has no loop-carried dependency (LLVM
                # vectorises it), the compaction is a short scalar loop over its flags
                def test(tpos):
                    keep = self._keep(tpos, self._d2(tpos, q))
                    b.store(b.zext(keep, I8), b.gep(flags, [b.sub(tpos, start)],
                                                    source_etype=I8))

                def compact(j):
                    n = b.load(nbuf, typ=I64)
                    b.store(b.add(start, j), b.gep(buf, [n], source_etype=I64))
                    keep = b.load(b.gep(flags, [j], source_etype=I8), typ=I8)
                    b.store(b.add(n, b.zext(keep, I64)), nbuf)

                ctx.loop(start, stop, test, name="test")
                ctx.loop(i64(0), b.sub(stop, start), compact, name="compact")

            ctx.loop(i64(0), blocks, block, name="block")

        return run

    def _candidate(self, tpos, q):
        """(source index, squared distance in the coordinates' dtype) of sorted point tpos."""
        return self._ld("sorted_idx", tpos, I64), self._d2(tpos, q)

    def _d2(self, tpos, q):
        b, d = self.b, self.spec.dims
        base = b.mul(tpos, i64(d))
        d2 = None
        for k in range(d):
            p = self._ld("sorted_pos", b.add(base, i64(k)), self.pty)
            diff = ir.IRBuilder.fsub(b, p, q[k])
            sq = ir.IRBuilder.fmul(b, diff, diff)
            d2 = sq if d2 is None else ir.IRBuilder.fadd(b, d2, sq)
        return d2

    def _not_self(self, tpos):
        if not self.spec.exclude_self:
            return None
        return self.b.icmp_signed("!=", tpos, self.own)

    def _keep(self, tpos, d2):
        """distance <= cutoff, as d2 <= the largest square whose sqrt is <= cutoff (exact)."""
        b = self.b
        ok = b.fcmp_ordered("<=", d2, self.sq_cutoff)
        other = self._not_self(tpos)
        return ok if other is None else b.and_(ok, other)

    # ---- the directory walk ------------------------------------------------------------

    def _cells(self, q) -> list:
        """Per axis: (unclamped position in cell units (f64), clamped cell coordinate)."""
        b, out = self.b, []
        for k in range(self.spec.dims):
            qk = q[k] if self.pty == F64 else b.fpext(q[k], F64)
            u = ir.IRBuilder.fmul(b, ir.IRBuilder.fsub(b, qk, self.lo[k]), self.inv_w)
            f = b.call(self.floor, [u])
            top = b.sitofp(b.sub(self.dims[k], i64(1)), F64)
            f = b.select(b.fcmp_ordered(">", f, ir.Constant(F64, 0.0)), f, ir.Constant(F64, 0.0))
            f = self._fmin(f, top)
            out.append((u, b.fptosi(f, I64)))
        return out

    def _visit(self, cells, s, body, ring: bool, run=None) -> None:
        """Call body(tpos) for every sorted point in the cells at Chebyshev distance <= s
        (ring=False) or exactly s (ring=True) around the row's cell; scan mode: all points.
        With `run`, call run(t0, t1) once per index range instead."""
        b = self.b
        if run is None:
            def run(t0, t1):
                self.ctx.loop(t0, t1, body, name="cand")
        self.run = run
        if cells is None:
            run(i64(0), self.num_src)
            return
        d = self.spec.dims

        def outer(axis, prefix, on_ring):
            if axis == d - 1:
                self._last_axis(prefix, on_ring, cells[-1][1], s, body, ring)
                return
            c = cells[axis][1]
            lo = self._imax(b.sub(c, s), i64(0))
            hi = b.add(self._imin(b.add(c, s), b.sub(self.dims[axis], i64(1))), i64(1))

            def step(x):
                lin = b.add(b.mul(prefix, self.dims[axis]), x)
                edge = b.icmp_signed("==", self._iabs(b.sub(x, c)), s)
                outer(axis + 1, lin, b.or_(on_ring, edge))

            self.ctx.loop(lo, hi, step, name=f"cell{axis}")

        outer(0, i64(0), b.icmp_signed("==", s, i64(0)))

    def _iabs(self, x):
        return self.b.select(self.b.icmp_signed("<", x, i64(0)), self.b.neg(x), x)

    def _last_axis(self, prefix, on_ring, c, s, body, ring: bool) -> None:
        b = self.b
        dz = self.dims[-1]
        row0 = b.mul(prefix, dz)
        z0 = self._imax(b.sub(c, s), i64(0))
        z1 = self._imin(b.add(c, s), b.sub(dz, i64(1)))
        if not ring:
            self._range(b.add(row0, z0), b.add(row0, z1), body)
            return
        # on the ring's boundary in an outer axis: the whole run; else its two end cells
        za, zb = b.sub(c, s), b.add(c, s)
        ok_a = b.or_(on_ring, b.icmp_signed(">=", za, i64(0)))
        ok_b = b.and_(b.not_(on_ring), b.icmp_signed("<", zb, dz))
        a_lo = b.select(on_ring, z0, self._imax(za, i64(0)))
        a_hi = b.select(on_ring, z1, self._imax(za, i64(0)))
        self._range(b.add(row0, a_lo), b.add(row0, a_hi), body, ok_a)
        zb_c = self._imin(zb, b.sub(dz, i64(1)))
        self._range(b.add(row0, zb_c), b.add(row0, zb_c), body, ok_b)

    def _range(self, cell_a, cell_b, body, valid=None) -> None:
        """Points of cells cell_a..cell_b (inclusive, consecutive in the directory)."""
        b = self.b
        t0 = self._ld("cell_start", cell_a, I64)
        t1 = self._ld("cell_start", b.add(cell_b, i64(1)), I64)
        if valid is not None:
            t1 = b.select(valid, t1, t0)
        self.run(t0, t1)

    # ---- bounded sorted state (knn, radius with max_neighbors) --------------------------

    def _top_k(self, cells, q, r, fold) -> None:
        b, ctx, spec = self.b, self.ctx, self.spec
        k = spec.k
        best_d = ctx.alloca(self.pty, k + 1)     # (slot k: rank_select's spare)
        best_i = ctx.alloca(I64, k + 1)
        best_t = ctx.alloca(I64, k + 1)
        nbest = ctx.alloca(I64, 1)
        accepted = ctx.alloca(I64, 1)
        b.store(i64(0), nbest)
        b.store(i64(0), accepted)

        def offer(tpos):
            idx, d2 = self._candidate(tpos, q)
            if spec.kind == "radius":
                ok = self._keep(tpos, d2)
            else:
                ok = self._not_self(tpos)
            if ok is None:
                self._insert(best_d, best_i, best_t, nbest, d2, idx, tpos)
                return
            with b.if_then(ok):
                if spec.kind == "radius":
                    b.store(b.add(b.load(accepted, typ=I64), i64(1)), accepted)
                self._insert(best_d, best_i, best_t, nbest, d2, idx, tpos)

        if spec.kind == "radius" or cells is None:
            self._visit(cells, self.reach, offer, ring=False)
        else:
            self._knn_levels(cells, q, best_d, best_i, best_t, nbest)
        if spec.kind == "radius":
            over = b.icmp_signed(">", b.load(accepted, typ=I64), i64(k))
            with b.if_then(over):
                b.atomic_rmw("add", self.ptr["stats"], i64(1), "monotonic")
        n = b.load(nbest, typ=I64)
        ctx.loop(i64(0), n, lambda j: fold(self.b.load(
            self.b.gep(best_t, [j], source_etype=I64), typ=I64)), name="kept")

    def _less(self, da, ia, db, ib):
        b = self.b
        return b.or_(b.fcmp_ordered("<", da, db),
                     b.and_(b.fcmp_ordered("==", da, db), b.icmp_signed("<", ia, ib)))

    def _insert(self, best_d, best_i, best_t, nbest, d2, idx, tpos) -> None:
        """Insert (d2, idx) into the ascending state of at most k entries."""
        b, k, fn = self.b, self.spec.k, self.ctx.fn
        n = b.load(nbest, typ=I64)
        full = b.icmp_signed("==", n, i64(k))
        last = i64(k - 1)
        ld = b.load(b.gep(best_d, [last], source_etype=self.pty), typ=self.pty)
        li = b.load(b.gep(best_i, [last], source_etype=I64), typ=I64)
        go = b.or_(b.not_(full), self._less(d2, idx, ld, li))
        with b.if_then(go):
            b.store(b.select(full, n, b.add(n, i64(1))), nbest)
            start = b.select(full, last, n)
            pre = b.block
            head = fn.append_basic_block("shift.head")
            move = fn.append_basic_block("shift.move")
            done = fn.append_basic_block("shift.done")
            b.branch(head)
            b.position_at_end(head)
            p = b.phi(I64, name="slot")
            p.add_incoming(start, pre)
            prev = b.sub(p, i64(1))
            prev_c = self._imax(prev, i64(0))
            pd = b.load(b.gep(best_d, [prev_c], source_etype=self.pty), typ=self.pty)
            pi = b.load(b.gep(best_i, [prev_c], source_etype=I64), typ=I64)
            pt = b.load(b.gep(best_t, [prev_c], source_etype=I64), typ=I64)
            shift = b.and_(b.icmp_signed(">", p, i64(0)), self._less(d2, idx, pd, pi))
            b.cbranch(shift, move, done)
            b.position_at_end(move)
            self._st(best_d, p, self.pty, pd)
            self._st(best_i, p, I64, pi)
            self._st(best_t, p, I64, pt)
            p.add_incoming(prev, move)
            b.branch(head)
            b.position_at_end(done)
            self._st(best_d, p, self.pty, d2)
            self._st(best_i, p, I64, idx)
            self._st(best_t, p, I64, tpos)

    def _knn_levels(self, cells, q, best_d, best_i, best_t, nbest) -> None:
        """kNN rows by growing blocks s = reach, reach + 1, ...: the sources of the cells at
        Chebyshev distance <= s with d2 <= T_s are tested W at a time and the k nearest of
        them selected (by rank, or by insertion past RANK_MAX); the row stops when k were
        found and the k-th is closer than every cell outside the block (or the block is the
        whole grid). Every source left out is then farther than the k-th: outside the block
        it is at least the block's gap away, inside it has d2 > T_s >= the k-th. T_reach is
        the squared estimated k-th distance (geo_f cutoff slot), then T_s = min(the block's
        squared gap, max(LEVEL_GROWTH x T_(s-1), the last block's squared gap)): a row short
        of k in a sparse region takes a few more candidates, not the whole next block (+inf
        once the block is the grid)."""
        b, fn, k, pty = self.b, self.ctx.fn, self.spec.k, self.pty
        s_ptr, t_ptr = self.ctx.alloca(I64, 1), self.ctx.alloca(pty, 1)
        inf = ir.Constant(pty, float("inf"))
        b.store(self.reach, s_ptr)
        b.store(b.select(self._gap(cells, self.reach)[1], inf, self.sq_cutoff), t_ptr)

        def insert(tpos):
            self._insert(best_d, best_i, best_t, nbest, self._d2(tpos, q),
                         self._ld("sorted_idx", tpos, I64), tpos)

        def final(buf, nbuf, flushed, flush):
            m = b.load(nbuf, typ=I64)
            few = b.and_(b.icmp_signed("<=", m, i64(RANK_MAX)),
                         b.icmp_signed("==", flushed, ir.Constant(I8, 0)))
            with b.if_else(few) as (by_rank, by_insertion):
                with by_rank:
                    rank_select(self, q, buf, m, best_d, best_i, best_t, nbest, self.vtest.W)
                with by_insertion:
                    flush()

        head = fn.append_basic_block("level")
        done = fn.append_basic_block("level.done")
        b.branch(head)
        b.position_at_end(head)
        s = b.load(s_ptr, typ=I64)
        b.store(i64(0), nbest)
        self._compacted(cells, q, insert, final, reach=s, cut=b.load(t_ptr, typ=pty))
        gap, covered = self._gap(cells, s)
        kth = b.load(b.gep(best_d, [i64(k - 1)], source_etype=pty), typ=pty)
        kth = kth if pty == F64 else b.fpext(kth, F64)
        safe = ir.IRBuilder.fmul(b, gap, ir.Constant(F64, GAP_SAFETY))
        bound = b.and_(b.fcmp_ordered(">", safe, ir.Constant(F64, 0.0)),
                       b.fcmp_ordered("<", kth, ir.IRBuilder.fmul(b, safe, safe)))
        full = b.icmp_signed("==", b.load(nbest, typ=I64), i64(k))
        stop = b.or_(covered, b.and_(full, bound))
        nxt = b.add(s, i64(1))
        gap1, covered1 = self._gap(cells, nxt)
        safe1 = ir.IRBuilder.fmul(b, gap1, ir.Constant(F64, GAP_SAFETY))
        t1 = ir.IRBuilder.fmul(b, safe1, safe1)
        grown = b.load(t_ptr, typ=pty)
        grown = ir.IRBuilder.fmul(b, grown if pty == F64 else b.fpext(grown, F64),
                                  ir.Constant(F64, LEVEL_GROWTH))
        floor = ir.IRBuilder.fmul(b, safe, safe)   # (never stuck below this block's reach)
        t1 = self._fmin(t1, b.select(b.fcmp_ordered(">", grown, floor), grown, floor))
        t1 = t1 if pty == F64 else b.fptrunc(t1, pty)
        b.store(nxt, s_ptr)
        b.store(b.select(covered1, inf, t1), t_ptr)
        b.cbranch(stop, done, head)
        b.position_at_end(done)

    def _gap(self, cells, s):
        """(distance from the query to the cells outside the ring-s block (f64, inf when
        none), whether the block covers the whole grid)."""
        b = self.b
        inf = ir.Constant(F64, float("inf"))
        gap, covered = inf, ir.Constant(ir.IntType(1), 1)
        for k, (u, c) in enumerate(cells):
            low, high = b.sub(c, s), b.add(c, s)
            at_lo = b.icmp_signed("<=", low, i64(0))
            at_hi = b.icmp_signed(">=", high, b.sub(self.dims[k], i64(1)))
            g_lo = ir.IRBuilder.fsub(b, u, b.sitofp(low, F64))
            g_hi = ir.IRBuilder.fsub(b, b.sitofp(b.add(high, i64(1)), F64), u)
            gap = self._fmin(gap, b.select(at_lo, inf, g_lo))
            gap = self._fmin(gap, b.select(at_hi, inf, g_hi))
            covered = b.and_(covered, b.and_(at_lo, at_hi))
        return ir.IRBuilder.fmul(b, gap, self.width), covered


DIRECTORY_SLOTS = ("points", "geo_f", "geo_i", "cell_of", "cell_start", "cursor", "sorted_idx",
                   "sorted_pos")


def codegen_directory(dims: int, pos_dtype: str, *, symbol: str = "tiga_directory") -> tuple:
    """`void build(i64 n, i64 _, ptr argv)`: the cell directory of n points by counting sort
    (stable: each cell lists its points in ascending index). cell_start (cells + 1 zeros on
    entry) ends as the cell start offsets; cursor and cell_of are scratch."""
    sig = KernelSignature(target="cpu-llvm", symbol=symbol, walk="dst", reduce_by="dst",
                          slots=DIRECTORY_SLOTS, roles=(), field_shapes=(), field_dtypes=(),
                          out_shapes=(), out_dtypes=(), index_dtype="int64", parallel="single",
                          relation=("directory", dims, pos_dtype))
    module = ir.Module(name=symbol)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]), name=symbol)
    ctx = Emitter(module, fn)
    n, _, argv = fn.args
    b = ctx.b
    pty = storage_type(as_dtype(pos_dtype))
    ptr = {s_: b.load(b.gep(argv, [i64(j)], source_etype=PTR), typ=PTR)
           for j, s_ in enumerate(DIRECTORY_SLOTS)}

    def ld(slot, idx, ty):
        return b.load(b.gep(ptr[slot], [idx], source_etype=ty), typ=ty)

    def st(slot, idx, ty, v):
        b.store(v, b.gep(ptr[slot], [idx], source_etype=ty))

    inv_w = ld("geo_f", i64(1), F64)
    lo = [ld("geo_f", i64(4 + k), F64) for k in range(dims)]
    dim = [ld("geo_i", i64(1 + k), I64) for k in range(dims)]
    cells = ld("geo_i", i64(1 + dims), I64)
    floor = ctx.intrinsic("llvm.floor", F64)
    zero = ir.Constant(F64, 0.0)

    def cell_of(i):
        lin = i64(0)
        for k in range(dims):
            x = ld("points", b.add(b.mul(i, i64(dims)), i64(k)), pty)
            x = x if pty == F64 else b.fpext(x, F64)
            f = b.call(floor, [b.fmul(b.fsub(x, lo[k]), inv_w)])
            f = b.select(b.fcmp_ordered(">", f, zero), f, zero)
            top = b.sitofp(b.sub(dim[k], i64(1)), F64)
            f = b.select(b.fcmp_ordered("<", f, top), f, top)
            lin = b.add(b.mul(lin, dim[k]), b.fptosi(f, I64))
        return lin

    def count(i):
        c = cell_of(i)
        st("cell_of", i, I64, c)
        slot = b.add(c, i64(1))
        st("cell_start", slot, I64, b.add(ld("cell_start", slot, I64), i64(1)))

    def prefix(c):
        nxt = b.add(c, i64(1))
        total = b.add(ld("cell_start", nxt, I64), ld("cell_start", c, I64))
        st("cell_start", nxt, I64, total)
        st("cursor", c, I64, ld("cell_start", c, I64))

    def scatter(i):
        c = ld("cell_of", i, I64)
        t = ld("cursor", c, I64)
        st("cursor", c, I64, b.add(t, i64(1)))
        st("sorted_idx", t, I64, i)
        for k in range(dims):
            v = ld("points", b.add(b.mul(i, i64(dims)), i64(k)), pty)
            st("sorted_pos", b.add(b.mul(t, i64(dims)), i64(k)), pty, v)

    ctx.loop(i64(0), n, count, name="count")
    ctx.loop(i64(0), cells, prefix, name="prefix")
    ctx.loop(i64(0), n, scatter, name="scatter")
    b.ret_void()
    ctx.finish()
    return str(module), sig


__all__ = ["codegen_generated", "codegen_directory", "GeoSpec", "GEO_SLOTS", "DIRECTORY_SLOTS",
           "MAX_TOPK"]
