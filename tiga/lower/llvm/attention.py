"""lower: LLVM micro-kernel of the float32 streaming attention forward.

Destination row i reads sources lo[i] <= j < hi[i], with lo and hi nondecreasing; the runtime
(`xla_free_runtime.llvm_attention`) computes per-group key ranges and runs this kernel twice:
over (head, 16 keys) jobs that pack K^T, then over (head, row block) jobs that write the
normalised output. Other dtypes, head widths, pruning and the backward run as numpy tiles
(`xla_free_runtime.attention_tiles`).
"""
from __future__ import annotations

import numpy as np

# ---- LLVM micro-kernel: float32 forward ------------------------------------------------
#
# `forward_ir(symbol, D)` is a kernel `void(i64 begin, i64 end, i8** argv)`; prm[PHASE]
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
# (Npad,), prm, glo/ghi per row group (KS-aligned key range), blo/bhi per row block.
# Measured (benchmarks/attention.py): 6 x 64 beat 4 x 16, 4 x 32, 4 x 64 and 8 x 64 (spills).
W = 16       # float32 lanes
RB = 6       # query rows per register tile
GB = 8       # row groups per job (48 query rows)
KB = 256     # keys per key block
NV = 4       # <16 x float> score vectors per row and step: KS = NV * W keys per step
KS = NV * W
PV_UNROLL = 4   # keys per trip of the P @ V loop
LAZY = 8.0      # p <= e^LAZY between moves of a row's reference max (measured 3-5% faster)
V = "<16 x float>"
PRM = ("npad", "kpad", "nks", "qblocks", "nq", "nk", "qhs", "qrs", "vhs", "vrs", "scbits",
       "khs", "krs", "ohs", "ors", "phase")
PHASE = PRM.index("phase")
# exp(r) on [-ln2/2, ln2/2]: a degree-5 near-minimax polynomial (Chebyshev fit), relative
# error 2.4e-7 over the whole float32 range after the range reduction
EXP_POLY = (1.0000001192092896, 1.0, 0.49998870491981506, 0.16666415333747864,
            0.041917528957128525, 0.008375128731131554)


def _splat(name, scalar, ty="float"):
    return [f"  {name}.i = insertelement <16 x {ty}> undef, {ty} {scalar}, i32 0",
            f"  {name} = shufflevector <16 x {ty}> {name}.i, <16 x {ty}> undef, "
            "<16 x i32> zeroinitializer"]


def _key_lanes(first: str, count: int) -> list:
    """%lanes0..: <16 x i32> key indices first + u*16 + lane of `count` score vectors."""
    return [f"  %lanes{u} = add <16 x i32> {first}, <"
            + ", ".join(f"i32 {u * W + t}" for t in range(W)) + ">" for u in range(count)]


def _in_range(ok: str, r: int, u: int) -> list:
    """ok = lov[r] <= key lane < hiv[r] for score vector u of row r."""
    return [f"  {ok}.l = icmp sge <16 x i32> %lanes{u}, %lov{r}",
            f"  {ok}.h = icmp slt <16 x i32> %lanes{u}, %hiv{r}",
            f"  {ok} = and <16 x i1> {ok}.l, {ok}.h"]


def _fconst(x):
    import struct
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(np.float32(x))))[0]:016X}"


def _vconst(x):
    c = _fconst(x)
    return "<" + ", ".join(f"float {c}" for _ in range(W)) + ">"


def _iconst(x):
    return "<" + ", ".join([f"i32 {x}"] * W) + ">"


def _fma(out, a, b, c):
    return f"  {out} = call {V} @llvm.fma.v16f32({V} {a}, {V} {b}, {V} {c})"


def _vptr(name, base, offset):
    """`{name}v`: a <16 x float>* at float index `offset` of `base`."""
    return [f"  {name} = getelementptr float, float* {base}, i64 {offset}",
            f"  {name}v = bitcast float* {name} to {V}*"]


