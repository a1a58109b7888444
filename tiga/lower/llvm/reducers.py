"""lower/llvm: reducer state in generated kernels: init per row, fold per edge, finalize.

Built-in reducers keep one stack buffer of the message row shape (online_softmax keeps a
running max, a mass and an accumulator per score entry); user reducers run their traced
lift / combine / finalize regions through the same emitter. float16 sums, means, products
and softmax states are float32 buffers rounded once in finalize (core/reducers.py's rule).
"""
from __future__ import annotations

import math

from llvmlite import ir

from ...core.dtypes import compute_dtype, float64, int64
from ...core.reducers import Reducer
from .rules.reductions import combine, identity
from .values import F64, CodegenUnsupported, Val, cast, const, numel

SIMPLE = ("sum", "mean", "max", "min", "prod")


def reducer_codegen(reducer: Reducer, msg_types: list):
    """The state machine for one output of `reducer` over message parts `msg_types`."""
    if reducer.builtin and reducer.name in SIMPLE:
        return SimpleState(reducer.name, msg_types[0], getattr(reducer, "empty", None))
    if reducer.builtin and reducer.name in ("argmin", "argmax"):
        return ArgState(reducer.name, msg_types[0])
    if reducer.builtin and reducer.name == "online_softmax":
        return SoftmaxState(msg_types[0], msg_types[1])
    if not reducer.builtin:
        return UserState(reducer, msg_types[0])
    raise CodegenUnsupported(f"reducer {reducer.name!r} has no cpu-llvm lowering")


class SimpleState:
    """sum, mean, max, min, prod: an accumulator of the message shape."""

    def __init__(self, name: str, msg_type, empty: float | None = None):
        if msg_type.dtype.name == "bool":
            raise CodegenUnsupported(f"{name} over bool messages has no cpu-llvm lowering")
        self.name, self.kind = name, "sum" if name == "mean" else name
        self.empty = empty   # max/min/prod: an empty row's value (None: 0 for max/min)
        self.shape, self.out_dtype = tuple(msg_type.shape), msg_type.dtype
        # float16 sums and products accumulate in float32 and round once in finalize (the
        # rule of core/reducers.py); max/min are exact and keep the message dtype
        self.dtype = (compute_dtype(self.out_dtype) if self.kind in ("sum", "prod")
            else self.out_dtype)
        # sums may be split over several accumulators and merged (the kernel's unrolled edge
        # loop): exact for integers, a different rounding order for float32/float64, as
        # numpy's pairwise sums
        self.reassociable = self.kind == "sum"

    def state_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * self.dtype.itemsize

    def merge(self, ctx, state: list, other: list) -> None:
        """state += other (two partial sums of one row)."""
        (acc,), (part,) = state, other
        b = ctx.b
        shape = self.shape
        if len(shape) > 1 and acc.is_contiguous() and part.is_contiguous():
            shape = (numel(shape),)
            acc, part = acc.with_shape(shape, (1,)), part.with_shape(shape, (1,))
        ctx.loop_nest(shape, lambda idx: acc.store(
            b, idx, combine(b, self.kind, self.dtype, acc.load(b, idx), part.load(b, idx))))

    def init(self, ctx) -> list:
        acc = ctx.new_buf(self.shape, self.dtype)
        ctx.fill(acc, identity(self.kind, self.dtype))
        return [acc]

    def fold(self, ctx, state: list, msgs: list) -> None:
        (acc,), (m,) = state, msgs
        b = ctx.b
        shape = self.shape
        if len(shape) > 1 and acc.is_contiguous() and (m.is_scalar or m.is_contiguous()):
            # one flat loop: LLVM fully unrolls a short inner loop of a nest and then
            # vectorises the outer one with gathers/scatters (a (32, 32) weight gradient)
            shape = (numel(shape),)
            acc, m = acc.with_shape(shape, (1,)), m.with_shape(shape, (1,))

        def body(idx):
            x = cast(b, m.load(b, idx), m.dtype, self.dtype)
            acc.store(b, idx, combine(b, self.kind, self.dtype, acc.load(b, idx), x))

        ctx.loop_nest(shape, body)

    def finalize(self, ctx, state: list, count: ir.Value) -> list:
        (acc,) = state
        b = ctx.b
        if self.name == "mean":
            # like the reference: divide in float64 by max(count, 1), then round once
            n = b.sitofp(b.select(b.icmp_signed(">", count, ir.Constant(count.type, 1)),
                                  count, ir.Constant(count.type, 1)), F64)
            ctx.loop_nest(self.shape, lambda idx: acc.store(b, idx, cast(
                b, b.fdiv(cast(b, acc.load(b, idx), self.dtype, float64), n), float64,
                self.dtype)))
        elif self.name in ("max", "min") or self.empty is not None:
            empty = b.icmp_signed("==", count, ir.Constant(count.type, 0))
            fill = const(self.dtype, 0 if self.empty is None else self.empty)
            ctx.loop_nest(self.shape, lambda idx: acc.store(
                b, idx, b.select(empty, fill, acc.load(b, idx))))
        return [_as(ctx, acc, self.out_dtype)]   # a float32 state rounds once, here


