"""lower/llvm: the knn-tiled-scan walk: exact kNN in any number of dims, fused with the propagate.

Above FAST_DIMS coordinate dims a cell directory degenerates, so each query row is compared
with every source, but never through an N x M array and never one pair at a time:

- sources are packed once per call into panels of W (vector width) points, coordinate-major
  (`panel[b, k, w]` = coordinate k of source b*W + w), padded to whole panels;
- a thread takes its rows in tiles of `rows_per_tile` queries; for each chunk of
  `blocks_per_chunk` panels (sized to stay in L2) every group of R queries runs a
  register-blocked product: R x V vector accumulators of `2 q.p` (fused multiply-adds),
  then `a_p - 2 q.p <= thr_q` per lane, one compare and one mask test per vector;
- the few lanes that pass are re-scored exactly, `sum_k (p_k - q_k)^2` in axis order and in
  the coordinates' dtype without contraction (lane-parallel, the same rounding as numpy's
  reference, core/graph_generated.py), and inserted into the row's sorted top-k state
  (distance, then smaller source index; self excluded by index with loop=False);
- when a tile has seen every source, each row folds its k sources nearest first through the
  edge function into the reducer (the generic kernel's folds, kernel.py).

Exactness. `a_p = (1 - c) |p|^2`, `a_q = (1 - c) |q|^2` (norms in float64, rounded to the
coordinates' dtype) and `thr_q = t (1 + c) + delta - a_q`, where t is the row's current k-th
exact distance (a huge finite value until k are held). With u the unit roundoff and d the
dims, the product `q.p` errs by at most gamma_d (|q|^2 + |p|^2) / 2 in any summation order,
fused or not, and the reference distance by gamma_(d+2) of itself; the roundings of a_p, a_q,
the test's subtraction and thr add a few u of |q|^2 + |p|^2 + t. c = 4 (d + 8) u bounds all of
them twice over (first order; the second-order terms are below u^2 d^2), and
delta = (4 d + 16) * smallest-normal covers underflow (flush-to-zero included). Hence every
source whose exact distance is <= t passes the filter: the test is a lower bound of the exact
distance. t only decreases while a row scans, so every source that ends in the row's top k
(exact distance <= the final t) passed the filter when it was scanned, was re-scored exactly
and inserted; a source that failed has exact distance > t >= final t and is beaten by k
sources. The neighbour set and order therefore equal the reference's (ties by index). Norms
near the dtype's range would overflow the expanded form: the runtime then uses the plain
exact scan ("scan" mode of generated.py) instead. Padding lanes carry a_p = +inf and never
pass.
"""
from __future__ import annotations

from llvmlite import ir

from .generated import GeoSpec, _GeoBuilder, codegen_generated
from .values import F64, I64, i64

TILED_SLOTS = ("geo_f", "geo_i", "panel", "pnorm", "qpos", "qnorm", "tile_d", "tile_i",
               "tile_thr", "tile_n", "stats")
I32 = ir.IntType(32)


def codegen_tiled(params: dict, in_types: list, spec: GeoSpec, *,
                  symbol: str = "tiga_generated") -> tuple:
    """The kernel of a kNN walk of mode "tiled": generated.codegen_generated building it
    with TiledBuilder."""
    return codegen_generated(params, in_types, spec, symbol=symbol, builder=TiledBuilder,
                             slots=TILED_SLOTS)


