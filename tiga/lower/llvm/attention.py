"""lower: LLVM micro-kernel of the float32 streaming attention forward.

Destination row i reads sources lo[i] <= j < hi[i], with lo and hi nondecreasing; the runtime
(`xla_free_runtime.backends.cpu.attention`) computes per-group key ranges and runs this kernel
twice:
over (head, 16 keys) jobs that pack K^T, then over (head, row block) jobs that write the
normalised output. Other dtypes, head widths, pruning and the backward run as numpy tiles
(`xla_free_runtime.backends.cpu.attention_tiles`). The IR is built with llvmlite's IR builder
(attention_common.py).
"""
from __future__ import annotations

from llvmlite import ir

from .attention_common import (
    EXP_POLY,
    I16,
    I32,
    NEG_INF,
    VF,
    VZERO,
    AttentionIR,
    W,
    fconst,
    i32,
    vconst,
)
from .values import F32, I64, PTR, i64

# ---- LLVM micro-kernel: float32 forward ------------------------------------------------
#
# `forward_ir(symbol, D, tiles)` is a kernel `void(i64 begin, i64 end, ptr argv)`; prm[PHASE]
# selects what a job is.
#
# Phase 0, (head, 16 keys): K (any row and head strides, unit element stride) is transposed
# 16 x 16 in registers into kt (H, Kpad / KS, D, KS): each KS-key step's K^T tile is one
# contiguous 16 KiB block (a (H, D, Kpad) layout puts the tile's 64 rows Kpad * 4 bytes apart,
# and at N = 4096 those rows all fall into the same few L1 sets).
#
# Phase 1, (head, block of GB * RB query rows): the block's running state (reference max,
# mass, unnormalised accumulator, lane-wise raw max) lives on the kernel's stack. For each
# key block of KB keys, each group of RB query rows reloads its state, walks its keys
# KS = NV * 16 at a time and stores it back, so the key block's K^T and V tiles stay in cache
# while GB row groups pass over them; the job ends by writing out = acc / mass (strided, in
# place), top (the true row max) and mass (rescaled to it). Per KS keys: the raw scores are
# a loop over d (4 per trip) with RB x NV <16 x float> sums in registers (6 x 4: 24
# accumulators, 4 K^T loads and 6 q broadcasts per 24 FMAs); p = exp(fma(s, scale, -m))
# against the row's reference m, which moves (row max reduction, rescale of mass and
# accumulator) only in steps where a score exceeds it by more than LAZY (scale > 0: the max
# of the scaled scores is scale times the raw max); P @ V is a loop over the step's keys up
# to the group's last admissible one, with the RB x D/16 output vectors in registers. Rows
# whose range excludes a key mask it to -inf.
# argv: q (strided), k (strided), kt, v (strided), out (strided), top/mass (H, Nq), lo/hi
# (Npad,), prm, glo/ghi per row group (KS-aligned key range), blo/bhi per row block, chk
# (2 per phase 0 job: the sums of squares of its 16 K rows and of the same 16 V rows) and chkq
# (1 per phase 1 job: of its query rows). The sums are plain IEEE arithmetic (no fast-math
# flags): a NaN or inf anywhere in q, k or v reaches them, so the runtime tells from these
# partials, computed on reads the kernel does anyway, whether the fast-math result is the
# reference's (and reruns the call on the NaN-safe tiles when it may not be).
# The tile sizes are the launch's schedule (lower/schedule.attention_tiles("forward") owns
# them; Schedule.tiles names them): group_rows (RB, query rows per register tile),
# row_groups (GB, row groups per job), key_block (KB, keys per key block, a multiple of KS),
# step_vectors (NV, <16 x float> score vectors per row and step: KS = NV * 16 keys per
# step) and pv_unroll (keys per trip of the P @ V loop).
TILES = ("group_rows", "row_groups", "key_block", "step_vectors", "pv_unroll")
LAZY = 8.0      # p <= e^LAZY between moves of a row's reference max (measured 3-5% faster)
PRM = ("npad", "kpad", "nks", "qblocks", "nq", "nk", "qhs", "qrs", "vhs", "vrs", "scbits",
       "khs", "krs", "ohs", "ors", "phase")
