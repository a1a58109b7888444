"""lower: LLVM micro-kernel of the float32 attention backward (FlashAttention-2 style).

`backward_ir(symbol, D)` is a kernel `void(i64 begin, i64 end, i8** argv)` over jobs: a head
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
nothing is accessed past an output's end.
"""
from __future__ import annotations

from .attention import W, _fma, _in_range, _key_lanes, _splat, _vexp, _vptr

V = "<16 x float>"
PARAMS = ("n", "nk", "kblocks", "qhs", "qrs", "khs", "krs", "vhs", "vrs", "dhs", "drs",
          "scbits", "lhs", "lrs", "ehs", "ers", "gqhs", "gqrs", "gkhs", "gkrs", "gvhs", "gvrs",
          "want")
RB = 6        # query rows per register group
BR = 48       # query rows per tile (RB groups)
KB = 64       # keys per key block
KR = 4        # keys per register group of the dk / dv products
NK = KB // W  # <16 x float> vectors per row of a score tile


class _Emitter:
    def __init__(self):
        self.lines = []
        self.n = 0

    def __call__(self, line):
        self.lines.append(line)

    def extend(self, lines):
        self.lines.extend(lines)

    def fresh(self, stem):
        self.n += 1
        return f"{stem}.{self.n}"


def _fma_loop(E, tag, pre, acc_in, trip, unroll, x_ptr, y_ptr):
    """acc[(a, c)] += x(a, t) * y(t, c) for t in [0, trip) (trip: an SSA i64 or constant, a
    positive multiple of `unroll`). x_ptr(t) -> {a: float* SSA}, y_ptr(t) -> {c: vector* SSA}
    emit their address arithmetic. Returns the accumulators after the loop (valid in
    `{tag}.exit`, where emission continues)."""
    keys = list(acc_in)
    E(f"  br label %{tag}.loop")
    E(f"{tag}.loop:")
    E(f"  %{tag}.t = phi i64 [ 0, %{pre} ], [ %{tag}.tn, %{tag}.loop ]")
    names = {key: f"%{tag}.a{key[0]}_{key[1]}" for key in keys}
    for key in keys:
        E(f"  {names[key]} = phi {V} [ {acc_in[key]}, %{pre} ], "
          f"[ %{tag}.o{key[0]}_{key[1]}, %{tag}.loop ]")
    cur = dict(names)
    rows = sorted({a for a, _ in keys})
    cols = sorted({c for _, c in keys})
    for u in range(unroll):
        t = f"%{tag}.t{u}"
        E(f"  {t} = add i64 %{tag}.t, {u}")
        yp = y_ptr(t)
        ys = {}
        for c in cols:
            ys[c] = f"%{tag}.y{u}_{c}"
            E(f"  {ys[c]} = load {V}, {V}* {yp[c]}, align 4")
        xp = x_ptr(t)
        for a in rows:
            xs = f"%{tag}.x{u}_{a}"
            E(f"  {xs} = load float, float* {xp[a]}")
            E.extend(_splat(f"{xs}v", xs))
            for c in cols:
                last = u == unroll - 1
                nm = f"%{tag}.o{a}_{c}" if last else f"%{tag}.m{u}_{a}_{c}"
                E(_fma(nm, f"{xs}v", ys[c], cur[(a, c)]))
                cur[(a, c)] = nm
    E(f"  %{tag}.tn = add i64 %{tag}.t, {unroll}")
    E(f"  %{tag}.more = icmp slt i64 %{tag}.tn, {trip}")
    E(f"  br i1 %{tag}.more, label %{tag}.loop, label %{tag}.exit")
    E(f"{tag}.exit:")
    return cur


def _transpose16(rows, tag):
    """IR lines and the names of the transpose of 16 <16 x float> values: four rounds of
    swapping the off-diagonal b x b blocks of every 2b x 2b block."""
    L = []
    a = list(rows)
    for b in (8, 4, 2, 1):
        na = list(a)
        for i in range(W):
            if i & b:
                continue
            lo = [k if not k & b else W + k - b for k in range(W)]
            hi = [k + b if not k & b else W + k for k in range(W)]
            for nm, mask, slot in ((f"{tag}x{b}_{i}", lo, i), (f"{tag}y{b}_{i}", hi, i + b)):
                L.append(f"  {nm} = shufflevector {V} {a[i]}, {V} {a[i + b]}, <16 x i32> <"
                         + ", ".join(f"i32 {m}" for m in mask) + ">")
                na[slot] = nm
        a = na
    return L, a


