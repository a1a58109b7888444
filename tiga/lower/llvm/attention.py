"""lower: LLVM micro-kernel of the float32 streaming attention forward.

Destination row i reads sources lo[i] <= j < hi[i], with lo and hi nondecreasing; the runtime
(`xla_free_runtime.llvm_attention`) packs head-major operands, computes per-group key ranges
and runs this kernel over (head, row block) jobs. Other dtypes, head widths, pruning and the
backward run as numpy tiles (`xla_free_runtime.attention_tiles`).
"""
from __future__ import annotations

import numpy as np

# ---- LLVM micro-kernel: float32 forward ------------------------------------------------
#
# `forward_ir(symbol, D)` is a kernel `void(i64 begin, i64 end, i8** argv)` over jobs
# (head, block of GB * RB query rows). For each key block of KB keys, each group of RB query
# rows reloads its running state (max, mass, unnormalised accumulator) from the output
# arrays, walks its keys KS = NV * 16 at a time and stores the state back, so the key block's
# packed K^T and V tiles stay in cache while GB row groups pass over them. Per KS keys: the
# scores are a loop over d (4 per trip) with RB x NV <16 x float> sums in registers (6 x 4:
# 24 accumulators, 4 K^T loads and 6 q broadcasts per 24 FMAs); the softmax update takes one
# max, one mass reduction and one rescale per row and step and a polynomial exp (exact 0 for
# -inf); P @ V is a loop over the KS keys with the RB x D/16 output vectors in registers.
# Rows whose range excludes a key mask it to -inf. argv: q (H, Npad, D) pre-scaled, kt
# (H, D, Kpad), v (H, Kpad, D), out (H, Npad, D), top/mass (H, Npad), lo/hi (Npad,),
# params [Npad, Kpad, Npad/RB, Npad/(RB*GB)], glo/ghi per row group (KS-aligned key range),
# blo/bhi per job. Measured (benchmarks/attention.py): 6 x 64 beat 4 x 16, 4 x 32, 4 x 64
# and 8 x 64 (spills).
W = 16       # float32 lanes
RB = 6       # query rows per register tile
GB = 8       # row groups per job (48 query rows)
KB = 256     # keys per key block
NV = 4       # <16 x float> score vectors per row and step: KS = NV * W keys per step
KS = NV * W
PV_UNROLL = 4   # keys per trip of the P @ V loop
V = "<16 x float>"



def _splat(name, scalar, ty="float"):
    return [f"  {name}.i = insertelement <16 x {ty}> undef, {ty} {scalar}, i32 0",
            f"  {name} = shufflevector <16 x {ty}> {name}.i, <16 x {ty}> undef, "
            "<16 x i32> zeroinitializer"]


def _fconst(x):
    import struct
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(np.float32(x))))[0]:016X}"


def _vconst(x):
    c = _fconst(x)
    return "<" + ", ".join(f"float {c}" for _ in range(W)) + ">"


def _fma(out, a, b, c):
    return f"  {out} = call {V} @llvm.fma.v16f32({V} {a}, {V} {b}, {V} {c})"


def _vptr(name, base, offset):
    """`{name}v`: a <16 x float>* at float index `offset` of `base`."""
    return [f"  {name} = getelementptr float, float* {base}, i64 {offset}",
            f"  {name}v = bitcast float* {name} to {V}*"]


