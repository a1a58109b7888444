"""lower/llvm: the vector candidate test and the rank selection of the cell walks (generated.py).

- `test_range`: the sources of one run of cells are tested W at a time: one masked load of
  W points' coordinates (the directory stores them point-major), split into one vector per
  axis by shuffles, `d2 = sum_k (p_k - q_k)^2` in axis order with separate multiplies and adds
  (no contraction: the same rounding per lane as the scalar test and numpy's reference), one
  compare. The accepted sorted positions are appended to the row's buffer by a compress
  store where the host has one (AVX-512), else by W branch-free stores (`n += bit`).
- `rank_select`: a kNN row whose prefilter accepted m <= RANK_MAX sources takes its k nearest
  by rank instead of m insertions into a sorted state (each a branchy shift loop): the rank
  of candidate i is the number of candidates j before it in (distance, then smaller source
  index) order, counted W at a time without branches; keys are distinct (indices are), so
  the ranks are a permutation and rank < k places the k nearest in order, as the insertions
  would have. NaN distances never reach it (the prefilter's `d2 <= cutoff` rejects them).
"""
from __future__ import annotations

from llvmlite import ir

from .values import F64, I8, I64, i64

I1 = ir.IntType(1)
I32 = ir.IntType(32)
RANK_MAX = 64        # prefiltered kNN candidates selected by rank (more: insertions)


def lanes(pty: ir.Type, wide: bool) -> int:
    """Lanes of the candidate test: one 512-bit (wide) or 256-bit vector."""
    return (64 if wide else 32) // (8 if pty == F64 else 4)


def _declare(module: ir.Module, name: str, ret: ir.Type, args: list) -> ir.Function:
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)


def _vty(elem: ir.Type, n: int) -> str:
    bits = {F64: "f64", I64: "i64", I32: "i32"}.get(elem, "f32")
    return f"v{n}{bits}"


def _iota(elem: ir.Type, n: int, scale: int = 1, start: int = 0) -> ir.Constant:
    return ir.Constant(ir.VectorType(elem, n), [start + j * scale for j in range(n)])


def splat(b, x, n: int):
    vt = ir.VectorType(x.type, n)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, n), [0] * n))