def block_shape(pos_dtype: str, tiles: dict) -> tuple:
    """(W, R, V): lanes per vector, query rows per group, vectors per group (R x V
    accumulators), from the launch's schedule tiles (lower/schedule.knn_tiles decides
    them for the host's registers)."""
    itemsize = 4 if pos_dtype == "float32" else 8
    return (tiles["vector_bytes"] // itemsize, tiles["group_rows"], tiles["group_vectors"])


def filter_constants(dims: int, pos_dtype: str) -> tuple:
    """(c, delta) of the exactness argument in the module docstring."""
    import numpy as np

    info = np.finfo(np.dtype(pos_dtype))
    u = float(info.eps) / 2.0
    return 4.0 * (dims + 8) * u, (4.0 * dims + 16.0) * float(info.tiny)


class TiledBuilder(_GeoBuilder):
    """Emits `kernel(t_begin, t_end, argv)` over destination rows [t_begin, t_end)."""

    def emit(self, begin, end, argv) -> None:
        self._enter(argv)
        b, spec = self.b, self.spec
        self.W, self.R, self.V = spec.block
        self.VT = ir.VectorType(self.pty, self.W)
        self.MT = ir.IntType(self.W)
        suffix = f"v{self.W}{'f32' if self.pty != F64 else 'f64'}"
        self.fma = ir.Function(self.ctx.module, ir.FunctionType(self.VT, [self.VT] * 3),
                               name=f"llvm.fmuladd.{suffix}")
        self.c1 = self._f("geo_f", 0)
        self.delta = self._f("geo_f", 1)
        self.big = self._f("geo_f", 2)
        self.num_src = self._ld("geo_i", i64(0), I64)
        self.nblk = self._ld("geo_i", i64(1), I64)
        self.chunk = self._ld("geo_i", i64(2), I64)      # panels per source chunk (V | it)
        self.qb = self._ld("geo_i", i64(3), I64)         # rows per query tile (>= 1)
        ntiles = b.sdiv(b.add(b.sub(end, begin), b.sub(self.qb, i64(1))), self.qb)
        self.acc = [[self.ctx.alloca(self.VT, 1) for _ in range(self.V)] for _ in range(self.R)]
        self.exact = self.ctx.alloca(self.VT, 1)

        def tile(i):
            t0 = b.add(begin, b.mul(i, self.qb))
            t1 = self._imin(b.add(t0, self.qb), end)
            self._tile(t0, t1)

        self.ctx.loop(i64(0), ntiles, tile, name="tile")

    def _f(self, slot, j):
        v = self._ld(slot, i64(j), F64)
        return v if self.pty == F64 else self.b.fptrunc(v, self.pty)

    # ---- one query tile -----------------------------------------------------------------

    def _tile(self, t0, t1) -> None:
        b, ctx = self.b, self.ctx

        def init(r):
            self._st(self.ptr["tile_n"], r, I64, i64(0))
            self._st(self.ptr["tile_thr"], r, self.pty, self.big)

        ctx.loop(t0, t1, init, name="init")
        nchunks = b.sdiv(b.add(self.nblk, b.sub(self.chunk, i64(1))), self.chunk)
        groups = b.sdiv(b.add(b.sub(t1, t0), i64(self.R - 1)), i64(self.R))

        def chunk(ci):
            c0 = b.mul(ci, self.chunk)
            c1 = self._imin(b.add(c0, self.chunk), self.nblk)

            def group(gi):
                g0 = b.add(t0, b.mul(gi, i64(self.R)))
                rows, valid = [], []
                for j in range(self.R):
                    r = b.add(g0, i64(j))
                    valid.append(b.icmp_signed("<", r, t1))
                    rows.append(self._imin(r, b.sub(t1, i64(1))))
                nsteps = b.sdiv(b.sub(c1, c0), i64(self.V))
                ctx.loop(i64(0), nsteps, lambda s: self._micro(
                    b.add(c0, b.mul(s, i64(self.V))), rows, valid), name="blk")

            ctx.loop(i64(0), groups, group, name="group")

        ctx.loop(i64(0), nchunks, chunk, name="chunk")
        ctx.loop(t0, t1, self._fold_row, name="foldrow")

    def _fold_row(self, r) -> None:
        b, k = self.b, self.spec.k
        rows = self._row_vals(r)
        states = [red.init(self.ctx) for red in self.reds]
        n = self._ld("tile_n", r, I64)
        base = b.mul(r, i64(k))

        def fold(j):
            idx = self._ld("tile_i", b.add(base, j), I64)
            self._fold(i64(0), rows, states, idx)

        self.ctx.loop(i64(0), n, fold, name="kept")
        self._store_row(self._finish(states, n, rows), r)

    # ---- the register-blocked product and the filter -------------------------------------

    def _vload(self, slot, elem_index):
        ptr = self.b.gep(self.ptr[slot], [elem_index], source_etype=self.pty)
        return self.b.load(ptr, typ=self.VT, align=self.pdt.itemsize)

    def _splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(self.VT, ir.Undefined), x, ir.Constant(I32, 0))
        zeros = ir.Constant(ir.VectorType(I32, self.W), [0] * self.W)
        return b.shuffle_vector(v, ir.Constant(self.VT, ir.Undefined), zeros)

    def _micro(self, blk, rows, valid) -> None:
        """R rows x V panels starting at panel `blk`: accumulate q.p, then filter."""
        b, d, W = self.b, self.spec.dims, self.W
        zero = ir.Constant(self.VT, [0.0] * W)
        for row_acc in self.acc:
            for a in row_acc:
                b.store(zero, a)
        qbase = [b.mul(r, i64(d)) for r in rows]
        pbase = [b.mul(b.add(blk, i64(v)), i64(d * W)) for v in range(self.V)]

        def step(k):
            pv = [self._vload("panel", b.add(pb, b.mul(k, i64(W)))) for pb in pbase]
            for j in range(self.R):
                qv = self._splat(self._ld("qpos", b.add(qbase[j], k), self.pty))
                for v in range(self.V):
                    a = self.acc[j][v]
                    b.store(b.call(self.fma, [qv, pv[v], b.load(a, typ=self.VT)]), a)

        self.ctx.loop(i64(0), i64(d), step, name="k")
        for v in range(self.V):
            panel = b.add(blk, i64(v))
            ap = self._vload("pnorm", b.mul(panel, i64(W)))
            for j in range(self.R):
                acc = b.load(self.acc[j][v], typ=self.VT)
                s = ir.IRBuilder.fsub(b, ap, ir.IRBuilder.fadd(b, acc, acc))
                thr = self._splat(self._ld("tile_thr", rows[j], self.pty))
                bits = b.bitcast(b.fcmp_ordered("<=", s, thr), self.MT)
                hit = b.and_(b.icmp_unsigned("!=", bits, ir.Constant(self.MT, 0)), valid[j])
                with b.if_then(hit, likely=False):
                    self._admit(rows[j], panel, bits)

    # ---- exact re-check of the lanes that passed ----------------------------------------

    def _admit(self, r, panel, bits) -> None:
        b, d, W, k = self.b, self.spec.dims, self.W, self.spec.k
        b.store(ir.Constant(self.VT, [0.0] * W), self.exact)
        pbase = b.mul(panel, i64(d * W))
        qbase = b.mul(r, i64(d))

        def step(kk):
            # (p_k - q_k)^2 added in axis order, no contraction: numpy's rounding per lane
            diff = ir.IRBuilder.fsub(b, self._vload("panel", b.add(pbase, b.mul(kk, i64(W)))),
                                     self._splat(self._ld("qpos", b.add(qbase, kk), self.pty)))
            sq = ir.IRBuilder.fmul(b, diff, diff)
            b.store(ir.IRBuilder.fadd(b, b.load(self.exact, typ=self.VT), sq), self.exact)

        self.ctx.loop(i64(0), i64(d), step, name="exact")
        base = b.mul(r, i64(k))
        best_d = b.gep(self.ptr["tile_d"], [base], source_etype=self.pty)
        best_i = b.gep(self.ptr["tile_i"], [base], source_etype=I64)
        nbest = b.gep(self.ptr["tile_n"], [r], source_etype=I64)

        def lane(w):
            on = b.trunc(b.lshr(bits, b.trunc(w, self.MT)), ir.IntType(1))
            idx = b.add(b.mul(panel, i64(W)), w)
            if self.spec.exclude_self:
                on = b.and_(on, b.icmp_signed("!=", idx, r))
            with b.if_then(on):
                d2 = b.load(b.gep(self.exact, [w], source_etype=self.pty), typ=self.pty)
                self._insert(best_d, best_i, best_i, nbest, d2, idx, idx)

        self.ctx.loop(i64(0), i64(W), lane, name="lane")
        full = b.icmp_signed("==", b.load(nbest, typ=I64), i64(k))
        t = b.load(b.gep(best_d, [i64(k - 1)], source_etype=self.pty), typ=self.pty)
        aq = self._ld("qnorm", r, self.pty)
        thr = ir.IRBuilder.fsub(b, ir.IRBuilder.fadd(b, ir.IRBuilder.fmul(b, t, self.c1),
                                                     self.delta), aq)
        self._st(self.ptr["tile_thr"], r, self.pty, b.select(full, thr, self.big))