def _gep(E, name, base, offset, ty="float"):
    E(f"  {name} = getelementptr {ty}, {ty}* {base}, i64 {offset}")
    return name


def _vgep(E, name, base, offset):
    E.extend(_vptr(name, base, offset))
    return f"{name}v"


def backward_ir(symbol: str, D: int) -> str:
    """LLVM IR of the float32 attention backward for head width D (a multiple of 16)."""
    assert D % W == 0
    C = D // W
    chunks = [list(range(c, min(c + 4, C))) for c in range(0, C, 4)]
    E = _Emitter()
    E(f"declare {V} @llvm.maxnum.v16f32({V}, {V})")
    E(f"declare {V} @llvm.minnum.v16f32({V}, {V})")
    E(f"declare {V} @llvm.rint.v16f32({V})")
    E(f"declare {V} @llvm.fma.v16f32({V}, {V}, {V})")
    E("declare i64 @llvm.smax.i64(i64, i64)")
    E("declare i64 @llvm.smin.i64(i64, i64)")
    E(f"define void @{symbol}(i64 %begin, i64 %end, i8** %argv) {{")
    E("entry:")
    for nm, size in (("ktb", D * KB), ("vtb", D * KB), ("kbb", KB * D), ("pbuf", BR * KB),
                     ("dsbuf", BR * KB), ("qtile", BR * D), ("dotile", BR * D),
                     ("dkacc", KB * D), ("dvacc", KB * D)):
        E(f"  %{nm}.a = alloca [{size} x float], align 64")
        E(f"  %{nm} = getelementptr [{size} x float], [{size} x float]* %{nm}.a, i64 0, i64 0")
    # padding rows and keys (past n, nk) add their zeros into this row instead of the outputs
    E(f"  %dummy.a = alloca [{D} x float], align 64")
    E(f"  %dummy = getelementptr [{D} x float], [{D} x float]* %dummy.a, i64 0, i64 0")
    for c in range(C):
        p = _vgep(E, f"%dz{c}", "%dummy", c * W)
        E(f"  store {V} zeroinitializer, {V}* {p}, align 4")
    names = ["q", "k", "v", "do", "lse", "delta", "dq", "dk", "dv", "lo", "hi", "prm",
             "rbeg", "rend", "jobs"]
    ints = ("lo", "hi", "prm", "rbeg", "rend", "jobs")
    for i, nm in enumerate(names):
        E(f"  %{nm}.pp = getelementptr i8*, i8** %argv, i64 {i}")
        E(f"  %{nm}.p = load i8*, i8** %{nm}.pp")
        E(f"  %{nm} = bitcast i8* %{nm}.p to {'i64' if nm in ints else 'float'}*")
    for i, nm in enumerate(PARAMS):
        E(f"  %{nm}.g = getelementptr i64, i64* %prm, i64 {i}")
        E(f"  %{nm} = load i64, i64* %{nm}.g")
    E("  %n1 = sub i64 %n, 1")
    E("  %nk1 = sub i64 %nk, 1")
    E("  %scbits.t = trunc i64 %scbits to i32")
    E("  %scale = bitcast i32 %scbits.t to float")
    # want: 1 = dq, 2 = dk and dv (a VJP that needs only some of them skips the others)
    E("  %want.q = and i64 %want, 1")
    E("  %wantdq = icmp ne i64 %want.q, 0")
    E("  %want.kv = and i64 %want, 2")
    E("  %wantkv = icmp ne i64 %want.kv, 0")
    E.extend(_splat("%scalev", "%scale"))
    E("  br label %job.head")
    E("job.head:")
    E("  %job = phi i64 [ %begin, %entry ], [ %job.next, %kb.exit ]")
    E("  %job.more = icmp slt i64 %job, %end")
    E("  br i1 %job.more, label %job.body, label %exit")
    E("job.body:")
    # a job: (head, first key block, end key block, element offset of its dq)
    for i, nm in enumerate(("h", "kbfirst", "kblast", "dqoff")):
        E(f"  %{nm}.i = mul i64 %job, 4")
        E(f"  %{nm}.j = add i64 %{nm}.i, {i}")
        E(f"  %{nm}.g = getelementptr i64, i64* %jobs, i64 %{nm}.j")
        E(f"  %{nm} = load i64, i64* %{nm}.g")
    for x in ("q", "k", "v", "d"):
        E(f"  %{x}base = mul i64 %h, %{x}hs")
    for x in ("l", "e", "gk", "gv"):
        E(f"  %{x}base = mul i64 %h, %{x}hs")
    E("  %gqbase.h = mul i64 %h, %gqhs")
    E("  %gqbase = add i64 %gqbase.h, %dqoff")
    E("  br label %kb.head")
    # ---- key blocks --------------------------------------------------------------------
    E("kb.head:")
    E("  %kb = phi i64 [ %kbfirst, %job.body ], [ %kb.next, %wb.head ]")
    E("  %kb.more = icmp slt i64 %kb, %kblast")
    E("  br i1 %kb.more, label %kb.body, label %kb.exit")
    E("kb.exit:")
    E("  %job.next = add i64 %job, 1")
    E("  br label %job.head")
    E("kb.body:")
    E(f"  %j0 = mul i64 %kb, {KB}")
    E("  %rb.g = getelementptr i64, i64* %rbeg, i64 %kb")
    E("  %r0 = load i64, i64* %rb.g")
    E("  %re.g = getelementptr i64, i64* %rend, i64 %kb")
    E("  %r1 = load i64, i64* %re.g")
    E("  %j032 = trunc i64 %j0 to i32")
    E.extend(_splat("%j0v", "%j032", "i32"))
    E.extend(_key_lanes("%j0v", NK))
    E("  %jend = add i64 %j0, " + str(KB))
    E("  br label %pack.head")
    # pack the key block: K^T, V^T (D x KB) and K (KB x D), keys past nk zero; 16 keys at a
    # time, each 16 x 16 block transposed in registers
    E("pack.head:")
    E("  %jg = phi i64 [ 0, %kb.body ], [ %jg.next, %pack.head ]")
    E(f"  %jg0 = mul i64 %jg, {W}")
    for t in range(W):
        E(f"  %jj{t} = add i64 %jg0, {t}")
        E(f"  %key{t} = add i64 %j0, %jj{t}")
        E(f"  %kvalid{t} = icmp slt i64 %key{t}, %nk")
        E(f"  %keyc{t} = call i64 @llvm.smin.i64(i64 %key{t}, i64 %nk1)")
        E(f"  %kbrow{t} = mul i64 %jj{t}, {D}")
        for src in ("k", "v"):
            E(f"  %{src}row{t}.a = mul i64 %keyc{t}, %{src}rs")
            E(f"  %{src}row{t} = add i64 %{src}row{t}.a, %{src}base")
        for c in range(C):
            E(f"  %zo{t}_{c} = add i64 %kbrow{t}, {c * W}")
            for acc in ("dkacc", "dvacc"):
                p = _vgep(E, f"%z{acc}{t}_{c}", f"%{acc}", f"%zo{t}_{c}")
                E(f"  store {V} zeroinitializer, {V}* {p}, align 64")
    for c in range(C):
        for src, tgt in (("k", "ktb"), ("v", "vtb")):
            rows = []
            for t in range(W):
                x = f"%pk{src}{c}_{t}"
                E(f"  {x}.o = add i64 %{src}row{t}, {c * W}")
                p = _vgep(E, f"{x}.p", f"%{src}", f"{x}.o")
                E(f"  {x}.l = load {V}, {V}* {p}, align 4")
                E(f"  {x} = select i1 %kvalid{t}, {V} {x}.l, {V} zeroinitializer")
                rows.append(x)
                if src == "k":
                    E(f"  {x}.bo = add i64 %kbrow{t}, {c * W}")
                    p = _vgep(E, f"{x}.b", "%kbb", f"{x}.bo")
                    E(f"  store {V} {x}, {V}* {p}, align 64")
            lines, cols = _transpose16(rows, f"%tr{src}{c}_")
            E.extend(lines)
            for i, col in enumerate(cols):
                E(f"  %pt{src}{c}_{i}.o = add i64 %jg0, {(c * W + i) * KB}")
                p = _vgep(E, f"%pt{src}{c}_{i}", f"%{tgt}", f"%pt{src}{c}_{i}.o")
                E(f"  store {V} {col}, {V}* {p}, align 64")
    E("  %jg.next = add i64 %jg, 1")
    E(f"  %jg.more = icmp slt i64 %jg.next, {KB // W}")
    E("  br i1 %jg.more, label %pack.head, label %tile.head")
    # ---- tiles of BR query rows ------------------------------------------------------------
    E("tile.head:")
    E("  %i0 = phi i64 [ %r0, %pack.head ], [ %i0.next, %dk.done ]")
    E("  %tile.more = icmp slt i64 %i0, %r1")
    E("  br i1 %tile.more, label %tile.body, label %tile.exit")
    # the key block's dk, dv rows (accumulated on the stack) to the outputs, keys < nk
    E("tile.exit:")
    E("  %wleft = sub i64 %nk, %j0")
    E(f"  %wn = call i64 @llvm.smin.i64(i64 %wleft, i64 {KB})")
    E("  br label %wb.body")
    E("wb.body:")
    E("  %wj = phi i64 [ 0, %tile.exit ], [ %wj.next, %wb.body ]")
    E("  %wkey = add i64 %j0, %wj")
    E(f"  %wsrc = mul i64 %wj, {D}")
    for which in ("k", "v"):
        E(f"  %w{which}r = mul i64 %wkey, %g{which}rs")
        E(f"  %w{which}b = add i64 %w{which}r, %g{which}base")
        for c in range(C):
            E(f"  %w{which}s{c}.o = add i64 %wsrc, {c * W}")
            p = _vgep(E, f"%w{which}s{c}", f"%d{which}acc", f"%w{which}s{c}.o")
            E(f"  %w{which}x{c} = load {V}, {V}* {p}, align 64")
            E(f"  %w{which}d{c}.o = add i64 %w{which}b, {c * W}")
            p = _vgep(E, f"%w{which}d{c}", f"%d{which}", f"%w{which}d{c}.o")
            E(f"  store {V} %w{which}x{c}, {V}* {p}, align 4")
    E("  %wj.next = add i64 %wj, 1")
    E("  %wj.more = icmp slt i64 %wj.next, %wn")
    E("  br i1 %wj.more, label %wb.body, label %wb.head")
    E("wb.head:")
    E("  %kb.next = add i64 %kb, 1")
    E("  br label %kb.head")
    E("tile.body:")
    E("  %left = sub i64 %r1, %i0")
    E(f"  %left.c = call i64 @llvm.smin.i64(i64 %left, i64 {BR})")
    # rows of the tile that groups cover: a whole number of groups
    E(f"  %left.g = add i64 %left.c, {RB - 1}")
    E(f"  %ngroups = udiv i64 %left.g, {RB}")
    E(f"  %trows = mul i64 %ngroups, {RB}")
    # the tile's q and dO rows copied to the stack: rows of a (N, H, D) field lie H * D
    # apart (4 KiB at H = 16, D = 64), and walking them conflicts in the L1 cache's sets
    E("  br label %cp.head")
    E("cp.head:")
    E("  %ct = phi i64 [ 0, %tile.body ], [ %ct.next, %cp.head ]")
    E("  %ct.row = add i64 %i0, %ct")
    E("  %ct.rowc = call i64 @llvm.smin.i64(i64 %ct.row, i64 %n1)")
    E(f"  %ct.dst = mul i64 %ct, {D}")
    for src, arr, buf in (("q", "q", "qtile"), ("d", "do", "dotile")):
        E(f"  %ct.{src}r = mul i64 %ct.rowc, %{src}rs")
        E(f"  %ct.{src}b = add i64 %ct.{src}r, %{src}base")
        for c in range(C):
            E(f"  %ct.{src}o{c} = add i64 %ct.{src}b, {c * W}")
            p = _vgep(E, f"%ct.{src}p{c}", f"%{arr}", f"%ct.{src}o{c}")
            E(f"  %ct.{src}v{c} = load {V}, {V}* {p}, align 4")
            E(f"  %ct.{src}d{c} = add i64 %ct.dst, {c * W}")
            p = _vgep(E, f"%ct.{src}q{c}", f"%{buf}", f"%ct.{src}d{c}")
            E(f"  store {V} %ct.{src}v{c}, {V}* {p}, align 64")
    E("  %ct.next = add i64 %ct, 1")
    E("  %ct.more = icmp slt i64 %ct.next, %trows")
    E("  br i1 %ct.more, label %cp.head, label %grp.head")
    E("grp.head:")
    E("  %g = phi i64 [ 0, %cp.head ], [ %g.next, %grp.next ]")
    E("  %g.more = icmp slt i64 %g, %ngroups")
    E("  br i1 %g.more, label %grp.body, label %grp.exit")
    E("grp.body:")
    E(f"  %gr = mul i64 %g, {RB}")
    E("  %grow = add i64 %i0, %gr")
    for r in range(RB):
        E(f"  %row{r} = add i64 %grow, {r}")
        E(f"  %tr{r} = add i64 %gr, {r}")
        E(f"  %rowc{r} = call i64 @llvm.smin.i64(i64 %row{r}, i64 %n1)")
        E(f"  %valid{r} = icmp slt i64 %row{r}, %n")
        E(f"  %lo{r}.g = getelementptr i64, i64* %lo, i64 %rowc{r}")
        E(f"  %lo{r} = load i64, i64* %lo{r}.g")
        E(f"  %hi{r}.g = getelementptr i64, i64* %hi, i64 %rowc{r}")
        E(f"  %hi{r}.l = load i64, i64* %hi{r}.g")
        E(f"  %hi{r} = select i1 %valid{r}, i64 %hi{r}.l, i64 0")
        E(f"  %lo{r}.t = trunc i64 %lo{r} to i32")
        E(f"  %hi{r}.t = trunc i64 %hi{r} to i32")
        E.extend(_splat(f"%lov{r}", f"%lo{r}.t", "i32"))
        E.extend(_splat(f"%hiv{r}", f"%hi{r}.t", "i32"))
        E(f"  %qr{r} = mul i64 %tr{r}, {D}")     # the row in qtile and dotile
        E(f"  %dr{r} = mul i64 %tr{r}, {D}")
        E(f"  %st{r}.a = mul i64 %rowc{r}, %lrs")
        E(f"  %st{r} = add i64 %st{r}.a, %lbase")
        E(f"  %se{r}.a = mul i64 %rowc{r}, %ers")
        E(f"  %se{r} = add i64 %se{r}.a, %ebase")
        _gep(E, f"%lse{r}.g", "%lse", f"%st{r}")
        E(f"  %lse{r} = load float, float* %lse{r}.g")
        E(f"  %nlse{r} = fneg float %lse{r}")
        E.extend(_splat(f"%nlsev{r}", f"%nlse{r}"))
        _gep(E, f"%dl{r}.g", "%delta", f"%se{r}")
        E(f"  %dl{r} = load float, float* %dl{r}.g")
        E.extend(_splat(f"%dlv{r}", f"%dl{r}"))
    mlo, mhi = "%lo0", "%hi0"
    for r in range(1, RB):
        E(f"  %mlo{r} = call i64 @llvm.smax.i64(i64 {mlo}, i64 %lo{r})")
        E(f"  %mhi{r} = call i64 @llvm.smin.i64(i64 {mhi}, i64 %hi{r})")
        mlo, mhi = f"%mlo{r}", f"%mhi{r}"
    E(f"  %in.a = icmp sge i64 %j0, {mlo}")
    E(f"  %in.b = icmp sle i64 %jend, {mhi}")
    E("  %inner = and i1 %in.a, %in.b")
    zero = {(r, u): "zeroinitializer" for r in range(RB) for u in range(NK)}

    def row_scalars(base_name, array):
        def f(t):
            out = {}
            for r in range(RB):
                E(f"  {t}.{base_name}o{r} = add i64 %{base_name}r{r}, {t}")
                out[r] = _gep(E, f"{t}.{base_name}g{r}", f"%{array}",
                              f"{t}.{base_name}o{r}")
            return out
        return f

    def key_rows(buf):
        # row t of a D x KB packed block: the NK vectors of keys
        def f(t):
            E(f"  {t}.{buf}r = mul i64 {t}, {KB}")
            out = {}
            for u in range(NK):
                E(f"  {t}.{buf}o{u} = add i64 {t}.{buf}r, {u * W}")
                out[u] = _vgep(E, f"{t}.{buf}p{u}", f"%{buf}", f"{t}.{buf}o{u}")
            return out
        return f

    # S = Q K^T -> P
    s = _fma_loop(E, "qk", "grp.body", zero, D, 4, row_scalars("q", "qtile"), key_rows("ktb"))
    for r in range(RB):
        for u in range(NK):
            E(_fma(f"%sx{r}_{u}", s[(r, u)], "%scalev", f"%nlsev{r}"))
            E.extend(_vexp(f"%pe{r}_{u}", f"%sx{r}_{u}", f"%ex{r}_{u}"))
            E.extend(_in_range(f"%ok{r}_{u}.m", r, u))
            E(f"  %ok{r}_{u} = select i1 %inner, <16 x i1> <"
              + ", ".join(["i1 true"] * W) + f">, <16 x i1> %ok{r}_{u}.m")
            E(f"  %P{r}_{u} = select <16 x i1> %ok{r}_{u}, {V} %pe{r}_{u}, {V} zeroinitializer")
            E(f"  %pbo{r}_{u}.a = mul i64 %tr{r}, {KB}")
            E(f"  %pbo{r}_{u} = add i64 %pbo{r}_{u}.a, {u * W}")
            p = _vgep(E, f"%pbp{r}_{u}", "%pbuf", f"%pbo{r}_{u}")
            E(f"  store {V} %P{r}_{u}, {V}* {p}, align 4")
    # dP = dO V^T -> dS = P (dP - delta) scale
    dp = _fma_loop(E, "dv", "qk.exit", zero, D, 4, row_scalars("d", "dotile"), key_rows("vtb"))
    for r in range(RB):
        for u in range(NK):
            E(f"  %dd{r}_{u} = fsub {V} {dp[(r, u)]}, %dlv{r}")
            # P reloaded from pbuf: kept in registers across the dP loop, the 24 P and 24
            # dP vectors exceed the 32 registers and the loop spills
            E(f"  %Pl{r}_{u} = load {V}, {V}* %pbp{r}_{u}v, align 4")
            E(f"  %dsa{r}_{u} = fmul {V} %Pl{r}_{u}, %dd{r}_{u}")
            E(f"  %ds{r}_{u} = fmul {V} %dsa{r}_{u}, %scalev")
            p = _vgep(E, f"%dsp{r}_{u}", "%dsbuf", f"%pbo{r}_{u}")
            E(f"  store {V} %ds{r}_{u}, {V}* {p}, align 4")
    # dq[rows] += dS K, D in chunks of up to 4 vectors
    E("  br i1 %wantdq, label %dq.go, label %grp.next")
    E("dq.go:")
    pre = "dq.go"
    for ci, cols in enumerate(chunks):
        acc = {}
        ptrs = {}
        for r in range(RB):
            E(f"  %dqr{ci}_{r}.a = mul i64 %rowc{r}, %gqrs")
            E(f"  %dqr{ci}_{r}.b = add i64 %dqr{ci}_{r}.a, %gqbase")
            _gep(E, f"%dqr{ci}_{r}.p", "%dq", f"%dqr{ci}_{r}.b")
            E(f"  %dqr{ci}_{r} = select i1 %valid{r}, float* %dqr{ci}_{r}.p, float* %dummy")
            for c in cols:
                ptrs[(r, c)] = _vgep(E, f"%dqp{r}_{c}", f"%dqr{ci}_{r}", c * W)
                E(f"  %dqi{r}_{c} = load {V}, {V}* {ptrs[(r, c)]}, align 4")
                acc[(r, c)] = f"%dqi{r}_{c}"

        def ds_scalars(t):
            out = {}
            for r in range(RB):
                E(f"  {t}.sb{r} = mul i64 %tr{r}, {KB}")
                E(f"  {t}.so{r} = add i64 {t}.sb{r}, {t}")
                out[r] = _gep(E, f"{t}.sg{r}", "%dsbuf", f"{t}.so{r}")
            return out

        def k_rows(t, cols=cols):
            E(f"  {t}.kr = mul i64 {t}, {D}")
            out = {}
            for c in cols:
                E(f"  {t}.ko{c} = add i64 {t}.kr, {c * W}")
                out[c] = _vgep(E, f"{t}.kp{c}", "%kbb", f"{t}.ko{c}")
            return out

        tag = f"dq{ci}"
        res = _fma_loop(E, tag, pre, acc, KB, 4, ds_scalars, k_rows)
        for key, val in res.items():
            E(f"  store {V} {val}, {V}* {ptrs[key]}, align 4")
        pre = f"{tag}.exit"
    E("  br label %grp.next")
    E("grp.next:")
    E("  %g.next = add i64 %g, 1")
    E("  br label %grp.head")
    # ---- dv += P^T dO, dk += dS^T Q over the tile's rows, KR keys x D per register tile
    E("grp.exit:")
    E("  br i1 %wantkv, label %kg.head, label %dk.done")
    E("kg.head:")
    E(f"  %kg = phi i64 [ 0, %grp.exit ], [ %kg.next, %kgd.exit{len(chunks) - 1} ]")
    E(f"  %kg.more = icmp slt i64 %kg, {KB // KR}")
    E("  br i1 %kg.more, label %kg.body, label %dk.done")
    E("kg.body:")
    E(f"  %kj = mul i64 %kg, {KR}")
    pre = "kg.body"
    for ci, cols in enumerate(chunks):
        for which, buf, arr in (("v", "pbuf", "dotile"), ("k", "dsbuf", "qtile")):
            out = f"%d{which}acc"
            acc, ptrs = {}, {}
            for a in range(KR):
                o = f"%acc{which}{ci}_{a}"
                E(f"  {o}.k = add i64 %kj, {a}")
                E(f"  {o}.b = mul i64 {o}.k, {D}")
                _gep(E, o, out, f"{o}.b")
                for c in cols:
                    x = f"{which}{a}_{c}"
                    ptrs[(a, c)] = _vgep(E, f"%op{x}", o, c * W)
                    E(f"  %oi{x} = load {V}, {V}* {ptrs[(a, c)]}, align 4")
                    acc[(a, c)] = f"%oi{x}"

            def p_scalars(t, buf=buf, which=which):
                E(f"  {t}.pr = mul i64 {t}, {KB}")
                E(f"  {t}.pk = add i64 {t}.pr, %kj")
                out = {}
                for a in range(KR):
                    E(f"  {t}.po{a} = add i64 {t}.pk, {a}")
                    out[a] = _gep(E, f"{t}.pg{a}", f"%{buf}", f"{t}.po{a}")
                return out

            def src_rows(t, arr=arr, cols=cols):
                E(f"  {t}.rb = mul i64 {t}, {D}")
                out = {}
                for c in cols:
                    E(f"  {t}.so{c} = add i64 {t}.rb, {c * W}")
                    out[c] = _vgep(E, f"{t}.sp{c}", f"%{arr}", f"{t}.so{c}")
                return out

            tag = f"kg{which}{ci}"
            res = _fma_loop(E, tag, pre, acc, "%trows", 2, p_scalars, src_rows)
            for key, val in res.items():
                E(f"  store {V} {val}, {V}* {ptrs[key]}, align 4")
            pre = f"{tag}.exit"
        E(f"  br label %kgd.exit{ci}")
        E(f"kgd.exit{ci}:")
        pre = f"kgd.exit{ci}"
    E("  %kg.next = add i64 %kg, 1")
    E("  br label %kg.head")
    E("dk.done:")
    E(f"  %i0.next = add i64 %i0, {BR}")
    E("  br label %tile.head")
    E("exit:")
    E("  ret void")
    E("}")
    return "\n".join(E.lines) + "\n"

