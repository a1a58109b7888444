"""lower/llvm: what the two float32 attention micro-kernels share, on llvmlite's IR builder.

`AttentionIR` is one kernel `void(i64 begin, i64 end, ptr argv)` under construction: its
module, function and builder, blocks by name (laid out in the order code is emitted into
them), the intrinsics it calls, and the <16 x float> building blocks both kernels use: lane
splats, FMAs, key-lane masks, the exp approximation and 16 x 16 register transposes. Memory
is addressed through opaque pointers and `getelementptr` on element offsets only.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from .values import F32, I1, I64, PTR, i64

W = 16       # float32 lanes of a vector
I16 = ir.IntType(16)
I32 = ir.IntType(32)
VF = ir.VectorType(F32, W)
VI = ir.VectorType(I32, W)
VB = ir.VectorType(I1, W)
NEG_INF = float("-inf")
# exp(r) on [-ln2/2, ln2/2]: a degree-5 near-minimax polynomial (Chebyshev fit), relative
# error 2.4e-7 over the whole float32 range after the range reduction
EXP_POLY = (1.0000001192092896, 1.0, 0.49998870491981506, 0.16666415333747864,
            0.041917528957128525, 0.008375128731131554)
LN2_HI, LN2_LO = -0.693359375, 2.12194440e-4     # -ln 2 in two parts (Cody-Waite)
EXP_FLOOR = -88.0       # rounds to 2^-127 in the exp below: a zero biased exponent field


def fconst(x: float) -> ir.Constant:
    """A float constant, rounded to float32 first (LLVM wants float constants exact)."""
    return ir.Constant(F32, float(np.float32(x)))


def vconst(x: float) -> ir.Constant:
    return ir.Constant(VF, [fconst(x)] * W)


def iconst(x: int) -> ir.Constant:
    return ir.Constant(VI, [ir.Constant(I32, x)] * W)


def i32(x: int) -> ir.Constant:
    return ir.Constant(I32, x)


VZERO = ir.Constant(VF, None)      # zeroinitializer


def _as_i64(x):
    return i64(x) if isinstance(x, (int, np.integer)) else x


class AttentionIR:
    """One kernel `void(i64 begin, i64 end, ptr argv)` and the builder emitting it."""

    def __init__(self, symbol: str):
        self.module = ir.Module(name=symbol)
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64, PTR])
        self.fn = ir.Function(self.module, fnty, name=symbol)
        self.begin, self.end, self.argv = self.fn.args
        self._blocks: dict = {}
        self._decls: dict = {}
        self.b = ir.IRBuilder()
        self.enter("entry")

    def text(self) -> str:
        return str(self.module)

    # ---- blocks ------------------------------------------------------------------------

    def bb(self, name: str) -> ir.Block:
        """The block called `name` (made on first use: branches may name it before it is
        emitted into)."""
        if name not in self._blocks:
            self._blocks[name] = self.fn.append_basic_block(name)
        return self._blocks[name]

    def enter(self, name: str) -> ir.Block:
        """Emit into block `name` from now on; blocks are laid out in the order they are
        entered (the order of the code, as a reader expects)."""
        block = self.bb(name)
        self.fn.blocks.remove(block)
        self.fn.blocks.append(block)
        self.b.position_at_end(block)
        return block

    def br(self, name: str) -> None:
        self.b.branch(self.bb(name))

    def cbr(self, cond, yes: str, no: str) -> None:
        self.b.cbranch(cond, self.bb(yes), self.bb(no))

    def phi(self, ty, incoming: list, name: str = "") -> ir.PhiInstr:
        """A phi of (value, block or block name) pairs; more come with add_incoming."""
        p = self.b.phi(ty, name=name)
        for value, block in incoming:
            p.add_incoming(value, self.bb(block) if isinstance(block, str) else block)
        return p

    # ---- calls -------------------------------------------------------------------------

    def call(self, name: str, ret, args: list, fastmath=(), label: str = ""):
        """A call of intrinsic `name` (declared on first use) with `fastmath` flags."""
        fn = self._decls.get(name)
        if fn is None:
            fnty = ir.FunctionType(ret, [a.type for a in args])
            fn = self._decls[name] = ir.Function(self.module, fnty, name=name)
        return self.b.call(fn, args, name=label, fastmath=fastmath)

    def fma(self, a, b, c, name: str = ""):
        return self.call("llvm.fma.v16f32", VF, [a, b, c], label=name)

    def vmax(self, a, b, name: str = ""):
        # nnan: a plain vmaxps (maxnum's NaN rule costs a compare and a blend)
        return self.call("llvm.maxnum.v16f32", VF, [a, b], ("nnan",), name)

    def smin(self, a, b, name: str = ""):
        return self.call("llvm.smin.i64", I64, [a, _as_i64(b)], label=name)

    def smax(self, a, b, name: str = ""):
        return self.call("llvm.smax.i64", I64, [a, _as_i64(b)], label=name)

    def hmax(self, x, name: str = ""):
        """The largest lane of x (NaN-free)."""
        return self.call("llvm.vector.reduce.fmax.v16f32", F32, [x], ("nnan",), name)

    # ---- memory ------------------------------------------------------------------------

    def stack(self, n: int, name: str, elem=F32) -> ir.Value:
        """A 64-byte aligned stack array of n elements (emit in the entry block)."""
        a = self.b.alloca(ir.ArrayType(elem, n), name=name)
        a.align = 64
        a.type = PTR        # llvmlite types allocas as typed pointers; address them as `ptr`
        return a

    def at(self, base, offset, elem=F32, name: str = "") -> ir.Value:
        """The address of element `offset` (an i64 value or int) of `base`."""
        return self.b.gep(base, [_as_i64(offset)], name=name, source_etype=elem)

    def load(self, ptr, ty=F32, align=None, name: str = ""):
        return self.b.load(ptr, name=name, typ=ty, align=align)

    def vload(self, base, offset, align: int, name: str = ""):
        """The <16 x float> at float `offset` of `base`."""
        return self.b.load(self.at(base, offset), name=name, typ=VF, align=align)

    def vstore(self, value, base, offset, align: int) -> None:
        self.b.store(value, self.at(base, offset), align=align)

    def fetch(self, base, offset, elem=F32, name: str = ""):
        """The scalar at element `offset` of `base`."""
        return self.b.load(self.at(base, offset, elem), name=name, typ=elem)

    def unpack(self, names) -> dict:
        """argv's pointers by name."""
        return {nm: self.fetch(self.argv, i, PTR, name=nm) for i, nm in enumerate(names)}

    def params(self, prm, names) -> dict:
        """The i64 parameters prm[0..] by name."""
        return {nm: self.fetch(prm, i, I64, name=nm) for i, nm in enumerate(names)}

    # ---- vectors -----------------------------------------------------------------------

    def splat(self, x, name: str = ""):
        """<16 x x> from a float or i32 scalar."""
        vty = ir.VectorType(x.type, W)
        one = self.b.insert_element(ir.Constant(vty, ir.Undefined), x, i32(0))
        return self.b.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                     ir.Constant(VI, None), name=name)

    def splat_index(self, x, name: str = ""):
        """<16 x i32> copies of the i64 index x."""
        return self.splat(self.b.trunc(x, I32), name)

    def key_lanes(self, first, count: int) -> list:
        """<16 x i32> key indices first + u * 16 + lane of `count` score vectors."""
        return [self.b.add(first, ir.Constant(VI, [i32(u * W + t) for t in range(W)]),
                           name=f"lanes{u}") for u in range(count)]

    def in_range(self, lanes, lov, hiv, name: str = ""):
        """lov <= key lane < hiv, lane-wise."""
        lo_ok = self.b.icmp_signed(">=", lanes, lov)
        hi_ok = self.b.icmp_signed("<", lanes, hiv)
        return self.b.and_(lo_ok, hi_ok, name=name)

    def vexp(self, x, name: str = ""):
        """exp(x) for <16 x float> x <= 0 (a little above 0 is fine); x = -inf (or below
        -87.6) gives exactly 0: the clamp at -88 rounds to 2^-127, whose biased exponent
        field is 0."""
        b = self.b
        a = self.vmax(x, vconst(EXP_FLOOR))
        n = self.call("llvm.rint.v16f32", VF, [b.fmul(a, vconst(1.4426950408889634))])
        r = self.fma(n, vconst(LN2_LO), self.fma(n, vconst(LN2_HI), a))
        p = vconst(EXP_POLY[-1])
        for c in EXP_POLY[-2::-1]:
            p = self.fma(p, r, vconst(c))
        bits = b.shl(b.add(b.fptosi(n, VI), iconst(127)), iconst(23))
        return b.fmul(p, b.bitcast(bits, VF), name=name)

    def transpose16(self, rows: list) -> list:
        """The transpose of 16 <16 x float> values: four rounds of swapping the off-diagonal
        b x b blocks of every 2b x 2b block."""
        a = list(rows)
        for blk in (8, 4, 2, 1):
            na = list(a)
            lo = ir.Constant(VI, [i32(k if not k & blk else W + k - blk) for k in range(W)])
            hi = ir.Constant(VI, [i32(k + blk if not k & blk else W + k) for k in range(W)])
            for i in range(W):
                if not i & blk:
                    na[i] = self.b.shuffle_vector(a[i], a[i + blk], lo)
                    na[i + blk] = self.b.shuffle_vector(a[i], a[i + blk], hi)
            a = na
        return a