def _vexp(out, x, tag):
    """out = exp(x) for <16 x float> x <= 0 (a little above 0 is fine); x = -inf (or below
    -87.6) gives exactly 0: the clamp at -88 rounds to 2^-127, whose biased exponent field
    is 0."""
    L = []
    # nnan: a plain vmaxps (maxnum's NaN rule costs a compare and a blend)
    L.append(f"  {tag}.a = call nnan {V} @llvm.maxnum.v16f32({V} {x}, {V} {_vconst(-88.0)})")
    L.append(f"  {tag}.t = fmul {V} {tag}.a, {_vconst(1.4426950408889634)}")
    L.append(f"  {tag}.n = call {V} @llvm.rint.v16f32({V} {tag}.t)")
    L.append(_fma(f"{tag}.r0", f"{tag}.n", _vconst(-0.693359375), f"{tag}.a"))
    L.append(_fma(f"{tag}.r", f"{tag}.n", _vconst(2.12194440e-4), f"{tag}.r0"))
    prev = _vconst(EXP_POLY[-1])
    for i, c in enumerate(EXP_POLY[-2::-1]):
        L.append(_fma(f"{tag}.p{i}", prev, f"{tag}.r", _vconst(c)))
        prev = f"{tag}.p{i}"
    L.append(f"  {tag}.ni = fptosi {V} {tag}.n to <16 x i32>")
    L.append(f"  {tag}.nb = add <16 x i32> {tag}.ni, {_iconst(127)}")
    L.append(f"  {tag}.ns = shl <16 x i32> {tag}.nb, {_iconst(23)}")
    L.append(f"  {tag}.s = bitcast <16 x i32> {tag}.ns to {V}")
    L.append(f"  {out} = fmul {V} {prev}, {tag}.s")
    return L


def _transpose16(rows, tag):
    """IR lines and the 16 names of the transpose of 16 <16 x float> values `rows`: four
    rounds of swapping the off-diagonal b x b blocks of every 2b x 2b block."""
    L = []
    a = list(rows)
    for b in (8, 4, 2, 1):
        na = list(a)
        for i in range(16):
            if i & b:
                continue
            mx = [k if not k & b else 16 + k - b for k in range(16)]
            my = [k + b if not k & b else 16 + k for k in range(16)]
            for nm, mask, slot in ((f"{tag}x{b}_{i}", mx, i), (f"{tag}y{b}_{i}", my, i + b)):
                L.append(f"  {nm} = shufflevector {V} {a[i]}, {V} {a[i + b]}, <16 x i32> <"
                         + ", ".join(f"i32 {m}" for m in mask) + ">")
                na[slot] = nm
        a = na
    return L, a


def _pack_phase(L, D):
    """Phase 0 jobs (head, 16 keys): kt[h, key // KS, d, key % KS] = k[h, key, d]; keys past
    the last read key nk - 1 and store 0."""
    A = L.append
    C = D // W
    A("pack.head:")
    A("  %pj = phi i64 [ %begin, %pack.entry ], [ %pj.next, %pack.body ]")
    A("  %pj.more = icmp slt i64 %pj, %end")
    A("  br i1 %pj.more, label %pack.body, label %exit")
    A("pack.body:")
    A("  %k16 = udiv i64 %kpad, 16")
    A("  %ph = udiv i64 %pj, %k16")
    A("  %pjb = urem i64 %pj, %k16")
    A("  %key0 = mul i64 %pjb, 16")
    A("  %key0.t = trunc i64 %key0 to i32")
    L.extend(_splat("%key0v", "%key0.t", "i32"))
    A("  %pkeys = add <16 x i32> %key0v, <" + ", ".join(f"i32 {t}" for t in range(W)) + ">")
    A("  %nk.t = trunc i64 %nk to i32")
    L.extend(_splat("%nkv", "%nk.t", "i32"))
    A("  %pvalid = icmp slt <16 x i32> %pkeys, %nkv")
    A("  %pkh = mul i64 %ph, %khs")
    for t in range(W):
        A(f"  %pkey{t}.a = add i64 %key0, {t}")
        A(f"  %pkey{t} = call i64 @llvm.smin.i64(i64 %pkey{t}.a, i64 %nk1)")
        A(f"  %prow{t}.a = mul i64 %pkey{t}, %krs")
        A(f"  %prow{t} = add i64 %prow{t}.a, %pkh")
    A(f"  %pstep = udiv i64 %key0, {KS}")
    A(f"  %plane = urem i64 %key0, {KS}")
    A("  %ptile.a = mul i64 %ph, %nks")
    A("  %ptile = add i64 %ptile.a, %pstep")
    A(f"  %pbase.a = mul i64 %ptile, {D * KS}")
    A("  %pbase = add i64 %pbase.a, %plane")
    for c in range(C):
        rows = []
        for t in range(W):
            A(f"  %pko{c}_{t} = add i64 %prow{t}, {c * W}")
            L.extend(_vptr(f"%pkp{c}_{t}", "%k", f"%pko{c}_{t}"))
            A(f"  %pk{c}_{t} = load {V}, {V}* %pkp{c}_{t}v, align 4")
            rows.append(f"%pk{c}_{t}")
        lines, cols = _transpose16(rows, f"%tr{c}_")
        L.extend(lines)
        for dd in range(W):
            A(f"  %pz{c}_{dd} = select <16 x i1> %pvalid, {V} {cols[dd]}, {V} zeroinitializer")
            A(f"  %pso{c}_{dd} = add i64 %pbase, {(c * W + dd) * KS}")
            L.extend(_vptr(f"%psp{c}_{dd}", "%kt", f"%pso{c}_{dd}"))
            A(f"  store {V} %pz{c}_{dd}, {V}* %psp{c}_{dd}v, align 4")
    A("  %pj.next = add i64 %pj, 1")
    A("  br label %pack.head")


