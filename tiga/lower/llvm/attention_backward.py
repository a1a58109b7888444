"""lower: LLVM micro-kernel of the float32 attention backward (FlashAttention-2 style).

`backward_ir(symbol, D, tiles)` is a kernel `void(i64 begin, i64 end, ptr argv)` over jobs: a head
and a range of its key blocks. A job owns the dk and dv rows of its keys and adds into its
own dq (the head's when the head is one job; a partial sum per job when the runtime splits
heads, with fewer heads than threads), so no two threads add into the same row. The outer
loop walks key blocks of KB keys; each key block is packed once on the stack (K^T and V^T as
D x KB through 16 x 16 register transposes, K as KB x D, zero past the last key) and the
inner loop walks the query rows that see the block (`rbeg`, `rend` per key block, from the
runtime) in tiles of BR rows, whose q and dO rows are copied to the stack first. Per group
of RB rows of a tile:

  S  = Q K^T          (RB x KB, registers; a loop over d)
  P  = exp(S * scale - lse), 0 outside the row's range      -> pbuf
  dP = dO V^T         (RB x KB, registers)
  dS = P * (dP - delta) * scale                             -> dsbuf
  dq[rows] += dS K    (RB x D in registers, a loop over the KB keys)

and once per tile, for groups of KR keys with D in registers (loops over the tile's rows):

  dv[keys] += P^T dO,  dk[keys] += dS^T Q    (stack accumulators, written once per block).

Every product is the same register tile: rows x (up to 4) <16 x float> accumulators, one
scalar broadcast per row and up to 4 vector loads per step. The scale is folded into dS, so
dq and dk need no final multiply. Memory: the packed key block, the tile's rows, two BR x KB
tiles and the dk, dv accumulators (stack), and the outputs; never an N x N array.

argv: q, k, v, do (H, N, D), lse, delta (H, N), dq (H, N, D) (zeroed by the caller), dk, dv
(H, Nk, D), all read and written in place through (head, row) strides with unit element
stride; lo, hi (N,); prm (`PARAMS`: sizes, strides in elements, the scale's bits, which
outputs are wanted); rbeg, rend (per key block); jobs (4 per job: head, first and end key
block, offset of its dq in elements). A tile's padding rows (i >= n) get hi = 0, so every
key is masked for them; reads past the last row or key are clamped to it (their
probabilities are 0); padding rows add into a stack row and only keys < nk are written, so
nothing is accessed past an output's end. The IR is built with llvmlite's IR builder
(attention_common.py).
"""
from __future__ import annotations

from llvmlite import ir

from .attention_common import I32, VB, VF, VZERO, AttentionIR, W
from .values import F32, I1, I64, i64

PARAMS = ("n", "nk", "kblocks", "qhs", "qrs", "khs", "krs", "vhs", "vrs", "dhs", "drs",
          "scbits", "lhs", "lrs", "ehs", "ers", "gqhs", "gqrs", "gkhs", "gkrs", "gvhs", "gvrs",
          "want")
ARGV = ("q", "k", "v", "do", "lse", "delta", "dq", "dk", "dv", "lo", "hi", "prm", "rbeg",
        "rend", "jobs")
# The tile sizes are the launch's schedule (lower/schedule.attention_tiles("backward") owns
# them; Schedule.tiles names them): group_rows (RB, query rows per register group),
# tile_rows (BR, query rows per tile, a multiple of RB), key_block (KB, keys per key block,
# a multiple of 16) and group_keys (KR, keys per register group of the dk / dv products).
TILES = ("group_rows", "tile_rows", "key_block", "group_keys")
CHUNK = 4     # <16 x float> output vectors per register tile of dq, dk, dv

__all__ = ["backward_ir", "W", "TILES", "PARAMS"]


def backward_ir(symbol: str, D: int, tiles: dict) -> str:
    """LLVM IR of the float32 attention backward for head width D (a multiple of 16) with
    the schedule's `tiles` (TILES by name)."""
    assert D % W == 0
    k = AttentionIR(symbol)
    g = _Backward(k, D, tiles)
    g.entry()
    g.job_start()
    g.key_block_start()
    g.pack_block()
    g.tile_loop()
    g.write_back()
    g.tile_start()
    g.group_setup()
    g.scores()
    g.score_grads()
    g.dq_update()
    g.kv_update()
    k.enter("exit")
    k.b.ret_void()
    return k.text()