PHASE = PRM.index("phase")
ARGV = ("q", "k", "kt", "v", "out", "top", "mass", "lo", "hi", "prm", "glo", "ghi", "blo",
        "bhi", "chk", "chkq")
D_UNROLL = 4    # head-width elements per trip of the score loop

__all__ = ["forward_ir", "W", "TILES", "LAZY", "PRM", "PHASE", "EXP_POLY"]


def forward_ir(symbol: str, D: int, tiles: dict) -> str:
    """LLVM IR of the float32 streaming forward for head width D (a multiple of 16) with
    the schedule's `tiles` (TILES by name)."""
    assert D % W == 0
    k = AttentionIR(symbol)
    f = _Forward(k, D, tiles)
    f.entry()
    f.pack_phase()
    f.job_start()
    f.init_state()
    f.key_block_loops()
    f.group_setup()
    f.step()
    f.group_end()
    f.finish_rows()
    k.enter("exit")
    k.b.ret_void()
    return k.text()


def _squares(b, acc, vectors):
    """acc + the lane-wise squares of `vectors`, in plain IEEE arithmetic (a NaN or inf
    stays one)."""
    for x in vectors:
        acc = b.fadd(acc, b.fmul(x, x))
    return acc


def _total(k, v):
    """The sum of v's lanes (plain IEEE: in lane order, NaN and inf kept)."""
    return k.call("llvm.vector.reduce.fadd.v16f32", F32, [fconst(0.0), v])