class ArgState:
    """argmin / argmax: the best message so far and its id, per message entry.

    An edge wins when its message is better, or as good with a smaller id; a NaN message
    beats any number (numpy's argmin). The order is total, so the fold is edge-order free.
    """

    def __init__(self, name: str, msg_type):
        if msg_type.dtype.name == "bool":
            raise CodegenUnsupported(f"{name} over bool messages has no cpu-llvm lowering")
        self.largest = name == "argmax"
        self.shape, self.dtype = tuple(msg_type.shape), msg_type.dtype

    def init(self, ctx) -> list:
        best, ids = ctx.new_buf(self.shape, self.dtype), ctx.new_buf(self.shape, int64)
        ctx.fill(best, identity("max" if self.largest else "min", self.dtype))
        ctx.fill(ids, const(int64, (1 << 63) - 1))
        return [best, ids]

    def _wins(self, b, x, bx, i, bi) -> ir.Value:
        op = ">" if self.largest else "<"
        smaller_id = b.icmp_signed("<", i, bi)
        if not self.dtype.is_float:
            better = b.icmp_signed(op, x, bx)
            return b.or_(better, b.and_(b.icmp_signed("==", x, bx), smaller_id))
        x_nan, b_nan = b.fcmp_unordered("uno", x, x), b.fcmp_unordered("uno", bx, bx)
        better = b.or_(b.fcmp_ordered(op, x, bx), b.and_(x_nan, b.not_(b_nan)))
        same = b.or_(b.fcmp_ordered("==", x, bx), b.and_(x_nan, b_nan))
        return b.or_(better, b.and_(same, smaller_id))

    def fold(self, ctx, state: list, msgs: list) -> None:
        (best, ids), (m, ident) = state, msgs
        b = ctx.b

        def body(idx):
            x, bx, bi = m.load(b, idx), best.load(b, idx), ids.load(b, idx)
            i = ident.load(b, [])
            take = self._wins(b, x, bx, i, bi)
            best.store(b, idx, b.select(take, x, bx))
            ids.store(b, idx, b.select(take, i, bi))

        ctx.loop_nest(self.shape, body)

    def finalize(self, ctx, state: list, count: ir.Value) -> list:
        _, ids = state
        b = ctx.b
        empty = b.icmp_signed("==", count, ir.Constant(count.type, 0))
        ctx.loop_nest(self.shape, lambda idx: ids.store(
            b, idx, b.select(empty, const(int64, -1), ids.load(b, idx))))
        return [ids]