def _vexp(out, x, tag):
    """out = exp(x) for <16 x float> x; x = -inf (or below -87) gives exactly 0."""
    L = []
    L.append(f"  {tag}.a = call {V} @llvm.maxnum.v16f32({V} {x}, {V} {_vconst(-87.0)})")
    L.append(f"  {tag}.b = call {V} @llvm.minnum.v16f32({V} {tag}.a, {V} {_vconst(88.0)})")
    L.append(f"  {tag}.t = fmul {V} {tag}.b, {_vconst(1.4426950408889634)}")
    L.append(f"  {tag}.n = call {V} @llvm.rint.v16f32({V} {tag}.t)")
    L.append(_fma(f"{tag}.r0", f"{tag}.n", _vconst(-0.693359375), f"{tag}.b"))
    L.append(_fma(f"{tag}.r", f"{tag}.n", _vconst(2.12194440e-4), f"{tag}.r0"))
    coefs = [1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0]
    prev = _vconst(coefs[0])
    for i, c in enumerate(coefs[1:]):
        L.append(_fma(f"{tag}.p{i}", prev, f"{tag}.r", _vconst(c)))
        prev = f"{tag}.p{i}"
    L.append(f"  {tag}.ni = fptosi {V} {tag}.n to <16 x i32>")
    L.append(f"  {tag}.nb = add <16 x i32> {tag}.ni, <" + ", ".join(["i32 127"] * W) + ">")
    L.append(f"  {tag}.ns = shl <16 x i32> {tag}.nb, <" + ", ".join(["i32 23"] * W) + ">")
    L.append(f"  {tag}.s = bitcast <16 x i32> {tag}.ns to {V}")
    L.append(f"  {tag}.v = fmul {V} {prev}, {tag}.s")
    L.append(f"  {tag}.lo = fcmp olt {V} {x}, {_vconst(-87.0)}")
    L.append(f"  {out} = select <16 x i1> {tag}.lo, {V} zeroinitializer, {V} {tag}.v")
    return L