class VectorTest:
    """The W-lane candidate test of one builder (g: a generated._GeoBuilder)."""

    def __init__(self, g, wide: bool):
        self.g, self.wide = g, wide
        self.W = lanes(g.pty, wide)
        d, W, pty, m = g.spec.dims, self.W, g.pty, g.ctx.module
        self.LT = ir.VectorType(pty, W * d)
        self.load = _declare(m, f"llvm.masked.load.{_vty(pty, W * d)}.p0", self.LT,
                             [g.ptr["sorted_pos"].type, I32, ir.VectorType(I1, W * d), self.LT])
        v8 = ir.VectorType(I64, 8)
        self.compress = _declare(m, "llvm.x86.avx512.mask.compress.v8i64", v8,
                                 [v8, v8, ir.VectorType(I1, 8)]) if wide else None
        self.popcount = g.ctx.intrinsic("llvm.ctpop", I8)

    def row(self, q, cut) -> None:
        """Per row: the query's coordinates splatted, and the squared cutoff."""
        b, W = self.g.b, self.W
        self.qv = [splat(b, x, W) for x in q]
        self.cut = splat(b, cut, W)

    def test_range(self, t0, t1, buf, cap: int, nbuf, flush) -> None:
        """Append to buf (nbuf entries) every sorted position in [t0, t1) that passes
        `d2 <= cutoff` (and is not the row itself where self is excluded)."""
        g, b, W = self.g, self.g.b, self.W
        shift = W.bit_length() - 1
        nvec = b.ashr(b.add(b.sub(t1, t0), i64(W - 1)), i64(shift))

        def vec(j):
            with b.if_then(b.icmp_signed(">", b.load(nbuf, typ=I64), i64(cap - W)),
                           likely=False):
                flush()
            t = b.add(t0, b.shl(j, i64(shift)))
            rem = b.trunc(g._imin(b.sub(t1, t), i64(W)), I32)
            ok = self._accept(t, rem)
            n = b.load(nbuf, typ=I64)
            if self.wide:
                # compress into a register, then a plain store (the buffer has W slots of
                # slack): a compress straight to memory is microcoded on some cores
                bits = b.bitcast(ok, ir.IntType(W))
                for h in range(W // 8):
                    m8 = b.trunc(b.lshr(bits, ir.Constant(bits.type, 8 * h)), I8)
                    pos = b.add(splat(b, t, 8), _iota(I64, 8, 1, 8 * h))
                    kept = b.call(self.compress, [pos, ir.Constant(pos.type, ir.Undefined),
                                                  b.bitcast(m8, ir.VectorType(I1, 8))])
                    slot = b.bitcast(b.gep(buf, [n], source_etype=I64), kept.type.as_pointer())
                    b.store(kept, slot, align=8)
                    n = b.add(n, b.zext(b.call(self.popcount, [m8]), I64))
                b.store(n, nbuf)
                return
            for e in range(W):
                b.store(b.add(t, i64(e)), b.gep(buf, [n], source_etype=I64))
                n = b.add(n, b.zext(b.extract_element(ok, ir.Constant(I32, e)), I64))
            b.store(n, nbuf)

        g.ctx.loop(i64(0), nvec, vec, name="vec")

    def _accept(self, t, rem):
        g, b, W, d = self.g, self.g.b, self.W, self.g.spec.dims
        valid_el = b.icmp_unsigned("<", _iota(I32, W * d),
                                   splat(b, b.mul(rem, ir.Constant(I32, d)), W * d))
        ptr = b.gep(g.ptr["sorted_pos"], [b.mul(t, i64(d))], source_etype=g.pty)
        align = ir.Constant(I32, 4 if g.pty != F64 else 8)
        pts = b.call(self.load, [ptr, align, valid_el, ir.Constant(self.LT, None)])
        d2 = None
        for k in range(d):
            pk = b.shuffle_vector(pts, ir.Constant(self.LT, ir.Undefined),
                                  _iota(I32, W, d) if k == 0 else ir.Constant(
                                      ir.VectorType(I32, W), [e * d + k for e in range(W)]))
            diff = ir.IRBuilder.fsub(b, pk, self.qv[k])
            sq = ir.IRBuilder.fmul(b, diff, diff)
            d2 = sq if d2 is None else ir.IRBuilder.fadd(b, d2, sq)
        ok = b.fcmp_ordered("<=", d2, self.cut)
        ok = b.and_(ok, b.icmp_unsigned("<", _iota(I32, W), splat(b, rem, W)))
        if g.spec.exclude_self:
            own = b.sub(g.own, t)
            ok = b.and_(ok, b.icmp_signed("!=", _iota(I64, W), splat(b, own, W)))
        return ok


def rank_select(g, q, buf, m, best_d, best_i, best_t, nbest, W: int) -> None:
    """best_* <- the min(m, k) nearest of the m buffered sorted positions, in order (the
    states have k + 1 slots: the last one takes every rank past k)."""
    b, ctx, k, pty = g.b, g.ctx, g.spec.k, g.pty
    dbuf = ctx.alloca(pty, RANK_MAX + W)
    ibuf = ctx.alloca(I64, RANK_MAX + W)

    def score(j):
        tpos = b.load(b.gep(buf, [j], source_etype=I64), typ=I64)
        b.store(g._d2(tpos, q), b.gep(dbuf, [j], source_etype=pty))
        b.store(g._ld("sorted_idx", tpos, I64), b.gep(ibuf, [j], source_etype=I64))

    ctx.loop(i64(0), m, score, name="score")
    inf = ir.Constant(pty, float("inf"))
    for e in range(W):        # padding: after every real candidate in the order
        b.store(inf, b.gep(dbuf, [b.add(m, i64(e))], source_etype=pty))
        b.store(i64(2 ** 63 - 1), b.gep(ibuf, [b.add(m, i64(e))], source_etype=I64))
    nch = b.ashr(b.add(m, i64(W - 1)), i64(W.bit_length() - 1))
    ct, VT, IT = ir.VectorType(I32, W), ir.VectorType(pty, W), ir.VectorType(I64, W)
    cnt = ctx.alloca(ct, 1)
    rbuf = ctx.alloca(I32, RANK_MAX + W)
    size = 8 if pty == F64 else 4

    def ranks(c):
        # W candidates' ranks at once: no horizontal sum per candidate
        off = b.shl(c, i64(W.bit_length() - 1))
        di = b.load(b.gep(dbuf, [off], source_etype=pty), typ=VT, align=size)
        ii = b.load(b.gep(ibuf, [off], source_etype=I64), typ=IT, align=8)
        b.store(ir.Constant(ct, None), cnt)

        def other(j):
            dj = splat(b, b.load(b.gep(dbuf, [j], source_etype=pty), typ=pty), W)
            ij = splat(b, b.load(b.gep(ibuf, [j], source_etype=I64), typ=I64), W)
            before = b.or_(b.fcmp_ordered("<", dj, di),
                           b.and_(b.fcmp_ordered("==", dj, di), b.icmp_signed("<", ij, ii)))
            b.store(b.add(b.load(cnt, typ=ct), b.zext(before, ct)), cnt)

        ctx.loop(i64(0), m, other, name="rank")
        slot = b.bitcast(b.gep(rbuf, [off], source_etype=I32), ct.as_pointer())
        b.store(b.load(cnt, typ=ct), slot, align=4)

    def place(i):
        # ranks >= k land in the states' spare slot k: no branch
        r = g._imin(b.zext(b.load(b.gep(rbuf, [i], source_etype=I32), typ=I32), I64), i64(k))
        b.store(b.load(b.gep(dbuf, [i], source_etype=pty), typ=pty),
                b.gep(best_d, [r], source_etype=pty))
        b.store(b.load(b.gep(ibuf, [i], source_etype=I64), typ=I64),
                b.gep(best_i, [r], source_etype=I64))
        b.store(b.load(b.gep(buf, [i], source_etype=I64), typ=I64),
                b.gep(best_t, [r], source_etype=I64))

    ctx.loop(i64(0), nch, ranks, name="ranks")
    ctx.loop(i64(0), m, place, name="place")
    b.store(g._imin(m, i64(k)), nbest)