class _Forward:
    """Emits the forward kernel's parts in order; values one part defines and a later one
    uses (pointers, parameters, a row group's state) are attributes."""

    def __init__(self, k: AttentionIR, D: int, tiles: dict):
        self.k, self.b, self.D, self.C = k, k.b, D, D // W
        self.RB, self.GB, self.KB, self.NV, self.PV_UNROLL = (int(tiles[nm]) for nm in TILES)
        self.KS = self.NV * W
        assert self.KB % self.KS == 0
        self.ROWS = self.GB * self.RB
        # partial sums per score vector (one vector: two FMA chains)
        self.PARTS = 2 if self.NV == 1 else 1

    def entry(self) -> None:
        k, b = self.k, self.b
        # the step's probabilities, RB x KS: P @ V broadcasts them from here (as register
        # values the RB x NV vectors spill, and a variable lane extract copies the spilled
        # vector first)
        self.pbuf = k.stack(self.RB * self.KS, "pbuf")
        # the row block's running state
        self.st = k.stack(self.ROWS * self.D, "st")
        self.mb = k.stack(self.ROWS, "mb")
        self.lb = k.stack(self.ROWS, "lb")
        self.mv = k.stack(self.ROWS * W, "mv")
        self.a = k.unpack(ARGV)
        self.p = k.params(self.a["prm"], PRM)
        self.nq1 = b.sub(self.p["nq"], i64(1), name="nq1")
        self.nk1 = b.sub(self.p["nk"], i64(1), name="nk1")
        self.scale = b.bitcast(b.trunc(self.p["scbits"], I32), F32, name="scale")
        self.scalev = k.splat(self.scale, "scalev")
        self.invscale = b.fdiv(fconst(1.0), self.scale, name="invscale")
        k.cbr(b.icmp_signed("==", self.p["phase"], i64(0)), "pack.entry", "main.entry")

    def pack_phase(self) -> None:
        """Phase 0 jobs (head, 16 keys): kt[h, key // KS, d, key % KS] = k[h, key, d]; keys
        past the last read key nk - 1 and store 0."""
        k, b, p, D = self.k, self.b, self.p, self.D
        k.enter("pack.entry")
        k.br("pack.head")
        k.enter("pack.head")
        pj = k.phi(I64, [(k.begin, "pack.entry")], "pj")
        k.cbr(b.icmp_signed("<", pj, k.end), "pack.body", "exit")
        k.enter("pack.body")
        k16 = b.udiv(p["kpad"], i64(16))
        ph = b.udiv(pj, k16, name="ph")
        key0 = b.mul(b.urem(pj, k16), i64(16), name="key0")
        pkeys = k.key_lanes(k.splat_index(key0), 1)[0]
        pvalid = b.icmp_signed("<", pkeys, k.splat_index(p["nk"]), name="pvalid")
        pkh = b.mul(ph, p["khs"])
        # (padding keys re-read the last key: for V's sum of squares counted twice, the bound
        # only grows)
        pkey = [k.smin(b.add(key0, i64(t)), self.nk1) for t in range(W)]
        prow = [b.add(b.mul(key, p["krs"]), pkh, name=f"prow{t}") for t, key in enumerate(pkey)]
        pstep = b.udiv(key0, i64(self.KS))
        plane = b.urem(key0, i64(self.KS))
        ptile = b.add(b.mul(ph, p["nks"]), pstep)
        pbase = b.add(b.mul(ptile, i64(D * self.KS)), plane, name="pbase")
        pvh = b.mul(ph, p["vhs"])
        vrow = [b.add(b.mul(key, p["vrs"]), pvh) for key in pkey]
        ksq = vsq = VZERO
        for c in range(self.C):
            rows = [k.vload(self.a["k"], b.add(prow[t], i64(c * W)), 4) for t in range(W)]
            vals = [k.vload(self.a["v"], b.add(vrow[t], i64(c * W)), 4) for t in range(W)]
            ksq, vsq = _squares(b, ksq, rows), _squares(b, vsq, vals)
            cols = k.transpose16(rows)
            for dd in range(W):
                z = b.select(pvalid, cols[dd], VZERO)
                k.vstore(z, self.a["kt"], b.add(pbase, i64((c * W + dd) * self.KS)), 4)
        slot = b.mul(pj, i64(2))
        b.store(_total(k, ksq), k.at(self.a["chk"], slot))
        b.store(_total(k, vsq), k.at(self.a["chk"], b.add(slot, i64(1))))
        pj.add_incoming(b.add(pj, i64(1)), b.block)
        k.br("pack.head")

    def job_start(self) -> None:
        """A phase 1 job: (head h, row block qb)."""
        k, b, p = self.k, self.b, self.p
        k.enter("main.entry")
        k.br("job.head")
        k.enter("job.head")
        self.job = k.phi(I64, [(k.begin, "main.entry")], "job")
        k.cbr(b.icmp_signed("<", self.job, k.end), "job.body", "exit")
        k.enter("job.body")
        self.h = b.udiv(self.job, p["qblocks"], name="h")
        qb = b.urem(self.job, p["qblocks"], name="qb")
        self.bstart = k.fetch(self.a["blo"], qb, I64, "bstart")
        self.bend = k.fetch(self.a["bhi"], qb, I64, "bend")
        self.g0 = b.mul(qb, i64(self.GB), name="g0")
        self.qb_rows = b.mul(qb, i64(self.ROWS), name="qb.rows")
        self.qh = b.mul(self.h, p["qhs"], name="qh")
        self.vh = b.mul(self.h, p["vhs"], name="vh")
        self.kth = b.mul(self.h, p["nks"], name="kth")
        k.br("chkq.loop")
        # the sum of squares of the block's query rows (padding rows re-read the last row)
        k.enter("chkq.loop")
        r = k.phi(I64, [(i64(0), "job.body")], "chkq.r")
        acc = k.phi(VF, [(VZERO, "job.body")], "chkq.acc")
        row = k.smin(b.add(self.qb_rows, r), self.nq1)
        base = b.add(b.mul(row, p["qrs"]), self.qh)
        vals = [k.vload(self.a["q"], b.add(base, i64(c * W)), 4) for c in range(self.C)]
        nacc = _squares(b, acc, vals)
        nr = b.add(r, i64(1))
        r.add_incoming(nr, b.block)
        acc.add_incoming(nacc, b.block)
        k.cbr(b.icmp_signed("<", nr, i64(self.ROWS)), "chkq.loop", "chkq.done")
        k.enter("chkq.done")
        b.store(_total(k, nacc), k.at(self.a["chkq"], self.job))
        k.br("init.loop")

    def init_state(self) -> None:
        """The block's state: accumulators 0, reference max -inf, mass 0, lane max -inf."""
        k, b = self.k, self.b
        k.enter("init.loop")
        ii = k.phi(I64, [(i64(0), "chkq.done")], "ii")
        iio = b.mul(ii, i64(W))
        k.vstore(VZERO, self.st, iio, 64)
        k.cbr(b.icmp_unsigned("<", ii, i64(self.ROWS)), "init.row", "init.next")
        k.enter("init.row")
        b.store(fconst(NEG_INF), k.at(self.mb, ii))
        b.store(fconst(0.0), k.at(self.lb, ii))
        k.vstore(vconst(NEG_INF), self.mv, iio, 64)
        k.br("init.next")
        k.enter("init.next")
        nxt = b.add(ii, i64(1))
        ii.add_incoming(nxt, b.block)
        k.cbr(b.icmp_unsigned("<", nxt, i64(self.ROWS * self.C)), "init.loop", "kb.head")

    def key_block_loops(self) -> None:
        """for kb in key blocks: for gi in the block's row groups (bodies: group_setup...)."""
        k, b = self.k, self.b
        k.enter("kb.head")
        self.kb = k.phi(I64, [(self.bstart, "init.next")], "kb")
        k.cbr(b.icmp_signed("<", self.kb, self.bend), "kb.body", "fin.head")
        k.enter("kb.body")
        self.kbe = b.add(self.kb, i64(self.KB), name="kbe")
        k.br("grp.head")
        k.enter("grp.head")
        self.gi = k.phi(I64, [(i64(0), "kb.body")], "gi")
        k.cbr(b.icmp_signed("<", self.gi, i64(self.GB)), "grp.body", "grp.exit")
        k.enter("grp.exit")
        self.kb.add_incoming(b.add(self.kb, i64(self.KB)), b.block)
        k.br("kb.head")

    def group_setup(self) -> None:
        """A group of RB rows: its key range in this key block, its rows' ranges, and its
        state loaded from the stack."""
        k, b, a = self.k, self.b, self.a
        k.enter("grp.body")
        g = b.add(self.g0, self.gi, name="g")
        glo, ghi = k.fetch(a["glo"], g, I64), k.fetch(a["ghi"], g, I64)
        self.kstart = k.smax(self.kb, glo, "kstart")
        self.kmax = k.smin(self.kbe, ghi, "kmax")
        r0 = b.mul(g, i64(self.RB))
        lrb = b.mul(self.gi, i64(self.RB))
        rows, lo, hi, self.lov, self.hiv = [], [], [], [], []
        for r in range(self.RB):
            rows.append(b.add(r0, i64(r), name=f"row{r}"))
            lo.append(k.fetch(a["lo"], rows[r], I64, f"lo{r}"))
            hi.append(k.fetch(a["hi"], rows[r], I64, f"hi{r}"))
            lo_t, hi_t = b.trunc(lo[r], I32), b.trunc(hi[r], I32)
            self.lov.append(k.splat(lo_t, f"lov{r}"))
            self.hiv.append(k.splat(hi_t, f"hiv{r}"))
        # a step wholly inside every row's range needs no mask (padding rows: hi = 0, never)
        self.mlo, mhi = lo[0], hi[0]
        for r in range(1, self.RB):
            self.mlo, mhi = k.smax(self.mlo, lo[r]), k.smin(mhi, hi[r])
        self.inhi = b.sub(mhi, i64(self.KS), name="inhi")
        self._load_group_state(rows, lrb)
        k.br("k.head")

    def _load_group_state(self, rows, lrb) -> None:
        k, b, p = self.k, self.b, self.p
        self.qsrc, self.tp, self.mp, self.mvp, self.yp, self.state_in = [], [], [], [], [], []
        for r in range(self.RB):
            lr = b.add(lrb, i64(r))
            so = b.mul(lr, i64(self.D))
            # q is read in place (head stride qhs, row stride qrs); padding rows read row
            # nq - 1
            qrc = k.smin(rows[r], self.nq1)
            self.qsrc.append(b.add(self.qh, b.mul(qrc, p["qrs"]), name=f"qsrc{r}"))
            self.tp.append(k.at(self.mb, lr))
            m_in = k.load(self.tp[r], name=f"m{r}.in")
            self.mp.append(k.at(self.lb, lr))
            l_in = k.load(self.mp[r], name=f"l{r}.in")
            self.mvp.append(k.at(self.mv, b.mul(lr, i64(W))))
            self.yp.append([])
            o_in = []
            for c in range(self.C):
                self.yp[r].append(k.at(self.st, b.add(so, i64(c * W))))
                o_in.append(k.load(self.yp[r][c], VF, 64, f"o{r}_{c}.in"))
            self.state_in.append((m_in, l_in, o_in))

    # ---- one step of KS keys -------------------------------------------------------------

    def step(self) -> None:
        """The group's walk over its keys, KS at a time: scores, the softmax update and
        P @ V, with the rows' state (m, l, accumulators) in registers."""
        k, b = self.k, self.b
        k.enter("k.head")
        self.j = k.phi(I64, [(self.kstart, "grp.body")], "j")
        self.m, self.l, self.o = [], [], []
        for r, (m_in, l_in, o_in) in enumerate(self.state_in):
            self.m.append(k.phi(F32, [(m_in, "grp.body")], f"m{r}"))
            self.l.append(k.phi(F32, [(l_in, "grp.body")], f"l{r}"))
            self.o.append([k.phi(VF, [(x, "grp.body")], f"o{r}_{c}")
                           for c, x in enumerate(o_in)])
        k.cbr(b.icmp_signed("<", self.j, self.kmax), "k.body", "k.exit")
        k.enter("k.body")
        self.lanes = k.key_lanes(k.splat_index(self.j, "jv"), self.NV)
        ktile = b.add(self.kth, b.udiv(self.j, i64(self.KS)))
        self.ktbase = b.mul(ktile, i64(self.D * self.KS), name="ktbase")
        k.br("qk.loop")
        self._scores()
        self._mask()
        self._lazy_max()
        self._probabilities()
        self._pv()
        k.enter("pv.done")
        self.j.add_incoming(b.add(self.j, i64(self.KS)), b.block)
        for r in range(self.RB):
            self.m[r].add_incoming(self.mn[r], b.block)
            self.l[r].add_incoming(self.ln[r], b.block)
            for c in range(self.C):
                self.o[r][c].add_incoming(self.ot[r][c], b.block)
        k.br("k.head")

    def _scores(self) -> None:
        """Raw scores: a loop over d (D_UNROLL per trip), RB x NV (x PARTS) accumulators."""
        k, b = self.k, self.b
        k.enter("qk.loop")
        d = k.phi(I64, [(i64(0), "k.body")], "d")
        ids = [(r, u, q) for r in range(self.RB) for u in range(self.NV) for q in range(self.PARTS)]
        acc = {i: k.phi(VF, [(VZERO, "k.body")], "pa{}_{}_{}".format(*i)) for i in ids}
        cur = dict(acc)
        ktoff = b.add(self.ktbase, b.mul(d, i64(self.KS)))
        for dd in range(D_UNROLL):
            ddv = b.add(d, i64(dd))
            kt = [k.vload(self.a["kt"], b.add(ktoff, i64(dd * self.KS + u * W)), 4, f"kt{dd}_{u}")
                  for u in range(self.NV)]
            for r in range(self.RB):
                qs = k.fetch(self.a["q"], b.add(self.qsrc[r], ddv), name=f"qs{r}_{dd}")
                qb = k.splat(qs)
                for u in range(self.NV):
                    key = (r, u, dd % self.PARTS)
                    cur[key] = k.fma(qb, kt[u], cur[key])
        for i in ids:
            acc[i].add_incoming(cur[i], b.block)
        d_next = b.add(d, i64(D_UNROLL))
        d.add_incoming(d_next, b.block)
        k.cbr(b.icmp_signed("<", d_next, i64(self.D)), "qk.loop", "qk.exit")
        k.enter("qk.exit")
        self.sp = [[cur[(r, u, 0)] if self.PARTS == 1 else b.fadd(cur[(r, u, 0)], cur[(r, u, 1)])
                    for u in range(self.NV)] for r in range(self.RB)]

    def _mask(self) -> None:
        """Scores of keys outside a row's range -inf, unless the step is inside every row's
        range."""
        k, b = self.k, self.b
        in_a = b.icmp_signed(">=", self.j, self.mlo)
        in_b = b.icmp_signed("<=", self.j, self.inhi)
        k.cbr(b.and_(in_a, in_b, name="inner"), "qk.done", "qk.mask")
        k.enter("qk.mask")
        sx = [[b.select(k.in_range(self.lanes[u], self.lov[r], self.hiv[r]), self.sp[r][u],
                        vconst(NEG_INF)) for u in range(self.NV)] for r in range(self.RB)]
        k.br("qk.done")
        k.enter("qk.done")
        self.S = [[k.phi(VF, [(self.sp[r][u], "qk.exit"), (sx[r][u], "qk.mask")],
                         f"S{r}_{u}") for u in range(self.NV)] for r in range(self.RB)]

    def _lazy_max(self) -> None:
        """The rows' reference m (the max of the scores before a lazy step) moves only when
        a score exceeds it by more than LAZY: otherwise p = exp(s - m) <= e^LAZY, and the
        step skips the row max reductions, the rescale exp and the accumulator rescale.
        The true row max (for `top`) is a lane-wise running max in memory, reduced once
        per row at the end."""
        k, b = self.k, self.b
        anyv, lane_max = None, []
        for r in range(self.RB):
            top = self.S[r][0]
            for u in range(1, self.NV):
                top = k.vmax(top, self.S[r][u])
            lane_max.append(top)
            mvn = k.vmax(k.load(self.mvp[r], VF, 64), top)
            b.store(mvn, self.mvp[r], align=64)
            # raw scores above (m + LAZY) / scale (m = -inf: any finite score)
            thr = b.fmul(b.fadd(self.m[r], fconst(LAZY)), self.invscale)
            gt = b.fcmp_ordered(">", top, k.splat(thr))
            anyv = gt if anyv is None else b.or_(anyv, gt)
        moved = b.icmp_unsigned("!=", b.bitcast(anyv, I16), ir.Constant(I16, 0), name="moved")
        k.cbr(moved, "sm.move", "sm.join")
        self._rescale(lane_max)

    def _rescale(self, lane_max) -> None:
        """sm.move: the rows' new reference max and the rescaled mass and accumulators;
        sm.join: the rows' state after the step's (possible) move."""
        k, b = self.k, self.b
        k.enter("sm.move")
        adv, mm = VZERO, []
        for r in range(self.RB):
            # scale > 0 (the runtime checks): max(scale * s) = scale * max(s), rounding
            # included
            mx = b.fmul(k.hmax(lane_max[r]), self.scale)
            mm.append(k.call("llvm.maxnum.f32", F32, [self.m[r], mx], label=f"mm{r}"))
            msm = b.select(b.fcmp_ordered("==", mm[r], fconst(NEG_INF)), fconst(0.0), mm[r])
            adv = b.insert_element(adv, b.fsub(self.m[r], msm), i32(r))
        # the rows' rescale factors exp(m_old - m_new) in one vector exp (unused lanes: exp(0))
        alpha = k.vexp(adv, "alpha")
        lsm, oam = [], []
        for r in range(self.RB):
            al = b.extract_element(alpha, i32(r))
            alv = k.splat(al)
            lsm.append(b.fmul(self.l[r], al))
            oam.append([b.fmul(self.o[r][c], alv) for c in range(self.C)])
        k.br("sm.join")
        k.enter("sm.join")

        def join(ty, kept, moved, name=""):
            return k.phi(ty, [(kept, "qk.done"), (moved, "sm.move")], name)

        self.mn, self.lsc, self.oa = [], [], []
        for r in range(self.RB):
            self.mn.append(join(F32, self.m[r], mm[r], f"mn{r}"))
            self.lsc.append(join(F32, self.l[r], lsm[r]))
            self.oa.append([join(VF, self.o[r][c], oam[r][c]) for c in range(self.C)])

    def _probabilities(self) -> None:
        """p = exp(s * scale - m) into pbuf, and the rows' new mass."""
        k, b = self.k, self.b
        self.ln = []
        for r in range(self.RB):
            ms = b.select(b.fcmp_ordered("==", self.mn[r], fconst(NEG_INF)), fconst(0.0),
                          self.mn[r])
            msv = k.splat(b.fneg(ms))
            probs = []
            for u in range(self.NV):
                probs.append(k.vexp(k.fma(self.S[r][u], self.scalev, msv), f"P{r}_{u}"))
                k.vstore(probs[u], self.pbuf, r * self.KS + u * W, 64)
            tot = probs[0]
            for u in range(1, self.NV):
                tot = b.fadd(tot, probs[u])
            ps = k.call("llvm.vector.reduce.fadd.v16f32", F32, [fconst(0.0), tot], ("reassoc",))
            self.ln.append(b.fadd(self.lsc[r], ps, name=f"ln{r}"))

    def _pv(self) -> None:
        """P @ V over the step's keys below kmax (later keys have p = 0 in every row, and
        may lie past the last key): PV_UNROLL keys per trip, then one at a time."""
        k, b, p = self.k, self.b, self.p
        tc = k.smin(b.sub(self.kmax, self.j), self.KS, "tc")
        tc4 = b.sub(tc, i64(self.PV_UNROLL - 1))
        # V rows through a pointer stepped by the row stride (a multiply per key would take
        # an FMA port's slot)
        vrow0 = k.at(self.a["v"], b.add(b.mul(self.j, p["vrs"]), self.vh))
        vstep = b.mul(p["vrs"], i64(self.PV_UNROLL))
        k.br("pv.head")
        k.enter("pv.head")
        t = k.phi(I64, [(i64(0), "sm.join")], "t")
        vq = k.phi(PTR, [(vrow0, "sm.join")], "vq")
        ov = [[k.phi(VF, [(self.oa[r][c], "sm.join")]) for c in range(self.C)]
              for r in range(self.RB)]
        k.cbr(b.icmp_signed("<", t, tc4), "pv.loop", "pv.tail")
        k.enter("pv.loop")
        on = self._pv_keys(t, vq, self.PV_UNROLL, ov)
        self._close(ov, on, [(t, b.add(t, i64(self.PV_UNROLL))), (vq, k.at(vq, vstep))])
        k.br("pv.head")
        k.enter("pv.tail")
        tq = k.phi(I64, [(t, "pv.head")], "tq")
        vt = k.phi(PTR, [(vq, "pv.head")], "vt")
        self.ot = [[k.phi(VF, [(ov[r][c], "pv.head")]) for c in range(self.C)]
                   for r in range(self.RB)]
        k.cbr(b.icmp_signed("<", tq, tc), "pv.one", "pv.done")
        k.enter("pv.one")
        oq = self._pv_keys(tq, vt, 1, self.ot)
        self._close(self.ot, oq, [(tq, b.add(tq, i64(1))), (vt, k.at(vt, p["vrs"]))])
        k.br("pv.tail")

    def _close(self, phis, values, pairs) -> None:
        """Close a loop's phis (the accumulators and (phi, next) pairs) from this block."""
        block = self.b.block
        for r in range(self.RB):
            for c in range(self.C):
                phis[r][c].add_incoming(values[r][c], block)
        for phi, nxt in pairs:
            phi.add_incoming(nxt, block)

    def _pv_keys(self, t, vptr, count: int, acc) -> list:
        """acc[r][c] += p[r, t + tt] * V[t + tt, c] for tt < count; vptr: V's row t."""
        k, b = self.k, self.b
        cur = [list(row) for row in acc]
        for tt in range(count):
            ttv = b.add(t, i64(tt))
            vr = k.at(vptr, b.mul(self.p["vrs"], i64(tt)))
            vals = [k.vload(vr, c * W, 4) for c in range(self.C)]
            for r in range(self.RB):
                pb = k.splat(k.fetch(self.pbuf, b.add(ttv, i64(r * self.KS))))
                for c in range(self.C):
                    cur[r][c] = k.fma(pb, vals[c], cur[r][c])
        return cur

    def group_end(self) -> None:
        """The group's state back to the stack; next group."""
        k, b = self.k, self.b
        k.enter("k.exit")
        for r in range(self.RB):
            b.store(self.m[r], self.tp[r])
            b.store(self.l[r], self.mp[r])
            for c in range(self.C):
                b.store(self.o[r][c], self.yp[r][c], align=64)
        k.br("grp.end")
        k.enter("grp.end")
        self.gi.add_incoming(b.add(self.gi, i64(1)), b.block)
        k.br("grp.head")

    def finish_rows(self) -> None:
        """The block's rows: out = acc / mass (0 for an empty row), top (0 when empty),
        mass."""
        k, b, p = self.k, self.b, self.p
        k.enter("fin.head")
        fr = k.phi(I64, [(i64(0), "kb.head")], "fr")
        frow = b.add(self.qb_rows, fr, name="frow")
        more = b.and_(b.icmp_unsigned("<", fr, i64(self.ROWS)), b.icmp_signed("<", frow, p["nq"]))
        k.cbr(more, "fin.body", "fin.exit")
        k.enter("fin.body")
        fm = k.fetch(self.mb, fr)
        fl = k.fetch(self.lb, fr)
        fpos = b.fcmp_ordered(">", fl, fconst(0.0))
        denom = b.select(fpos, fl, fconst(1.0))
        # the true row max, and the mass rescaled to it from the reference
        fmx = b.fmul(k.hmax(k.vload(self.mv, b.mul(fr, i64(W)), 64)), self.scale)
        fdl = b.select(fpos, b.fsub(fm, fmx), fconst(0.0))
        fcor = b.extract_element(k.vexp(k.splat(fdl)), i32(0))
        fmass = b.fmul(fl, fcor)
        ftop = b.select(fpos, fmx, fconst(0.0))
        fdv = k.splat(denom)
        ftm = b.add(b.mul(self.h, p["nq"]), frow)
        b.store(ftop, k.at(self.a["top"], ftm))
        b.store(fmass, k.at(self.a["mass"], ftm))
        fo = b.add(b.mul(self.h, p["ohs"]), b.mul(frow, p["ors"]))
        fso = b.mul(fr, i64(self.D))
        for c in range(self.C):
            res = b.fdiv(k.vload(self.st, b.add(fso, i64(c * W)), 64), fdv)
            k.vstore(res, self.a["out"], b.add(fo, i64(c * W)), 4)
        fr.add_incoming(b.add(fr, i64(1)), b.block)
        k.br("fin.head")
        k.enter("fin.exit")
        self.job.add_incoming(b.add(self.job, i64(1)), b.block)
        k.br("job.head")