class SoftmaxState:
    """Streaming softmax: running max `top`, mass and accumulator per score entry."""

    def __init__(self, score_t, value_t):
        # float16 scores and values run in float32 and the result rounds once (finalize)
        self.s_shape, self.s_dtype = tuple(score_t.shape), compute_dtype(score_t.dtype)
        self.v_shape, self.v_dtype = tuple(value_t.shape), compute_dtype(value_t.dtype)
        self.out_dtype = value_t.dtype
        self.tail = self.v_shape[len(self.s_shape):]

    def init(self, ctx) -> list:
        top = ctx.new_buf(self.s_shape, self.s_dtype)
        mass = ctx.new_buf(self.s_shape, self.s_dtype)
        acc = ctx.new_buf(self.v_shape, self.v_dtype)
        ctx.fill(top, const(self.s_dtype, -math.inf))
        ctx.fill(mass, const(self.s_dtype, 0))
        ctx.fill(acc, const(self.v_dtype, 0))
        return [top, mass, acc]

    def fold(self, ctx, state: list, msgs: list) -> None:
        top, mass, acc = state
        score, value = msgs
        b, sd, vd = ctx.b, self.s_dtype, self.v_dtype

        def per_score(idx):
            sc = cast(b, score.load(b, idx), score.dtype, sd)
            old = top.load(b, idx)
            grew = b.fcmp_ordered(">", sc, old)
            # one exp per edge: exp(-|sc - old|) rescales either the state or the new term
            e = b.call(ctx.intrinsic("llvm.exp", sc.type),
                       [b.select(grew, b.fsub(old, sc), b.fsub(sc, old))])
            one, zero = const(sd, 1.0), const(sd, 0.0)
            # the reference's weights exp(s - max): a new max weighs exp(sc - sc), 1 or NaN
            # for sc = +inf (softmax of [inf, 1] is NaN); a -inf score weighs 0, never
            # exp(-inf - -inf) = NaN (its row is NaN only when every score is -inf: finalize)
            new_w = b.fadd(one, b.fsub(sc, sc))
            old_w = b.select(b.fcmp_ordered("==", sc, const(sd, -math.inf)), zero, e)
            scale, weight = b.select(grew, e, one), b.select(grew, new_w, old_w)
            top.store(b, idx, b.select(grew, sc, old))
            mass.store(b, idx, b.fadd(b.fmul(mass.load(b, idx), scale), weight))
            vs, vw = cast(b, scale, sd, vd), cast(b, weight, sd, vd)

            def per_value(vidx):
                v = cast(b, value.load(b, vidx), value.dtype, vd)
                acc.store(b, vidx, b.fadd(b.fmul(acc.load(b, vidx), vs), b.fmul(vw, v)))

            ctx.loop_nest(self.tail, per_value, prefix=idx)

        ctx.loop_nest(self.s_shape, per_score)

    def finalize(self, ctx, state: list, count: ir.Value) -> list:
        top, mass, acc = state
        b, sd, vd = ctx.b, self.s_dtype, self.v_dtype
        k = len(self.s_shape)
        edges = b.icmp_signed(">", count, ir.Constant(count.type, 0))
        nan = const(vd, math.nan)

        def body(idx):
            m = mass.load(b, idx[:k])
            safe = b.select(b.fcmp_ordered(">", m, const(sd, 0)), m, const(sd, 1.0))
            y = b.fdiv(acc.load(b, idx), cast(b, safe, sd, vd))
            # a row whose every score is -inf: NaN, as the reference's (and torch's) softmax
            dead = b.and_(edges, b.fcmp_ordered("==", top.load(b, idx[:k]),
                                                const(sd, -math.inf)))
            acc.store(b, idx, b.select(dead, nan, y))

        ctx.loop_nest(self.v_shape, body)
        return [_as(ctx, acc, self.out_dtype)]


class UserState:
    """A user Reducer: its traced regions, folded in edge order from the identity."""

    def __init__(self, reducer: Reducer, msg_type):
        if reducer.regions is None:
            raise CodegenUnsupported(f"reducer {reducer.name!r} was not traced")
        self.lift, self.combine, self.final = reducer.regions
        for r in reducer.regions:
            if r is not None and r.consts:
                raise CodegenUnsupported(f"reducer {reducer.name!r}: regions with constants")
        st = self.combine.in_types[0]
        self.shape, self.dtype, self.identity = tuple(st.shape), st.dtype, reducer.identity

    def init(self, ctx) -> list:
        acc = ctx.new_buf(self.shape, self.dtype)
        ctx.fill(acc, const(self.dtype, self.identity))
        return [acc]

    def fold(self, ctx, state: list, msgs: list) -> None:
        (acc,), (m,) = state, msgs
        if self.lift is not None:
            (m,) = ctx.eval_program(self.lift, [m])
        (new,) = ctx.eval_program(self.combine, [acc, m])
        if new.ptr is acc.ptr and not new.is_scalar:
            if new.strides == acc.strides:
                return
            tmp = ctx.new_buf(new.shape, new.dtype)  # a permuted view of the state itself
            ctx.copy_into(tmp, new)
            new = tmp
        ctx.copy_into(acc, _as(ctx, new, self.dtype))

    def finalize(self, ctx, state: list, count: ir.Value) -> list:
        if self.final is None:
            return state
        return ctx.eval_program(self.final, state)


def _as(ctx, val: Val, dtype) -> Val:
    if val.dtype == dtype:
        return val
    out = ctx.new_buf(val.shape, dtype)
    b = ctx.b
    ctx.loop_nest(val.shape, lambda idx: out.store(b, idx, cast(b, val.load(b, idx), val.dtype,
                                                               dtype)))
    return out
