"""lower/llvm: dot_general on row values (small matrices of an MLP inside an edge function).

Loop order batch, left-free, contracted, right-free: the innermost loop walks a row of the
right operand (a parameter matrix in C order), which LLVM vectorises.
"""
from __future__ import annotations

from llvmlite import ir

from ....core.prims.linalg import dot_general_p
from ...registry import lowering_rules
from ..values import CodegenUnsupported, Val, cast, const, i64, storage_type


def _axes(x_shape, y_shape, dimension_numbers):
    """Loop axes as (size, x axis or None, y axis or None, out axis or None)."""
    (lc, rc), (lb, rb) = dimension_numbers
    loops, out = [], 0
    for a, c in zip(lb, rb):
        loops.append((x_shape[a], a, c, out))
        out += 1
    for i in range(len(x_shape)):
        if i not in lc and i not in lb:
            loops.append((x_shape[i], i, None, out))
            out += 1
    rfree = [i for i in range(len(y_shape)) if i not in rc and i not in rb]
    for a, c in zip(lc, rc):
        loops.append((x_shape[a], a, c, None))
    for i in rfree:
        loops.append((y_shape[i], None, i, out))
        out += 1
    return loops


def dot_general_rule(ctx, in_types, out_types, x, y, *, dimension_numbers):
    out_t = out_types[0]
    dtype = out_t.dtype
    if dtype.name == "bool":
        raise CodegenUnsupported("dot_general on bool operands has no cpu-llvm lowering")
    b = ctx.b
    acc = ctx.new_buf(tuple(out_t.shape), dtype)
    loops = _axes(x.shape, y.shape, dimension_numbers)

    def body(idx):
        xi, yi, oi = _operand_indices(idx, loops, x, y, len(out_t.shape))
        u = cast(b, x.load(b, xi), x.dtype, dtype)
        v = cast(b, y.load(b, yi), y.dtype, dtype)
        old = acc.load(b, oi)
        # No reassoc: the VJP of max/min recomputes messages in another kernel and finds the
        # winning edge by equality, so every kernel must round a product identically (LLVM
        # still vectorises over the innermost, right-free axis)
        new = (b.fadd(old, b.fmul(u, v)) if dtype.is_float
               else b.add(old, b.mul(u, v)))
        acc.store(b, oi, new)

    if loops and loops[-1][2] is not None and loops[-1][1] is None:
        y = _contiguous_inner(ctx, y, loops[-1][2])
    if _vector_inner(loops, x, y, dtype):
        # writes every result row once (no zero fill: a per-edge (32, 32) outer product
        # for a weight gradient is then stored once instead of cleared, loaded and stored)
        _vector_nest(ctx, loops, x, y, acc, dtype)
    else:
        ctx.fill(acc, const(dtype, 0))
        ctx.loop_nest(tuple(n for n, _, _, _ in loops), body)
    return [acc]


MAX_VECTOR_LANES = 64


def _vector_inner(loops, x, y, dtype) -> bool:
    """The innermost loop walks a contiguous row of y into a contiguous row of the result
    (matvec x @ W, outer product x (x) y): it is emitted as one <n x float> multiply-add.
    Left to LLVM, an outer product's fully unrolled inner loop made the loop vectoriser
    widen the OUTER loop instead, with 16-lane gathers/scatters per row (10x slower)."""
    # float16/bfloat16 compute in float32 (storage and compute types differ)
    if (not loops or dtype.name not in ("float32", "float64") or x.dtype != dtype
            or y.dtype != dtype):
        return False
    n, xa, ya, oa = loops[-1]
    return (xa is None and ya is not None and oa is not None and 1 < n <= MAX_VECTOR_LANES
            and not y.is_scalar and y.strides[ya] == 1)


def _vector_nest(ctx, loops, x, y, acc, dtype):
    b = ctx.b
    n, _, ya_last, _ = loops[-1]
    elem = storage_type(dtype)
    vec = ir.VectorType(elem, n)
    align = dtype.itemsize
    zero = ir.Constant(ir.IntType(32), 0)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n)

    def body(idx):
        xi, yi, oi = _operand_indices(idx, loops[:-1], x, y, len(acc.shape))
        yi[ya_last] = i64(0)
        oi[len(acc.shape) - 1] = i64(0)
        u = x.load(b, xi)
        u = b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), u, zero),
                            ir.Constant(vec, ir.Undefined), splat_mask)
        v = b.load(_as_vector_ptr(b, y.address(b, yi), vec), typ=vec, align=align)
        out_ptr = _as_vector_ptr(b, acc.address(b, oi), vec)
        if contracted:
            old = b.load(out_ptr, typ=vec, align=align)
            b.store(b.fadd(old, b.fmul(u, v)), out_ptr, align=align)
        else:
            b.store(b.fmul(u, v), out_ptr, align=align)

    if _split_contraction(loops):
        _matvec_nest(ctx, loops, x, y, acc, dtype, vec, splat_mask)
        return
    contracted = any(lp[3] is None and lp[0] > 1 for lp in loops)  # size 1: (32, 1) @ (1, 32)
    if contracted:
        ctx.fill(acc, const(dtype, 0))
    ctx.loop_nest(tuple(m for m, _, _, _ in loops[:-1]), body)