def forward_ir(symbol: str, D: int) -> str:
    """LLVM IR of the float32 streaming forward for head width D (a multiple of 16)."""
    assert D % W == 0
    C = D // W
    NEG = "0xFFF0000000000000"
    ROWS = GB * RB
    L = []
    A = L.append
    A(f"declare {V} @llvm.maxnum.v16f32({V}, {V})")
    A(f"declare {V} @llvm.rint.v16f32({V})")
    A(f"declare {V} @llvm.fma.v16f32({V}, {V}, {V})")
    A(f"declare float @llvm.vector.reduce.fmax.v16f32({V})")
    A(f"declare float @llvm.vector.reduce.fadd.v16f32(float, {V})")
    A("declare float @llvm.maxnum.f32(float, float)")
    A("declare i64 @llvm.smax.i64(i64, i64)")
    A("declare i64 @llvm.smin.i64(i64, i64)")
    A(f"define void @{symbol}(i64 %begin, i64 %end, i8** %argv) {{")
    A("entry:")
    # the step's probabilities, RB x KS: P @ V broadcasts them from here (as register values
    # the RB x NV vectors spill, and a variable lane extract copies the spilled vector first)
    A(f"  %pbuf = alloca [{RB * KS} x float], align 64")
    A(f"  %pbuf0 = getelementptr [{RB * KS} x float], [{RB * KS} x float]* %pbuf, i64 0, i64 0")
    # the row block's running state
    A(f"  %st = alloca [{ROWS * D} x float], align 64")
    A(f"  %st0 = getelementptr [{ROWS * D} x float], [{ROWS * D} x float]* %st, i64 0, i64 0")
    A(f"  %mb = alloca [{ROWS} x float], align 64")
    A(f"  %mb0 = getelementptr [{ROWS} x float], [{ROWS} x float]* %mb, i64 0, i64 0")
    A(f"  %lb = alloca [{ROWS} x float], align 64")
    A(f"  %lb0 = getelementptr [{ROWS} x float], [{ROWS} x float]* %lb, i64 0, i64 0")
    A(f"  %mv = alloca [{ROWS * W} x float], align 64")
    A(f"  %mv0 = getelementptr [{ROWS * W} x float], [{ROWS * W} x float]* %mv, i64 0, i64 0")
    names = ["q", "k", "kt", "v", "out", "top", "mass", "lo", "hi", "prm", "glo", "ghi",
             "blo", "bhi"]
    for i, nm in enumerate(names):
        A(f"  %{nm}.pp = getelementptr i8*, i8** %argv, i64 {i}")
        A(f"  %{nm}.p = load i8*, i8** %{nm}.pp")
        ty = "i64" if nm in ("lo", "hi", "prm", "glo", "ghi", "blo", "bhi") else "float"
        A(f"  %{nm} = bitcast i8* %{nm}.p to {ty}*")
    for i, nm in enumerate(PRM):
        A(f"  %{nm}.g = getelementptr i64, i64* %prm, i64 {i}")
        A(f"  %{nm} = load i64, i64* %{nm}.g")
    A("  %nq1 = sub i64 %nq, 1")
    A("  %nk1 = sub i64 %nk, 1")
    A("  %scbits.t = trunc i64 %scbits to i32")
    A("  %scale = bitcast i32 %scbits.t to float")
    L.extend(_splat("%scalev", "%scale"))
    A("  %invscale = fdiv float 1.0, %scale")
    A("  %is.pack = icmp eq i64 %phase, 0")
    A("  br i1 %is.pack, label %pack.entry, label %main.entry")
    A("pack.entry:")
    A("  br label %pack.head")
    _pack_phase(L, D)
    A("main.entry:")
    A("  br label %job.head")
    A("job.head:")
    A("  %job = phi i64 [ %begin, %main.entry ], [ %job.next, %fin.exit ]")
    A("  %job.more = icmp slt i64 %job, %end")
    A("  br i1 %job.more, label %job.body, label %exit")
    A("job.body:")
    A("  %h = udiv i64 %job, %qblocks")
    A("  %qb = urem i64 %job, %qblocks")
    A("  %blo.g = getelementptr i64, i64* %blo, i64 %qb")
    A("  %bstart = load i64, i64* %blo.g")
    A("  %bhi.g = getelementptr i64, i64* %bhi, i64 %qb")
    A("  %bend = load i64, i64* %bhi.g")
    A(f"  %g0 = mul i64 %qb, {GB}")
    A(f"  %qb.rows = mul i64 %qb, {ROWS}")
    A("  %qh = mul i64 %h, %qhs")
    A("  %vh = mul i64 %h, %vhs")
    A("  %kth = mul i64 %h, %nks")
    A("  br label %init.loop")
    A("init.loop:")
    A("  %ii = phi i64 [ 0, %job.body ], [ %ii.next, %init.next ]")
    A(f"  %iio = mul i64 %ii, {W}")
    L.extend(_vptr("%iip", "%st0", "%iio"))
    A(f"  store {V} zeroinitializer, {V}* %iipv, align 64")
    A("  %iir = icmp ult i64 %ii, " + str(ROWS))
    A("  br i1 %iir, label %init.row, label %init.next")
    A("init.row:")
    A("  %imp = getelementptr float, float* %mb0, i64 %ii")
    A(f"  store float {NEG}, float* %imp")
    A("  %ilp = getelementptr float, float* %lb0, i64 %ii")
    A("  store float 0.0, float* %ilp")
    L.extend(_vptr("%imv", "%mv0", "%iio"))
    A(f"  store {V} <" + ", ".join([f"float {NEG}"] * W) + f">, {V}* %imvv, align 64")
    A("  br label %init.next")
    A("init.next:")
    A("  %ii.next = add i64 %ii, 1")
    A(f"  %ii.more = icmp ult i64 %ii.next, {ROWS * C}")
    A("  br i1 %ii.more, label %init.loop, label %kb.head")
    A("kb.head:")
    A("  %kb = phi i64 [ %bstart, %init.next ], [ %kb.next, %grp.exit ]")
    A("  %kb.more = icmp slt i64 %kb, %bend")
    A("  br i1 %kb.more, label %kb.body, label %fin.head")
    A("kb.body:")
    A(f"  %kbe = add i64 %kb, {KB}")
    A("  br label %grp.head")
    A("grp.head:")
    A("  %gi = phi i64 [ 0, %kb.body ], [ %gi.next, %grp.end ]")
    A(f"  %gi.more = icmp slt i64 %gi, {GB}")
    A("  br i1 %gi.more, label %grp.body, label %grp.exit")
    A("grp.exit:")
    A("  %kb.next = add i64 %kb, " + str(KB))
    A("  br label %kb.head")
    A("grp.body:")
    A("  %g = add i64 %g0, %gi")
    A("  %glo.g = getelementptr i64, i64* %glo, i64 %g")
    A("  %glo.v = load i64, i64* %glo.g")
    A("  %ghi.g = getelementptr i64, i64* %ghi, i64 %g")
    A("  %ghi.v = load i64, i64* %ghi.g")
    A("  %kstart = call i64 @llvm.smax.i64(i64 %kb, i64 %glo.v)")
    A("  %kmax = call i64 @llvm.smin.i64(i64 %kbe, i64 %ghi.v)")
    A(f"  %r0 = mul i64 %g, {RB}")
    A(f"  %lrb = mul i64 %gi, {RB}")
    for r in range(RB):
        A(f"  %row{r} = add i64 %r0, {r}")
        A(f"  %lo{r}.g = getelementptr i64, i64* %lo, i64 %row{r}")
        A(f"  %lo{r} = load i64, i64* %lo{r}.g")
        A(f"  %hi{r}.g = getelementptr i64, i64* %hi, i64 %row{r}")
        A(f"  %hi{r} = load i64, i64* %hi{r}.g")
        A(f"  %lo{r}.t = trunc i64 %lo{r} to i32")
        A(f"  %hi{r}.t = trunc i64 %hi{r} to i32")
        L.extend(_splat(f"%lov{r}", f"%lo{r}.t", "i32"))
        L.extend(_splat(f"%hiv{r}", f"%hi{r}.t", "i32"))
    # a step wholly inside every row's range needs no mask (padding rows: hi = 0, never)
    mlo, mhi = "%lo0", "%hi0"
    for r in range(1, RB):
        A(f"  %mlo{r} = call i64 @llvm.smax.i64(i64 {mlo}, i64 %lo{r})")
        A(f"  %mhi{r} = call i64 @llvm.smin.i64(i64 {mhi}, i64 %hi{r})")
        mlo, mhi = f"%mlo{r}", f"%mhi{r}"
    A(f"  %inhi = sub i64 {mhi}, {KS}")
    for r in range(RB):
        A(f"  %lr{r} = add i64 %lrb, {r}")
        A(f"  %so{r} = mul i64 %lr{r}, {D}")
        # q is read in place (head stride qhs, row stride qrs); padding rows read row nq - 1
        A(f"  %qrc{r} = call i64 @llvm.smin.i64(i64 %row{r}, i64 %nq1)")
        A(f"  %qsr{r} = mul i64 %qrc{r}, %qrs")
        A(f"  %qsrc{r} = add i64 %qh, %qsr{r}")
        A(f"  %tp{r} = getelementptr float, float* %mb0, i64 %lr{r}")
        A(f"  %m{r}.in = load float, float* %tp{r}")
        A(f"  %mp{r} = getelementptr float, float* %lb0, i64 %lr{r}")
        A(f"  %l{r}.in = load float, float* %mp{r}")
        A(f"  %mvo{r}.i = mul i64 %lr{r}, {W}")
        L.extend(_vptr(f"%mvp{r}", "%mv0", f"%mvo{r}.i"))
        for c in range(C):
            A(f"  %yo{r}_{c} = add i64 %so{r}, {c * W}")
            L.extend(_vptr(f"%yp{r}_{c}", "%st0", f"%yo{r}_{c}"))
            A(f"  %o{r}_{c}.in = load {V}, {V}* %yp{r}_{c}v, align 64")
    A("  br label %k.head")
    A("k.head:")
    A("  %j = phi i64 [ %kstart, %grp.body ], [ %j.next, %pv.done ]")
    for r in range(RB):
        A(f"  %m{r} = phi float [ %m{r}.in, %grp.body ], [ %mn{r}, %pv.done ]")
        A(f"  %l{r} = phi float [ %l{r}.in, %grp.body ], [ %ln{r}, %pv.done ]")
        for c in range(C):
            A(f"  %o{r}_{c} = phi {V} [ %o{r}_{c}.in, %grp.body ], [ %ot{r}_{c}, %pv.done ]")
    A("  %k.more = icmp slt i64 %j, %kmax")
    A("  br i1 %k.more, label %k.body, label %k.exit")
    A("k.body:")
    A("  %j32 = trunc i64 %j to i32")
    L.extend(_splat("%jv", "%j32", "i32"))
    L.extend(_key_lanes("%jv", NV))
    A(f"  %jstep = udiv i64 %j, {KS}")
    A("  %ktile = add i64 %kth, %jstep")
    A(f"  %ktbase = mul i64 %ktile, {D * KS}")
    A("  br label %qk.loop")
    # ---- raw scores: a loop over d (4 per trip), RB x NV (x 2 partial sums when NV = 1)
    P = 2 if NV == 1 else 1
    acc_ids = [(r, u, p) for r in range(RB) for u in range(NV) for p in range(P)]
    A("qk.loop:")
    A("  %d = phi i64 [ 0, %k.body ], [ %d.next, %qk.loop ]")
    for r, u, p in acc_ids:
        A(f"  %pa{r}_{u}_{p} = phi {V} [ zeroinitializer, %k.body ], "
          f"[ %pn{r}_{u}_{p}, %qk.loop ]")
    cur = {i: "%pa{}_{}_{}".format(*i) for i in acc_ids}
    A(f"  %ktd = mul i64 %d, {KS}")
    A("  %ktoff = add i64 %ktbase, %ktd")
    for dd in range(4):
        A(f"  %dd{dd} = add i64 %d, {dd}")
        for u in range(NV):
            A(f"  %ktoff{dd}_{u} = add i64 %ktoff, {dd * KS + u * W}")
            L.extend(_vptr(f"%ktp{dd}_{u}", "%kt", f"%ktoff{dd}_{u}"))
            A(f"  %kt{dd}_{u} = load {V}, {V}* %ktp{dd}_{u}v, align 4")
        for r in range(RB):
            A(f"  %qo{r}_{dd} = add i64 %qsrc{r}, %dd{dd}")
            A(f"  %qp{r}_{dd} = getelementptr float, float* %q, i64 %qo{r}_{dd}")
            A(f"  %qs{r}_{dd} = load float, float* %qp{r}_{dd}")
            L.extend(_splat(f"%qb{r}_{dd}", f"%qs{r}_{dd}"))
            p = dd % P
            for u in range(NV):
                last = dd >= 4 - P
                nm = f"%pn{r}_{u}_{p}" if last else f"%pt{r}_{u}_{p}_{dd}"
                A(_fma(nm, f"%qb{r}_{dd}", f"%kt{dd}_{u}", cur[(r, u, p)]))
                cur[(r, u, p)] = nm
    A("  %d.next = add i64 %d, 4")
    A(f"  %d.more = icmp slt i64 %d.next, {D}")
    A("  br i1 %d.more, label %qk.loop, label %qk.exit")
    A("qk.exit:")
    for r in range(RB):
        for u in range(NV):
            if P == 2:
                A(f"  %sp{r}_{u} = fadd {V} %pn{r}_{u}_0, %pn{r}_{u}_1")
            else:
                # (a no-op cast: fadd x, 0 would cost an add, -0 + 0 being +0)
                A(f"  %sp{r}_{u} = bitcast {V} %pn{r}_{u}_0 to {V}")
    A(f"  %in.a = icmp sge i64 %j, {mlo}")
    A("  %in.b = icmp sle i64 %j, %inhi")
    A("  %inner = and i1 %in.a, %in.b")
    A("  br i1 %inner, label %qk.done, label %qk.mask")
    A("qk.mask:")
    for r in range(RB):
        for u in range(NV):
            sp = f"%sp{r}_{u}"
            L.extend(_in_range(f"%ok{r}_{u}", r, u))
            A(f"  %Sx{r}_{u} = select <16 x i1> %ok{r}_{u}, {V} {sp}, {V} "
              + "<" + ", ".join([f"float {NEG}"] * W) + ">")
    A("  br label %qk.done")
    A("qk.done:")
    for r in range(RB):
        for u in range(NV):
            sp = f"%sp{r}_{u}"
            A(f"  %S{r}_{u} = phi {V} [ {sp}, %qk.exit ], [ %Sx{r}_{u}, %qk.mask ]")
    # ---- softmax update. The rows' reference m (the max of the scores before a lazy
    # step) moves only when a score exceeds it by more than LAZY: otherwise p = exp(s - m)
    # <= e^LAZY, and the step skips the row max reductions, the rescale exp and the
    # accumulator rescale. The true row max (for `top`) is a lane-wise running max in
    # memory, reduced once per row at the end.
    anyv, lane_max = None, []
    for r in range(RB):
        top_v = f"%S{r}_0"
        for u in range(1, NV):
            A(f"  %Sm{r}_{u} = call nnan {V} @llvm.maxnum.v16f32({V} {top_v}, {V} %S{r}_{u})")
            top_v = f"%Sm{r}_{u}"
        lane_max.append(top_v)
        A(f"  %mvo{r} = load {V}, {V}* %mvp{r}v, align 64")
        A(f"  %mvn{r} = call nnan {V} @llvm.maxnum.v16f32({V} %mvo{r}, {V} {top_v})")
        A(f"  store {V} %mvn{r}, {V}* %mvp{r}v, align 64")
        # raw scores above (m + LAZY) / scale (m = -inf: any finite score)
        A(f"  %thr{r}.a = fadd float %m{r}, {_fconst(LAZY)}")
        A(f"  %thr{r} = fmul float %thr{r}.a, %invscale")
        L.extend(_splat(f"%thrv{r}", f"%thr{r}"))
        A(f"  %gt{r} = fcmp ogt {V} {top_v}, %thrv{r}")
        if anyv is None:
            anyv = f"%gt{r}"
        else:
            A(f"  %gto{r} = or <16 x i1> {anyv}, %gt{r}")
            anyv = f"%gto{r}"
    A(f"  %gtbits = bitcast <16 x i1> {anyv} to i16")
    A("  %moved = icmp ne i16 %gtbits, 0")
    A("  br i1 %moved, label %sm.move, label %sm.join")
    A("sm.move:")
    for r in range(RB):
        A(f"  %mxr{r} = call nnan float @llvm.vector.reduce.fmax.v16f32({V} {lane_max[r]})")
        # scale > 0 (the runtime checks): max(scale * s) = scale * max(s), rounding included
        A(f"  %mx{r} = fmul float %mxr{r}, %scale")
        A(f"  %mm{r} = call float @llvm.maxnum.f32(float %m{r}, float %mx{r})")
        A(f"  %isinf{r} = fcmp oeq float %mm{r}, {NEG}")
        A(f"  %msm{r} = select i1 %isinf{r}, float 0.0, float %mm{r}")
        A(f"  %ad{r} = fsub float %m{r}, %msm{r}")
        prev_ad = "zeroinitializer" if r == 0 else f"%adv{r - 1}"
        A(f"  %adv{r} = insertelement {V} {prev_ad}, float %ad{r}, i32 {r}")
    # the rows' rescale factors exp(m_old - m_new) in one vector exp (unused lanes: exp(0))
    L.extend(_vexp("%alpha", f"%adv{RB - 1}", "%ea"))
    for r in range(RB):
        A(f"  %al{r} = extractelement {V} %alpha, i32 {r}")
        L.extend(_splat(f"%alv{r}", f"%al{r}"))
        A(f"  %lsm{r} = fmul float %l{r}, %al{r}")
        for c in range(C):
            A(f"  %oam{r}_{c} = fmul {V} %o{r}_{c}, %alv{r}")
    A("  br label %sm.join")
    A("sm.join:")
    for r in range(RB):
        A(f"  %mn{r} = phi float [ %m{r}, %qk.done ], [ %mm{r}, %sm.move ]")
        A(f"  %lsc{r} = phi float [ %l{r}, %qk.done ], [ %lsm{r}, %sm.move ]")
        for c in range(C):
            A(f"  %oa{r}_{c} = phi {V} [ %o{r}_{c}, %qk.done ], [ %oam{r}_{c}, %sm.move ]")
    for r in range(RB):
        A(f"  %isinfj{r} = fcmp oeq float %mn{r}, {NEG}")
        A(f"  %ms{r} = select i1 %isinfj{r}, float 0.0, float %mn{r}")
        A(f"  %msn{r} = fneg float %ms{r}")
        L.extend(_splat(f"%msv{r}", f"%msn{r}"))
        for u in range(NV):
            A(_fma(f"%sd{r}_{u}", f"%S{r}_{u}", "%scalev", f"%msv{r}"))
            L.extend(_vexp(f"%P{r}_{u}", f"%sd{r}_{u}", f"%e{r}_{u}"))
            L.extend(_vptr(f"%pst{r}_{u}", "%pbuf0", r * KS + u * W))
            A(f"  store {V} %P{r}_{u}, {V}* %pst{r}_{u}v, align 64")
        tot = f"%P{r}_0"
        for u in range(1, NV):
            A(f"  %Ps{r}_{u} = fadd {V} {tot}, %P{r}_{u}")
            tot = f"%Ps{r}_{u}"
        A(f"  %ps{r} = call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V} {tot})")
        A(f"  %ln{r} = fadd float %lsc{r}, %ps{r}")
    # ---- P @ V over the step's keys below kmax (later keys have p = 0 in every row, and
    # may lie past the last key): PV_UNROLL keys per trip, then one at a time
    A("  %tc.a = sub i64 %kmax, %j")
    A(f"  %tc = call i64 @llvm.smin.i64(i64 %tc.a, i64 {KS})")
    A(f"  %tc4 = sub i64 %tc, {PV_UNROLL - 1}")
    # V rows through a pointer stepped by the row stride (a multiply per key would take
    # an FMA port's slot)
    A("  %vj.a = mul i64 %j, %vrs")
    A("  %vj = add i64 %vj.a, %vh")
    A("  %vrow0 = getelementptr float, float* %v, i64 %vj")
    A(f"  %vstep = mul i64 %vrs, {PV_UNROLL}")
    A("  br label %pv.head")

    def pv_body(label, tvar, ptr, count, src, dst_fmt):
        cur = dict(src)
        for tt in range(count):
            x = f"{label}{tt}"
            A(f"  %tt{x} = add i64 {tvar}, {tt}")
            A(f"  %vro{x} = mul i64 %vrs, {tt}")
            A(f"  %vr{x} = getelementptr float, float* {ptr}, i64 %vro{x}")
            for c in range(C):
                L.extend(_vptr(f"%vp{x}_{c}", f"%vr{x}", c * W))
                A(f"  %V{x}_{c} = load {V}, {V}* %vp{x}_{c}v, align 4")
            for r in range(RB):
                A(f"  %pi{r}_{x} = add i64 %tt{x}, {r * KS}")
                A(f"  %pg{r}_{x} = getelementptr float, float* %pbuf0, i64 %pi{r}_{x}")
                A(f"  %pe{r}_{x} = load float, float* %pg{r}_{x}")
                L.extend(_splat(f"%pb{r}_{x}", f"%pe{r}_{x}"))
                for c in range(C):
                    nm = dst_fmt.format(r=r, c=c) if tt == count - 1 else f"%om{r}_{c}_{x}"
                    A(_fma(nm, f"%pb{r}_{x}", f"%V{x}_{c}", cur[(r, c)]))
                    cur[(r, c)] = nm

    A("pv.head:")
    A("  %t = phi i64 [ 0, %sm.join ], [ %t.next, %pv.loop ]")
    A("  %vq = phi float* [ %vrow0, %sm.join ], [ %vq.next, %pv.loop ]")
    for r in range(RB):
        for c in range(C):
            A(f"  %ov{r}_{c} = phi {V} [ %oa{r}_{c}, %sm.join ], [ %on{r}_{c}, %pv.loop ]")
    A("  %t.more = icmp slt i64 %t, %tc4")
    A("  br i1 %t.more, label %pv.loop, label %pv.tail")
    A("pv.loop:")
    pv_body("u", "%t", "%vq", PV_UNROLL,
            {(r, c): f"%ov{r}_{c}" for r in range(RB) for c in range(C)}, "%on{r}_{c}")
    A(f"  %t.next = add i64 %t, {PV_UNROLL}")
    A("  %vq.next = getelementptr float, float* %vq, i64 %vstep")
    A("  br label %pv.head")
    A("pv.tail:")
    A("  %tq = phi i64 [ %t, %pv.head ], [ %tq.next, %pv.one ]")
    A("  %vt = phi float* [ %vq, %pv.head ], [ %vt.next, %pv.one ]")
    for r in range(RB):
        for c in range(C):
            A(f"  %ot{r}_{c} = phi {V} [ %ov{r}_{c}, %pv.head ], [ %oq{r}_{c}, %pv.one ]")
    A("  %tq.more = icmp slt i64 %tq, %tc")
    A("  br i1 %tq.more, label %pv.one, label %pv.done")
    A("pv.one:")
    pv_body("q", "%tq", "%vt", 1, {(r, c): f"%ot{r}_{c}" for r in range(RB) for c in range(C)},
            "%oq{r}_{c}")
    A("  %tq.next = add i64 %tq, 1")
    A("  %vt.next = getelementptr float, float* %vt, i64 %vrs")
    A("  br label %pv.tail")
    A("pv.done:")
    A(f"  %j.next = add i64 %j, {KS}")
    A("  br label %k.head")
    A("k.exit:")
    for r in range(RB):
        A(f"  store float %m{r}, float* %tp{r}")
        A(f"  store float %l{r}, float* %mp{r}")
        for c in range(C):
            A(f"  store {V} %o{r}_{c}, {V}* %yp{r}_{c}v, align 64")
    A("  br label %grp.end")
    A("grp.end:")
    A("  %gi.next = add i64 %gi, 1")
    A("  br label %grp.head")
    # ---- the block's rows: out = acc / mass (0 for an empty row), top (0 when empty), mass
    A("fin.head:")
    A("  %fr = phi i64 [ 0, %kb.head ], [ %fr.next, %fin.body ]")
    A("  %frow = add i64 %qb.rows, %fr")
    A(f"  %fr.in = icmp ult i64 %fr, {ROWS}")
    A("  %frow.in = icmp slt i64 %frow, %nq")
    A("  %fr.more = and i1 %fr.in, %frow.in")
    A("  br i1 %fr.more, label %fin.body, label %fin.exit")
    A("fin.body:")
    A("  %fmp = getelementptr float, float* %mb0, i64 %fr")
    A("  %fm = load float, float* %fmp")
    A("  %flp = getelementptr float, float* %lb0, i64 %fr")
    A("  %fl = load float, float* %flp")
    A("  %fpos = fcmp ogt float %fl, 0.0")
    A("  %fdiv = select i1 %fpos, float %fl, float 1.0")
    # the true row max, and the mass rescaled to it from the reference
    A(f"  %fmvo = mul i64 %fr, {W}")
    L.extend(_vptr("%fmvp", "%mv0", "%fmvo"))
    A(f"  %fmv = load {V}, {V}* %fmvpv, align 64")
    A(f"  %fmxr = call nnan float @llvm.vector.reduce.fmax.v16f32({V} %fmv)")
    A("  %fmx = fmul float %fmxr, %scale")
    A("  %fdl.a = fsub float %fm, %fmx")
    A("  %fdl = select i1 %fpos, float %fdl.a, float 0.0")
    L.extend(_splat("%fdlv", "%fdl"))
    L.extend(_vexp("%fcorv", "%fdlv", "%fe"))
    A(f"  %fcor = extractelement {V} %fcorv, i32 0")
    A("  %fmass = fmul float %fl, %fcor")
    A("  %ftop = select i1 %fpos, float %fmx, float 0.0")
    L.extend(_splat("%fdv", "%fdiv"))
    A("  %ftm.a = mul i64 %h, %nq")
    A("  %ftm = add i64 %ftm.a, %frow")
    A("  %ftp = getelementptr float, float* %top, i64 %ftm")
    A("  store float %ftop, float* %ftp")
    A("  %fsp = getelementptr float, float* %mass, i64 %ftm")
    A("  store float %fmass, float* %fsp")
    A("  %fo.a = mul i64 %h, %ohs")
    A("  %fo.b = mul i64 %frow, %ors")
    A("  %fo = add i64 %fo.a, %fo.b")
    A(f"  %fso = mul i64 %fr, {D}")
    for c in range(C):
        A(f"  %fsi{c} = add i64 %fso, {c * W}")
        L.extend(_vptr(f"%fsp{c}", "%st0", f"%fsi{c}"))
        A(f"  %facc{c} = load {V}, {V}* %fsp{c}v, align 64")
        A(f"  %fres{c} = fdiv {V} %facc{c}, %fdv")
        A(f"  %foi{c} = add i64 %fo, {c * W}")
        L.extend(_vptr(f"%fop{c}", "%out", f"%foi{c}"))
        A(f"  store {V} %fres{c}, {V}* %fop{c}v, align 4")
    A("  %fr.next = add i64 %fr, 1")
    A("  br label %fin.head")
    A("fin.exit:")
    A("  %job.next = add i64 %job, 1")
    A("  br label %job.head")
    A("exit:")
    A("  ret void")
    A("}")
    return "\n".join(L) + "\n"