def _fma_loop(k: AttentionIR, tag: str, acc_in: dict, trip, unroll: int, x_ptr, y_ptr):
    """acc[(a, c)] += x(a, t) * y(t, c) for t in [0, trip) (trip: an i64 value or int, a
    positive multiple of `unroll`), entered from the current block. x_ptr(t) -> {a: float
    pointer} and y_ptr(t) -> {c: <16 x float> pointer} emit their address arithmetic.
    Returns the accumulators after the loop (valid in `{tag}.exit`, where emission
    continues)."""
    b = k.b
    pre = b.block
    keys = list(acc_in)
    k.br(f"{tag}.loop")
    k.enter(f"{tag}.loop")
    t = k.phi(I64, [(i64(0), pre)], f"{tag}.t")
    phis = {key: k.phi(VF, [(acc_in[key], pre)]) for key in keys}
    cur = dict(phis)
    rows = sorted({a for a, _ in keys})
    cols = sorted({c for _, c in keys})
    for u in range(unroll):
        tu = b.add(t, i64(u))
        yp = y_ptr(tu)
        ys = {c: k.load(yp[c], VF, 4) for c in cols}
        xp = x_ptr(tu)
        for a in rows:
            xs = k.splat(k.load(xp[a]))
            for c in cols:
                cur[(a, c)] = k.fma(xs, ys[c], cur[(a, c)])
    for key in keys:
        phis[key].add_incoming(cur[key], b.block)
    tn = b.add(t, i64(unroll))
    t.add_incoming(tn, b.block)
    trip = i64(trip) if isinstance(trip, int) else trip
    k.cbr(b.icmp_signed("<", tn, trip), f"{tag}.loop", f"{tag}.exit")
    k.enter(f"{tag}.exit")
    return cur