SPLIT_ACCUMULATORS = 4
MAX_UNROLLED_CONTRACTION = 256


def _split_contraction(loops) -> bool:
    """x @ W with one contracted axis just outside the vector axis (every middle Linear of
    an edge MLP): worth independent partial sums (see _matvec_nest)."""
    if len(loops) < 2:
        return False
    k, xa, ya, oa = loops[-2]
    contracted = [lp for lp in loops if lp[1] is not None and lp[2] is not None
                  and lp[3] is None]
    return (xa is not None and ya is not None and oa is None and len(contracted) == 1
            and SPLIT_ACCUMULATORS <= k <= MAX_UNROLLED_CONTRACTION)


def _fmuladd(ctx, vec):
    name = f"llvm.fmuladd.v{vec.count}{'f32' if vec.element == ir.FloatType() else 'f64'}"
    key = ("fmuladd", str(vec))
    if key not in ctx._decls:
        ctx._decls[key] = ir.Function(ctx.module, ir.FunctionType(vec, [vec, vec, vec]),
                                      name=name)
    return ctx._decls[key]


def _matvec_nest(ctx, loops, x, y, acc, dtype, vec, splat_mask):
    """acc[.., :] += sum_k x[.., k] * y[k, :], unrolled over k into SPLIT_ACCUMULATORS
    register partial sums (k mod 4) merged as (s0 + s1) + (s2 + s3): the edge loop of a
    deep edge MLP is bound by this chain's latency otherwise (one add after another per k).
    Every kernel emits the same operations in the same order (llvm.fmuladd rounds as the
    target decides, the same in every kernel), so a message recomputed by a VJP kernel is
    bitwise the forward's, which the max/min VJPs rely on."""
    b = ctx.b
    K, _, _, _ = loops[-2]
    n, _, ya_last, _ = loops[-1]
    align = dtype.itemsize
    zero = ir.Constant(ir.IntType(32), 0)
    fma = _fmuladd(ctx, vec)

    def body(idx):
        xi, yi, oi = _operand_indices(idx, loops[:-2], x, y, len(acc.shape))
        _, kxa, kya, _ = loops[-2]
        yi[ya_last] = i64(0)
        oi[len(acc.shape) - 1] = i64(0)
        parts = [None] * SPLIT_ACCUMULATORS
        for k in range(K):
            xi[kxa], yi[kya] = i64(k), i64(k)
            u = x.load(b, xi)
            u = b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), u, zero),
                                 ir.Constant(vec, ir.Undefined), splat_mask)
            v = b.load(_as_vector_ptr(b, y.address(b, yi), vec), typ=vec, align=align)
            j = k % SPLIT_ACCUMULATORS
            parts[j] = (b.fmul(u, v) if parts[j] is None else b.call(fma, [u, v, parts[j]]))
        while len(parts) > 1:
            parts = [b.fadd(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
        b.store(parts[0], _as_vector_ptr(b, acc.address(b, oi), vec), align=align)

    ctx.loop_nest(tuple(m for m, _, _, _ in loops[:-2]), body)


def _contiguous_inner(ctx, y, axis: int):
    """A parameter read along a strided axis (dh @ W for a weight hoisted as W^T) gets a
    copy laid out with that axis contiguous, made once per call before the loops; the
    values and their order of operations are unchanged, only the loads become vectors."""
    if (y.is_scalar or y.strides[axis] == 1 or id(y.ptr) not in ctx.invariant
            or y.dtype.name not in ("float32", "float64")):
        return y
    order = [a for a in range(len(y.shape)) if a != axis] + [axis]
    shape = tuple(y.shape[a] for a in order)

    def make():
        buf = ctx.new_buf(shape, y.dtype)
        perm_strides = [0] * len(y.shape)
        for a, s in zip(order, buf.strides):
            perm_strides[a] = s
        view = Val(y.shape, y.dtype, ptr=buf.ptr, strides=tuple(perm_strides))
        ctx.copy_into(view, y)
        return view

    return ctx.hoisted((id(y.ptr), y.strides, y.shape, axis), make) or y


def _as_vector_ptr(b, ptr, vec):
    """Stack buffers are typed `float*`; kernel arguments are opaque `ptr`."""
    if getattr(ptr.type, "is_opaque", False):
        return ptr
    return b.bitcast(ptr, vec.as_pointer())


def _operand_indices(idx, loops, x, y, out_rank: int):
    """Index lists of x, y and the result for one point of the loop nest (None where the
    caller fills in the vector or contracted axes)."""
    xi, yi, oi = [None] * len(x.shape), [None] * len(y.shape), [None] * out_rank
    for i, (_, xa, ya, oa) in zip(idx, loops):
        if xa is not None:
            xi[xa] = i
        if ya is not None:
            yi[ya] = i
        if oa is not None:
            oi[oa] = i
    return xi, yi, oi


lowering_rules["cpu-llvm"][dot_general_p] = dot_general_rule
