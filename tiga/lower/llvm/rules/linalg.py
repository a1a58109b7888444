"""lower/llvm: dot_general on row values (small matrices of an MLP inside an edge function).

Loop order batch, left-free, contracted, right-free: the innermost loop walks a row of the
right operand (a parameter matrix in C order), which LLVM vectorises.
"""
from __future__ import annotations

from ....core.prims.linalg import dot_general_p
from ...registry import lowering_rules
from ..values import CodegenUnsupported, cast, const


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
    ctx.fill(acc, const(dtype, 0))
    loops = _axes(x.shape, y.shape, dimension_numbers)

    def body(idx):
        xi, yi, oi = [None] * len(x.shape), [None] * len(y.shape), [None] * len(out_t.shape)
        for i, (_, xa, ya, oa) in zip(idx, loops):
            if xa is not None:
                xi[xa] = i
            if ya is not None:
                yi[ya] = i
            if oa is not None:
                oi[oa] = i
        u = cast(b, x.load(b, xi), x.dtype, dtype)
        v = cast(b, y.load(b, yi), y.dtype, dtype)
        old = acc.load(b, oi)
        # No reassoc: the VJP of max/min recomputes messages in another kernel and finds the
        # winning edge by equality, so every kernel must round a product identically (LLVM
        # still vectorises over the innermost, right-free axis)
        new = (b.fadd(old, b.fmul(u, v)) if dtype.is_float
               else b.add(old, b.mul(u, v)))
        acc.store(b, oi, new)

    ctx.loop_nest(tuple(n for n, _, _, _ in loops), body)
    return [acc]


lowering_rules["cpu-llvm"][dot_general_p] = dot_general_rule