class _Backward:
    """Emits the backward kernel's parts in order; values one part defines and a later one
    uses (pointers, parameters, loop variables, a row group's rows) are attributes."""

    def __init__(self, k: AttentionIR, D: int, tiles: dict):
        self.k, self.b, self.D, self.C = k, k.b, D, D // W
        self.chunks = [list(range(c, min(c + CHUNK, self.C))) for c in range(0, self.C, CHUNK)]
        self.RB, self.BR, self.KB, self.KR = (int(tiles[nm]) for nm in TILES)
        assert self.BR % self.RB == 0 and self.KB % W == 0 and self.KB % self.KR == 0
        self.NK = self.KB // W     # <16 x float> vectors per row of a score tile

    def _stack_arrays(self) -> tuple:
        """(name, floats) of the stack arrays: the key block (packed K^T, V^T, K), the tile's
        P and dS, its q and dO rows, and the key block's dk and dv sums."""
        D, KB, BR = self.D, self.KB, self.BR
        return (("ktb", D * KB), ("vtb", D * KB), ("kbb", KB * D), ("pbuf", BR * KB),
                ("dsbuf", BR * KB), ("qtile", BR * D), ("dotile", BR * D),
                ("dkacc", KB * D), ("dvacc", KB * D))

    def entry(self) -> None:
        k, b, D = self.k, self.b, self.D
        self.s = {nm: k.stack(size, nm) for nm, size in self._stack_arrays()}
        # padding rows and keys (past n, nk) add their zeros into this row, not the outputs
        self.dummy = k.stack(D, "dummy")
        for c in range(self.C):
            k.vstore(VZERO, self.dummy, c * W, 4)
        self.a = k.unpack(ARGV)
        self.p = p = k.params(self.a["prm"], PARAMS)
        self.n1 = b.sub(p["n"], i64(1), name="n1")
        self.nk1 = b.sub(p["nk"], i64(1), name="nk1")
        scale = b.bitcast(b.trunc(p["scbits"], I32), F32, name="scale")
        # want: 1 = dq, 2 = dk and dv (a VJP that needs only some of them skips the others)
        self.wantdq = b.icmp_signed("!=", b.and_(p["want"], i64(1)), i64(0), name="wantdq")
        self.wantkv = b.icmp_signed("!=", b.and_(p["want"], i64(2)), i64(0), name="wantkv")
        self.scalev = k.splat(scale, "scalev")
        k.br("job.head")

    def job_start(self) -> None:
        """A job: (head, first key block, end key block, element offset of its dq)."""
        k, b, p = self.k, self.b, self.p
        k.enter("job.head")
        self.job = k.phi(I64, [(k.begin, "entry")], "job")
        k.cbr(b.icmp_signed("<", self.job, k.end), "job.body", "exit")
        k.enter("job.body")
        h, self.kbfirst, self.kblast, dqoff = (
            k.fetch(self.a["jobs"], b.add(b.mul(self.job, i64(4)), i64(i)), I64, nm)
            for i, nm in enumerate(("h", "kbfirst", "kblast", "dqoff")))
        self.base = {x: b.mul(h, p[f"{x}hs"], name=f"{x}base")
                     for x in ("q", "k", "v", "d", "l", "e", "gk", "gv")}
        self.base["gq"] = b.add(b.mul(h, p["gqhs"]), dqoff, name="gqbase")
        k.br("kb.head")

    def key_block_start(self) -> None:
        """for kb in the job's key blocks (rows r0 <= i < r1 see keys j0 <= j < j0 + KB)."""
        k, b, a = self.k, self.b, self.a
        k.enter("kb.head")
        self.kb = k.phi(I64, [(self.kbfirst, "job.body")], "kb")
        k.cbr(b.icmp_signed("<", self.kb, self.kblast), "kb.body", "kb.exit")
        k.enter("kb.exit")
        self.job.add_incoming(b.add(self.job, i64(1)), b.block)
        k.br("job.head")
        k.enter("kb.body")
        self.j0 = b.mul(self.kb, i64(self.KB), name="j0")
        self.r0 = k.fetch(a["rbeg"], self.kb, I64, "r0")
        self.r1 = k.fetch(a["rend"], self.kb, I64, "r1")
        self.lanes = k.key_lanes(k.splat_index(self.j0, "j0v"), self.NK)
        self.jend = b.add(self.j0, i64(self.KB), name="jend")
        k.br("pack.head")

    def pack_block(self) -> None:
        """The key block packed on the stack: K^T, V^T (D x KB) and K (KB x D), keys past nk
        zero; 16 keys at a time, each 16 x 16 block transposed in registers. Also zeroes
        the block's dk and dv sums."""
        k, b, p, D = self.k, self.b, self.p, self.D
        k.enter("pack.head")
        jg = k.phi(I64, [(i64(0), "kb.body")], "jg")
        jg0 = b.mul(jg, i64(W), name="jg0")
        kvalid, kbrow, rows = [], [], {"k": [], "v": []}
        for t in range(W):
            jj = b.add(jg0, i64(t))
            key = b.add(self.j0, jj)
            kvalid.append(b.icmp_signed("<", key, p["nk"]))
            keyc = k.smin(key, self.nk1)
            kbrow.append(b.mul(jj, i64(D)))
            for src in ("k", "v"):
                rows[src].append(b.add(b.mul(keyc, p[f"{src}rs"]), self.base[src]))
            for c in range(self.C):
                zo = b.add(kbrow[t], i64(c * W))
                for acc in ("dkacc", "dvacc"):
                    k.vstore(VZERO, self.s[acc], zo, 64)
        for c in range(self.C):
            for src, tgt in (("k", "ktb"), ("v", "vtb")):
                vals = []
                for t in range(W):
                    x = k.vload(self.a[src], b.add(rows[src][t], i64(c * W)), 4)
                    vals.append(b.select(kvalid[t], x, VZERO))
                    if src == "k":
                        k.vstore(vals[t], self.s["kbb"], b.add(kbrow[t], i64(c * W)), 64)
                for i, col in enumerate(k.transpose16(vals)):
                    k.vstore(col, self.s[tgt], b.add(jg0, i64((c * W + i) * self.KB)), 64)
        nxt = b.add(jg, i64(1))
        jg.add_incoming(nxt, b.block)
        k.cbr(b.icmp_signed("<", nxt, i64(self.KB // W)), "pack.head", "tile.head")

    def tile_loop(self) -> None:
        """for i0 in r0, r0 + BR, ... < r1: the tiles of rows that see the key block."""
        k, b = self.k, self.b
        k.enter("tile.head")
        self.i0 = k.phi(I64, [(self.r0, "pack.head")], "i0")
        k.cbr(b.icmp_signed("<", self.i0, self.r1), "tile.body", "tile.exit")

    def write_back(self) -> None:
        """The key block's dk, dv rows (accumulated on the stack) to the outputs, keys < nk."""
        k, b, p, D = self.k, self.b, self.p, self.D
        k.enter("tile.exit")
        wn = k.smin(b.sub(p["nk"], self.j0), self.KB, "wn")
        k.br("wb.body")
        k.enter("wb.body")
        wj = k.phi(I64, [(i64(0), "tile.exit")], "wj")
        wkey = b.add(self.j0, wj)
        wsrc = b.mul(wj, i64(D))
        for which in ("k", "v"):
            row = b.add(b.mul(wkey, p[f"g{which}rs"]), self.base[f"g{which}"])
            for c in range(self.C):
                x = k.vload(self.s[f"d{which}acc"], b.add(wsrc, i64(c * W)), 64)
                k.vstore(x, self.a[f"d{which}"], b.add(row, i64(c * W)), 4)
        nxt = b.add(wj, i64(1))
        wj.add_incoming(nxt, b.block)
        k.cbr(b.icmp_signed("<", nxt, wn), "wb.body", "wb.head")
        k.enter("wb.head")
        self.kb.add_incoming(b.add(self.kb, i64(1)), b.block)
        k.br("kb.head")

    def tile_start(self) -> None:
        """The tile's row groups, and its q and dO rows copied to the stack: rows of a
        (N, H, D) field lie H * D apart (4 KiB at H = 16, D = 64), and walking them
        conflicts in the L1 cache's sets."""
        k, b, p, D = self.k, self.b, self.p, self.D
        k.enter("tile.body")
        left = k.smin(b.sub(self.r1, self.i0), self.BR)
        # rows of the tile that groups cover: a whole number of groups
        self.ngroups = b.udiv(b.add(left, i64(self.RB - 1)), i64(self.RB), name="ngroups")
        self.trows = b.mul(self.ngroups, i64(self.RB), name="trows")
        k.br("cp.head")
        k.enter("cp.head")
        ct = k.phi(I64, [(i64(0), "tile.body")], "ct")
        rowc = k.smin(b.add(self.i0, ct), self.n1)
        dst = b.mul(ct, i64(D))
        for src, arr, buf in (("q", "q", "qtile"), ("d", "do", "dotile")):
            row = b.add(b.mul(rowc, p[f"{src}rs"]), self.base[src])
            for c in range(self.C):
                x = k.vload(self.a[arr], b.add(row, i64(c * W)), 4)
                k.vstore(x, self.s[buf], b.add(dst, i64(c * W)), 64)
        nxt = b.add(ct, i64(1))
        ct.add_incoming(nxt, b.block)
        k.cbr(b.icmp_signed("<", nxt, self.trows), "cp.head", "grp.head")
        k.enter("grp.head")
        self.g = k.phi(I64, [(i64(0), "cp.head")], "g")
        k.cbr(b.icmp_signed("<", self.g, self.ngroups), "grp.body", "grp.exit")

    def group_setup(self) -> None:
        """A group of RB rows of the tile: ranges, lse and delta; whether the key block is
        inside every row's range."""
        k, b, a, p, D = self.k, self.b, self.a, self.p, self.D
        k.enter("grp.body")
        gr = b.mul(self.g, i64(self.RB))
        grow = b.add(self.i0, gr)
        self.tr, self.rowc, self.valid, self.lov, self.hiv = [], [], [], [], []
        self.qr, self.dr, self.nlsev, self.dlv, lo, hi = [], [], [], [], [], []
        for r in range(self.RB):
            row = b.add(grow, i64(r))
            self.tr.append(b.add(gr, i64(r), name=f"tr{r}"))
            self.rowc.append(k.smin(row, self.n1, f"rowc{r}"))
            self.valid.append(b.icmp_signed("<", row, p["n"], name=f"valid{r}"))
            lo.append(k.fetch(a["lo"], self.rowc[r], I64, f"lo{r}"))
            hi.append(b.select(self.valid[r], k.fetch(a["hi"], self.rowc[r], I64), i64(0),
                               name=f"hi{r}"))
            lo_t, hi_t = b.trunc(lo[r], I32), b.trunc(hi[r], I32)
            self.lov.append(k.splat(lo_t, f"lov{r}"))
            self.hiv.append(k.splat(hi_t, f"hiv{r}"))
            # the row in qtile and dotile
            self.qr.append(b.mul(self.tr[r], i64(D)))
            self.dr.append(b.mul(self.tr[r], i64(D)))
            st = b.add(b.mul(self.rowc[r], p["lrs"]), self.base["l"])
            se = b.add(b.mul(self.rowc[r], p["ers"]), self.base["e"])
            self.nlsev.append(k.splat(b.fneg(k.fetch(a["lse"], st, name=f"lse{r}"))))
            self.dlv.append(k.splat(k.fetch(a["delta"], se, name=f"dl{r}")))
        mlo, mhi = lo[0], hi[0]
        for r in range(1, self.RB):
            mlo, mhi = k.smax(mlo, lo[r]), k.smin(mhi, hi[r])
        in_a = b.icmp_signed(">=", self.j0, mlo)
        in_b = b.icmp_signed("<=", self.jend, mhi)
        self.inner = b.and_(in_a, in_b, name="inner")

    def _row_scalars(self, offsets: list, array):
        """t -> {r: the float at offsets[r] + t of `array`}, for _fma_loop."""
        def f(t):
            return {r: self.k.at(array, self.b.add(offsets[r], t)) for r in range(self.RB)}
        return f

    def _key_rows(self, buf):
        """t -> {u: vector u of row t of a D x KB packed block}, for _fma_loop."""
        def f(t):
            row = self.b.mul(t, i64(self.KB))
            return {u: self.k.at(buf, self.b.add(row, i64(u * W))) for u in range(self.NK)}
        return f

    def scores(self) -> None:
        """S = Q K^T (RB x KB in registers) -> P = exp(S * scale - lse), 0 outside the
        rows' ranges, into pbuf."""
        k, b = self.k, self.b
        zero = {(r, u): VZERO for r in range(self.RB) for u in range(self.NK)}
        s = _fma_loop(k, "qk", zero, self.D, 4, self._row_scalars(self.qr, self.s["qtile"]),
                      self._key_rows(self.s["ktb"]))
        every = ir.Constant(VB, [ir.Constant(I1, 1)] * W)
        self.pptr, self.pbo = {}, {}
        for r in range(self.RB):
            for u in range(self.NK):
                pe = k.vexp(k.fma(s[(r, u)], self.scalev, self.nlsev[r]))
                ok_m = k.in_range(self.lanes[u], self.lov[r], self.hiv[r])
                ok = b.select(self.inner, every, ok_m)
                prob = b.select(ok, pe, VZERO, name=f"P{r}_{u}")
                self.pbo[(r, u)] = b.add(b.mul(self.tr[r], i64(self.KB)), i64(u * W))
                self.pptr[(r, u)] = k.at(self.s["pbuf"], self.pbo[(r, u)])
                b.store(prob, self.pptr[(r, u)], align=4)

    def score_grads(self) -> None:
        """dP = dO V^T (RB x KB in registers) -> dS = P (dP - delta) scale, into dsbuf."""
        k, b = self.k, self.b
        zero = {(r, u): VZERO for r in range(self.RB) for u in range(self.NK)}
        dp = _fma_loop(k, "dv", zero, self.D, 4, self._row_scalars(self.dr, self.s["dotile"]),
                       self._key_rows(self.s["vtb"]))
        for r in range(self.RB):
            for u in range(self.NK):
                dd = b.fsub(dp[(r, u)], self.dlv[r])
                # P reloaded from pbuf: kept in registers across the dP loop, the 24 P and 24
                # dP vectors exceed the 32 registers and the loop spills
                prob = k.load(self.pptr[(r, u)], VF, 4)
                ds = b.fmul(b.fmul(prob, dd), self.scalev, name=f"dS{r}_{u}")
                k.vstore(ds, self.s["dsbuf"], self.pbo[(r, u)], 4)
        k.cbr(self.wantdq, "dq.go", "grp.next")

    def dq_update(self) -> None:
        """dq[rows] += dS K, D in chunks of up to CHUNK vectors."""
        k, b, p, D = self.k, self.b, self.p, self.D
        k.enter("dq.go")
        for ci, cols in enumerate(self.chunks):
            acc, ptrs = {}, {}
            for r in range(self.RB):
                row = k.at(self.a["dq"], b.add(b.mul(self.rowc[r], p["gqrs"]), self.base["gq"]))
                row = b.select(self.valid[r], row, self.dummy)
                for c in cols:
                    ptrs[(r, c)] = k.at(row, c * W)
                    acc[(r, c)] = k.load(ptrs[(r, c)], VF, 4)

            def ds_scalars(t):
                return {r: k.at(self.s["dsbuf"], b.add(b.mul(self.tr[r], i64(self.KB)), t))
                        for r in range(self.RB)}

            def k_rows(t, cols=cols):
                row = b.mul(t, i64(D))
                return {c: k.at(self.s["kbb"], b.add(row, i64(c * W))) for c in cols}

            res = _fma_loop(k, f"dq{ci}", acc, self.KB, 4, ds_scalars, k_rows)
            for key, val in res.items():
                b.store(val, ptrs[key], align=4)
        k.br("grp.next")
        k.enter("grp.next")
        self.g.add_incoming(b.add(self.g, i64(1)), b.block)
        k.br("grp.head")

    def kv_update(self) -> None:
        """dv += P^T dO, dk += dS^T Q over the tile's rows, KR keys x D per register tile."""
        k, b = self.k, self.b
        k.enter("grp.exit")
        k.cbr(self.wantkv, "kg.head", "dk.done")
        k.enter("kg.head")
        kg = k.phi(I64, [(i64(0), "grp.exit")], "kg")
        k.cbr(b.icmp_signed("<", kg, i64(self.KB // self.KR)), "kg.body", "dk.done")
        k.enter("kg.body")
        kj = b.mul(kg, i64(self.KR), name="kj")
        for ci, cols in enumerate(self.chunks):
            for which, buf, arr in (("v", "pbuf", "dotile"), ("k", "dsbuf", "qtile")):
                self._kv_tile(f"kg{which}{ci}", kj, cols, self.s[f"d{which}acc"],
                              self.s[buf], self.s[arr])
            k.br(f"kgd.exit{ci}")
            k.enter(f"kgd.exit{ci}")
        kg.add_incoming(b.add(kg, i64(1)), b.block)
        k.br("kg.head")
        k.enter("dk.done")
        self.i0.add_incoming(b.add(self.i0, i64(self.BR)), b.block)
        k.br("tile.head")

    def _kv_tile(self, tag, kj, cols, out, probs, src) -> None:
        """out[kj + a, cols] += sum over the tile's rows t of probs[t, kj + a] src[t, cols]."""
        k, b, D = self.k, self.b, self.D
        acc, ptrs = {}, {}
        for a in range(self.KR):
            row = k.at(out, b.mul(b.add(kj, i64(a)), i64(D)))
            for c in cols:
                ptrs[(a, c)] = k.at(row, c * W)
                acc[(a, c)] = k.load(ptrs[(a, c)], VF, 4)

        def p_scalars(t):
            pk = b.add(b.mul(t, i64(self.KB)), kj)
            return {a: k.at(probs, b.add(pk, i64(a))) for a in range(self.KR)}

        def src_rows(t):
            rb = b.mul(t, i64(D))
            return {c: k.at(src, b.add(rb, i64(c * W))) for c in cols}

        res = _fma_loop(k, tag, acc, self.trows, 2, p_scalars, src_rows)
        for key, val in res.items():
            b.store(val, ptrs[key], align=4)
