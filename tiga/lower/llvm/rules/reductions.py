"""lower/llvm: reductions over row axes: an accumulator buffer and one loop nest over the input.

Float sums and products over row axes carry the `reassoc` flag, so LLVM may split them into
vector lanes instead of one serial add chain (a dot product over 32 features per edge would
otherwise cost 32 dependent adds). numpy's own pairwise summation is not sequential either;
tests compare with a tolerance. A propagate's sum/mean over float32/float64 folds edges
into several accumulators merged per row (lower/schedule.py edge_unroll); every other
reducer folds in edge order like the reference.
"""
from __future__ import annotations

import math

from llvmlite import ir

from ....core.prims.reductions import reduce_p
from ...registry import lowering_rules
from ..values import CodegenUnsupported, Val, const

_OPS = {"reduce_sum": "sum", "reduce_prod": "prod", "reduce_max": "max", "reduce_min": "min"}


def identity(kind: str, dtype) -> ir.Constant:
    """The starting value of an accumulator (max/min start at the dtype's extremes)."""
    if kind == "sum":
        return const(dtype, 0)
    if kind == "prod":
        return const(dtype, 1)
    largest = kind == "max"
    if dtype.is_float:
        return const(dtype, -math.inf if largest else math.inf)
    bits = dtype.bits
    return const(dtype, -(1 << (bits - 1)) if largest else (1 << (bits - 1)) - 1)


def combine(b: ir.IRBuilder, kind: str, dtype, acc: ir.Value, x: ir.Value,
            reassoc: bool = False) -> ir.Value:
    """One accumulation step with numpy semantics (NaN propagates through max/min)."""
    if dtype.name == "bool":
        raise CodegenUnsupported(f"{kind} over bool values has no cpu-llvm lowering")
    if dtype.is_float:
        flags = ("reassoc", "nsz") if reassoc else ()
        if kind == "sum":
            return b.fadd(acc, x, flags=flags)
        if kind == "prod":
            return b.fmul(acc, x, flags=flags)
        better = b.fcmp_ordered(">" if kind == "max" else "<", x, acc)
        pick = b.select(better, x, acc)
        return b.select(b.fcmp_unordered("uno", x, x), x, pick)
    if kind == "sum":
        return b.add(acc, x)
    if kind == "prod":
        return b.mul(acc, x)
    return b.select(b.icmp_signed(">" if kind == "max" else "<", x, acc), x, acc)


def _reduce_rule(name):
    kind = _OPS[name]

    def rule(ctx, in_types, out_types, x, *, axes):
        out_t = out_types[0]
        dtype = out_t.dtype
        b = ctx.b
        acc = ctx.new_buf(tuple(out_t.shape), dtype)
        ctx.fill(acc, identity(kind, dtype))
        keep = [i for i in range(len(x.shape)) if i not in axes]

        def body(idx):
            oi = [idx[i] for i in keep]
            acc.store(b, oi, combine(b, kind, dtype, acc.load(b, oi), x.load(b, idx),
                                     reassoc=True))

        ctx.loop_nest(x.shape, body)
        return [acc]

    return rule


def _register():
    rules = lowering_rules["cpu-llvm"]
    for name, p in reduce_p.items():
        rules[p] = _reduce_rule(name)


_register()

__all__ = ["identity", "combine", "Val"]