def forward_ir(symbol: str, D: int) -> str:
    """LLVM IR of the float32 streaming forward for head width D (a multiple of 16)."""
    assert D % W == 0
    C = D // W
    NEG = "0xFFF0000000000000"
    L = []
    A = L.append
    A(f"declare {V} @llvm.maxnum.v16f32({V}, {V})")
    A(f"declare {V} @llvm.minnum.v16f32({V}, {V})")
    A(f"declare {V} @llvm.rint.v16f32({V})")
    A(f"declare {V} @llvm.fma.v16f32({V}, {V}, {V})")
    A(f"declare float @llvm.vector.reduce.fmax.v16f32({V})")
    A(f"declare float @llvm.vector.reduce.fadd.v16f32(float, {V})")
    A("declare float @llvm.maxnum.f32(float, float)")
    A("declare i64 @llvm.smax.i64(i64, i64)")
    A(f"define void @{symbol}(i64 %begin, i64 %end, i8** %argv) {{")
    A("entry:")
    # the step's probabilities, RB x KS: P @ V broadcasts them from here (as register values
    # the RB x NV vectors spill, and a variable lane extract copies the spilled vector first)
    A(f"  %pbuf = alloca [{RB * KS} x float], align 64")
    A(f"  %pbuf0 = getelementptr [{RB * KS} x float], [{RB * KS} x float]* %pbuf, i64 0, i64 0")
    names = ["q", "kt", "v", "out", "top", "mass", "lo", "hi", "prm", "glo", "ghi", "blo", "bhi"]
    for i, nm in enumerate(names):
        A(f"  %{nm}.pp = getelementptr i8*, i8** %argv, i64 {i}")
        A(f"  %{nm}.p = load i8*, i8** %{nm}.pp")
        ty = "i64" if nm in ("lo", "hi", "prm", "glo", "ghi", "blo", "bhi") else "float"
        A(f"  %{nm} = bitcast i8* %{nm}.p to {ty}*")
    for i, nm in enumerate(["npad", "kpad", "groups", "qblocks", "nq", "nk", "qhs", "qrs",
                            "vhs", "vrs", "scbits"]):
        A(f"  %{nm}.g = getelementptr i64, i64* %prm, i64 {i}")
        A(f"  %{nm} = load i64, i64* %{nm}.g")
    A("  %nq1 = sub i64 %nq, 1")
    A("  %nk1 = sub i64 %nk, 1")
    A("  %scbits.t = trunc i64 %scbits to i32")
    A("  %scale = bitcast i32 %scbits.t to float")
    L.extend(_splat("%scalev", "%scale"))
    A("  br label %job.head")
    A("job.head:")
    A("  %job = phi i64 [ %begin, %entry ], [ %job.next, %job.end ]")
    A("  %job.more = icmp slt i64 %job, %end")
    A("  br i1 %job.more, label %job.body, label %exit")
    A("job.body:")
    A("  %h = sdiv i64 %job, %qblocks")
    A("  %qb = srem i64 %job, %qblocks")
    A("  %blo.g = getelementptr i64, i64* %blo, i64 %job")
    A("  %bstart = load i64, i64* %blo.g")
    A("  %bhi.g = getelementptr i64, i64* %bhi, i64 %job")
    A("  %bend = load i64, i64* %bhi.g")
    A(f"  %g0 = mul i64 %qb, {GB}")
    A("  br label %kb.head")
    A("kb.head:")
    A("  %kb = phi i64 [ %bstart, %job.body ], [ %kb.next, %grp.exit ]")
    A("  %kb.more = icmp slt i64 %kb, %bend")
    A("  br i1 %kb.more, label %kb.body, label %job.end")
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
    A("  %gall = mul i64 %h, %groups")
    A("  %gidx = add i64 %gall, %g")
    A("  %glo.g = getelementptr i64, i64* %glo, i64 %g")
    A("  %glo.v = load i64, i64* %glo.g")
    A("  %ghi.g = getelementptr i64, i64* %ghi, i64 %g")
    A("  %ghi.v = load i64, i64* %ghi.g")
    A("  %kstart = call i64 @llvm.smax.i64(i64 %kb, i64 %glo.v)")
    A("  %kmax = call i64 @llvm.smin.i64(i64 %kbe, i64 %ghi.v)")
    A(f"  %r0 = mul i64 %g, {RB}")
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
    A("  %qh = mul i64 %h, %npad")
    for r in range(RB):
        A(f"  %qrow{r} = add i64 %qh, %row{r}")
        A(f"  %qoff{r} = mul i64 %qrow{r}, {D}")
        # q is read in place (head stride qhs, row stride qrs); padding rows read row nq - 1
        A(f"  %qrc{r} = call i64 @llvm.smin.i64(i64 %row{r}, i64 %nq1)")
        A(f"  %qsh{r} = mul i64 %h, %qhs")
        A(f"  %qsr{r} = mul i64 %qrc{r}, %qrs")
        A(f"  %qsrc{r} = add i64 %qsh{r}, %qsr{r}")
        A(f"  %tp{r} = getelementptr float, float* %top, i64 %qrow{r}")
        A(f"  %m{r}.in = load float, float* %tp{r}")
        A(f"  %mp{r} = getelementptr float, float* %mass, i64 %qrow{r}")
        A(f"  %l{r}.in = load float, float* %mp{r}")
        for c in range(C):
            A(f"  %yo{r}_{c} = add i64 %qoff{r}, {c * W}")
            L.extend(_vptr(f"%yp{r}_{c}", "%out", f"%yo{r}_{c}"))
            A(f"  %o{r}_{c}.in = load {V}, {V}* %yp{r}_{c}v, align 4")
    A(f"  %kth = mul i64 %h, {D}")
    A("  %vh = mul i64 %h, %vhs")
    A("  br label %k.head")
    A("k.head:")
    A("  %j = phi i64 [ %kstart, %grp.body ], [ %j.next, %pv.done ]")
    for r in range(RB):
        A(f"  %m{r} = phi float [ %m{r}.in, %grp.body ], [ %mn{r}, %pv.done ]")
        A(f"  %l{r} = phi float [ %l{r}.in, %grp.body ], [ %ln{r}, %pv.done ]")
        for c in range(C):
            A(f"  %o{r}_{c} = phi {V} [ %o{r}_{c}.in, %grp.body ], [ %on{r}_{c}, %pv.done ]")
    A("  %k.more = icmp slt i64 %j, %kmax")
    A("  br i1 %k.more, label %k.body, label %k.exit")
    A("k.body:")
    A("  %j32 = trunc i64 %j to i32")
    L.extend(_splat("%jv", "%j32", "i32"))
    for u in range(NV):
        A(f"  %lanes{u} = add <16 x i32> %jv, <"
          + ", ".join(f"i32 {u * W + t}" for t in range(W)) + ">")
    A("  br label %qk.loop")
    # ---- scores: a loop over d (4 per trip), RB x NV (x 2 partial sums when NV = 1) in phis
    P = 2 if NV == 1 else 1
    acc_ids = [(r, u, p) for r in range(RB) for u in range(NV) for p in range(P)]
    A("qk.loop:")
    A("  %d = phi i64 [ 0, %k.body ], [ %d.next, %qk.loop ]")
    for r, u, p in acc_ids:
        A(f"  %pa{r}_{u}_{p} = phi {V} [ zeroinitializer, %k.body ], "
          f"[ %pn{r}_{u}_{p}, %qk.loop ]")
    cur = {i: "%pa{}_{}_{}".format(*i) for i in acc_ids}
    for dd in range(4):
        A(f"  %dd{dd} = add i64 %d, {dd}")
        A(f"  %ktrow{dd} = add i64 %kth, %dd{dd}")
        A(f"  %ktoff{dd}.a = mul i64 %ktrow{dd}, %kpad")
        A(f"  %ktoff{dd} = add i64 %ktoff{dd}.a, %j")
        for u in range(NV):
            A(f"  %ktoff{dd}_{u} = add i64 %ktoff{dd}, {u * W}")
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
            raw = f"%pn{r}_{u}_0"
            if P == 2:
                A(f"  %spr{r}_{u} = fadd {V} %pn{r}_{u}_0, %pn{r}_{u}_1")
                raw = f"%spr{r}_{u}"
            A(f"  %sp{r}_{u} = fmul {V} {raw}, %scalev")
    A(f"  %in.a = icmp sge i64 %j, {mlo}")
    A("  %in.b = icmp sle i64 %j, %inhi")
    A("  %inner = and i1 %in.a, %in.b")
    A("  br i1 %inner, label %qk.done, label %qk.mask")
    A("qk.mask:")
    for r in range(RB):
        for u in range(NV):
            sp = f"%sp{r}_{u}"
            A(f"  %okl{r}_{u} = icmp sge <16 x i32> %lanes{u}, %lov{r}")
            A(f"  %okh{r}_{u} = icmp slt <16 x i32> %lanes{u}, %hiv{r}")
            A(f"  %ok{r}_{u} = and <16 x i1> %okl{r}_{u}, %okh{r}_{u}")
            A(f"  %Sx{r}_{u} = select <16 x i1> %ok{r}_{u}, {V} {sp}, {V} "
              + "<" + ", ".join([f"float {NEG}"] * W) + ">")
    A("  br label %qk.done")
    A("qk.done:")
    for r in range(RB):
        for u in range(NV):
            sp = f"%sp{r}_{u}"
            A(f"  %S{r}_{u} = phi {V} [ {sp}, %qk.exit ], [ %Sx{r}_{u}, %qk.mask ]")
    for r in range(RB):
        top_v = f"%S{r}_0"
        for u in range(1, NV):
            A(f"  %Sm{r}_{u} = call {V} @llvm.maxnum.v16f32({V} {top_v}, {V} %S{r}_{u})")
            top_v = f"%Sm{r}_{u}"
        A(f"  %mx{r} = call nnan float @llvm.vector.reduce.fmax.v16f32({V} {top_v})")
        A(f"  %mn{r} = call float @llvm.maxnum.f32(float %m{r}, float %mx{r})")
        A(f"  %isinf{r} = fcmp oeq float %mn{r}, {NEG}")
        A(f"  %ms{r} = select i1 %isinf{r}, float 0.0, float %mn{r}")
        L.extend(_splat(f"%msv{r}", f"%ms{r}"))
        for u in range(NV):
            A(f"  %sd{r}_{u} = fsub {V} %S{r}_{u}, %msv{r}")
            L.extend(_vexp(f"%P{r}_{u}", f"%sd{r}_{u}", f"%e{r}_{u}"))
            L.extend(_vptr(f"%pst{r}_{u}", "%pbuf0", r * KS + u * W))
            A(f"  store {V} %P{r}_{u}, {V}* %pst{r}_{u}v, align 64")
        A(f"  %ad{r} = fsub float %m{r}, %ms{r}")
        prev_ad = "zeroinitializer" if r == 0 else f"%adv{r - 1}"
        A(f"  %adv{r} = insertelement {V} {prev_ad}, float %ad{r}, i32 {r}")
    # the rows' rescale factors exp(m_old - m_new) in one vector exp (unused lanes: exp(0))
    L.extend(_vexp("%alpha", f"%adv{RB - 1}", "%ea"))
    for r in range(RB):
        A(f"  %al{r} = extractelement {V} %alpha, i32 {r}")
        L.extend(_splat(f"%alv{r}", f"%al{r}"))
        tot = f"%P{r}_0"
        for u in range(1, NV):
            A(f"  %Ps{r}_{u} = fadd {V} {tot}, %P{r}_{u}")
            tot = f"%Ps{r}_{u}"
        A(f"  %ps{r} = call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V} {tot})")
        A(f"  %lsc{r} = fmul float %l{r}, %al{r}")
        A(f"  %ln{r} = fadd float %lsc{r}, %ps{r}")
        for c in range(C):
            A(f"  %oa{r}_{c} = fmul {V} %o{r}_{c}, %alv{r}")
    A("  br label %pv.loop")
    # ---- P @ V: a loop over the KS keys (2 x NV per trip), the output rows in phis
    A("pv.loop:")
    A("  %t = phi i32 [ 0, %qk.done ], [ %t.next, %pv.loop ]")
    for r in range(RB):
        for c in range(C):
            A(f"  %ov{r}_{c} = phi {V} [ %oa{r}_{c}, %qk.done ], [ %on{r}_{c}, %pv.loop ]")
    cur = {(r, c): f"%ov{r}_{c}" for r in range(RB) for c in range(C)}
    A("  %t64 = zext i32 %t to i64")
    steps = [(0, tt) for tt in range(PV_UNROLL)]
    for i, (u, tt) in enumerate(steps):
        x = f"{u}_{tt}"
        A(f"  %tt{x}.w = add i64 %t64, {tt}")
        # V is read in place; keys past the last (masked, p = 0) read key nk - 1
        A(f"  %vkey{x}.a = add i64 %j, %tt{x}.w")
        A(f"  %vkey{x} = call i64 @llvm.smin.i64(i64 %vkey{x}.a, i64 %nk1)")
        A(f"  %vrow{x} = mul i64 %vkey{x}, %vrs")
        A(f"  %voff{x} = add i64 %vrow{x}, %vh")
        for c in range(C):
            A(f"  %vo{x}_{c} = add i64 %voff{x}, {c * W}")
            L.extend(_vptr(f"%vp{x}_{c}", "%v", f"%vo{x}_{c}"))
            A(f"  %V{x}_{c} = load {V}, {V}* %vp{x}_{c}v, align 4")
        for r in range(RB):
            A(f"  %pi{r}_{x} = add i64 %tt{x}.w, {r * KS}")
            A(f"  %pg{r}_{x} = getelementptr float, float* %pbuf0, i64 %pi{r}_{x}")
            A(f"  %pe{r}_{x} = load float, float* %pg{r}_{x}")
            L.extend(_splat(f"%pb{r}_{x}", f"%pe{r}_{x}"))
            for c in range(C):
                nm = f"%on{r}_{c}" if i == len(steps) - 1 else f"%om{r}_{c}_{x}"
                A(_fma(nm, f"%pb{r}_{x}", f"%V{x}_{c}", cur[(r, c)]))
                cur[(r, c)] = nm
    A(f"  %t.next = add i32 %t, {PV_UNROLL}")
    A(f"  %t.more = icmp slt i32 %t.next, {KS}")
    A("  br i1 %t.more, label %pv.loop, label %pv.done")
    A("pv.done:")
    A(f"  %j.next = add i64 %j, {KS}")
    A("  br label %k.head")
    A("k.exit:")
    for r in range(RB):
        A(f"  store float %m{r}, float* %tp{r}")
        A(f"  store float %l{r}, float* %mp{r}")
        for c in range(C):
            A(f"  store {V} %o{r}_{c}, {V}* %yp{r}_{c}v, align 4")
    A("  br label %grp.end")
    A("grp.end:")
    A("  %gi.next = add i64 %gi, 1")
    A("  br label %grp.head")
    A("job.end:")
    A("  %job.next = add i64 %job, 1")
    A("  br label %job.head")
    A("exit:")
    A("  ret void")
    A("}")
    A("declare i64 @llvm.smin.i64(i64, i64)")
    return "\n".join(L) + "\n"
