"""lower/triton: the built-in reducers as per-row state folded one neighbour tile at a time.

State tiles are `[1, *padded]`; a fold first broadcasts the tile's messages to
`[BLOCK_N, *padded]` and replaces invalid neighbours (past the row's degree) by the
identity. In a row-tiled body (row_tiles.py) states are `[BLOCK_R, *padded]` and a tile's
`[BLOCK_R * BLOCK_N, *padded]` lanes are regrouped as `[BLOCK_R, BLOCK_N, *padded]` and
reduced over their neighbour axis (`grouped`, `nbr_fold`, `against`). Empty rows finalise
as the reference does: sum/mean/max/min/online_softmax -> 0, prod -> 1 (max/min/prod:
`empty=` where set), argmin/argmax -> -1. Half-precision states accumulate in float32.
"""
from __future__ import annotations

import math

from ...core.dtypes import as_dtype
from .emitter import TV, Emitter, TritonUnsupported, pow2, tl_dtype
from .rules.reductions import identity

# the reduction of each fold rule: a tl function, or tl.reduce with a combine helper
_FOLD = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min", "prod": "_tiga_mul",
         "nanmax": "_tiga_max", "nanmin": "_tiga_min"}
_COMBINE = {"sum": "{a} + {b}", "max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})",
            "prod": "{a} * {b}", "nanmax": "_tiga_max({a}, {b})",
            "nanmin": "_tiga_min({a}, {b})"}
# the module-level @triton.jit helper (kernel.HELPERS) each fold rule calls
_HELPER = {"prod": "_tiga_mul", "nanmax": "_tiga_max", "nanmin": "_tiga_min"}


def state_dtype(dtype):
    d = as_dtype(dtype)
    return as_dtype("float32") if d.name in ("float16", "bfloat16") else d


def _dims(shape, lead: str = "1") -> str:
    return ", ".join([lead] + [str(pow2(d)) for d in shape])


def _state_dims(ctx: Emitter, shape) -> str:
    return _dims(shape, ctx.row_tile or "1")


def grouped(ctx: Emitter, x: str, shape) -> str:
    """A `[lanes, *padded]` tile by row: as is, or `[BLOCK_R, BLOCK_N, *padded]`."""
    if ctx.row_tile is None:
        return x
    return f"tl.reshape({x}, [{ctx.row_tile}, BLOCK_N{''.join(f', {pow2(d)}' for d in shape)}])"


def nbr_fold(ctx: Emitter, fn: str, x: str) -> str:
    """`fn` (a tl reduction, or a combine helper for tl.reduce) over the neighbour axis of a
    `grouped` tile: a value shaped like the reducer state."""
    axis, keep = (0, ", keep_dims=True") if ctx.row_tile is None else (1, "")
    if fn.startswith("_tiga"):
        return f"tl.reduce({x}, {axis}, {fn}{keep})"
    return f"{fn}({x}, axis={axis}{keep})"


def against(ctx: Emitter, state: str, rank: int) -> str:
    """A state (logical rank `rank`) broadcast against a `grouped` tile."""
    if ctx.row_tile is None:
        return state
    return f"{state}[{', '.join([':', 'None'] + [':'] * rank)}]"


def tile(ctx: Emitter, m: TV, shape=None) -> str:
    """`m` as a full `[BLOCK_N, *padded]` tile (per-row and literal messages repeat)."""
    shape = tuple(m.shape if shape is None else shape)
    dims = ", ".join([ctx.lanes] + [str(pow2(d)) for d in shape])
    if m.lead == "const":
        return f"tl.full([{dims}], {m.expr}, {tl_dtype(m.dtype)})"
    return f"tl.broadcast_to({ctx.expand(m, len(shape))}, [{dims}])"


def valid_mask(rank: int) -> str:
    return "valid" if rank == 0 else f"valid[:, {', '.join(['None'] * rank)}]"


class Fold:
    """sum / mean / max / min / prod over one message part."""

    def __init__(self, name: str, msg_type, empty: float | None = None):
        self.name, self.empty = name, empty
        self.shape = tuple(msg_type.shape)
        self.out_dtype = as_dtype(msg_type.dtype)
        self.dtype = state_dtype(msg_type.dtype)
        if self.name == "mean" and not self.dtype.is_float:
            raise TritonUnsupported("mean over integer messages")
        if self.out_dtype.name == "bool":
            raise TritonUnsupported(f"{name} over bool messages")

    def _op(self) -> str:
        return "sum" if self.name == "mean" else self.name

    def _rule(self, ctx: Emitter) -> str:
        """The fold's combine rule, its helper registered: float max/min keep NaN, as the
        reference's numpy maximum does (tl.max and tl.maximum drop it)."""
        op = self._op()
        rule = f"nan{op}" if op in ("max", "min") and self.dtype.is_float else op
        if rule in _HELPER:
            ctx.helpers.add(_HELPER[rule])
        return rule

    def init(self, ctx: Emitter) -> list:
        ident = identity(self._op(), self.dtype)
        return [ctx.let(f"tl.full([{_state_dims(ctx, self.shape)}], {ident}, "
                        f"{tl_dtype(self.dtype)})", "acc")]

    def fold(self, ctx: Emitter, state: list, msgs: list) -> None:
        op, rule = self._op(), self._rule(ctx)
        (acc,), (m,) = state, msgs
        x = (f"tl.where({valid_mask(len(self.shape))}, ({tile(ctx, m, self.shape)})"
             f".to({tl_dtype(self.dtype)}), {identity(op, self.dtype)})")
        part = nbr_fold(ctx, _FOLD[rule], grouped(ctx, x, self.shape))
        ctx.emit(f"{acc} = ({_COMBINE[rule].format(a=acc, b=part)}).to({tl_dtype(self.dtype)})")

    def layout(self) -> list:
        """(padded shape, dtype) of each state tile (the split path stores them per chunk)."""
        return [(tuple(pow2(d) for d in self.shape), self.dtype)]

    def merge(self, ctx: Emitter, state: list, other: list) -> None:
        """Fold another chunk's state (same row, later edges) into `state`."""
        (acc,), (o,) = state, other
        ctx.emit(f"{acc} = ({_COMBINE[self._rule(ctx)].format(a=acc, b=o)})"
                 f".to({tl_dtype(self.dtype)})")

    def finalize(self, ctx: Emitter, state: list) -> list:
        (acc,), cnt = state, ctx.per_row("cnt", len(self.shape))
        if self.name == "mean":
            expr = f"{acc} / tl.maximum({cnt}, 1).to({tl_dtype(self.dtype)})"
        elif self.name in ("max", "min") or self.empty is not None:
            expr = (f"tl.where({cnt} > 0, {acc}, "
                    f"{_empty_value(acc, 0 if self.empty is None else self.empty)})")
        else:
            expr = acc
        return [ctx.value(f"({expr}).to({tl_dtype(self.out_dtype)})", self.shape,
                          self.out_dtype, ctx.state_lead, "y")]


def _empty_value(acc: str, v: float) -> str:
    """An empty row's value as Triton source. -0.0 is built as the negation of a zero tile:
    Triton makes a literal 0 (of either sign) with get_null_value, which drops the sign, so
    a literal -0.0 would give +0.0 (cpu-llvm and the reference keep it)."""
    v = float(v)
    if v == 0.0 and math.copysign(1.0, v) < 0:
        return f"-tl.zeros_like({acc})"
    return _literal(v)


def _literal(v: float) -> str:
    """A Python literal Triton accepts for an empty row's value (inf and nan included)."""
    v = float(v)
    return f"float('{v}')" if v != v or v in (float("inf"), float("-inf")) else repr(v)


class ArgFold:
    """argmin / argmax: per message entry the best value and the smallest id reaching it (a
    NaN beats any number, as numpy's argmin); each tile's winner merges into the state."""

    def __init__(self, name: str, msg_type):
        self.largest, self.shape = name == "argmax", tuple(msg_type.shape)
        self.dtype = state_dtype(msg_type.dtype)
        if self.dtype.name == "bool":
            raise TritonUnsupported(f"{name} over bool messages")
        self.worst = identity("max" if self.largest else "min", self.dtype)

    def init(self, ctx: Emitter) -> list:
        d = _state_dims(ctx, self.shape)
        return [ctx.let(f"tl.full([{d}], {self.worst}, {tl_dtype(self.dtype)})", "abest"),
                ctx.let(f"tl.full([{d}], {_ID_MAX}, tl.int64)", "aid")]

    def fold(self, ctx: Emitter, state: list, msgs: list) -> None:
        (m, ident), mask = msgs, valid_mask(len(self.shape))
        x = ctx.let(f"tl.where({mask}, ({tile(ctx, m, self.shape)}).to("
                    f"{tl_dtype(self.dtype)}), {self.worst})", "ax")
        ids = ctx.let(f"tl.where({mask}, ({tile(ctx, ident, self.shape)}).to(tl.int64), "
                      f"{_ID_MAX})", "aids")
        if ctx.row_tile is not None:   # (invalid lanes already hold the worst value, id max)
            x = ctx.let(grouped(ctx, x, self.shape), "ax")
            ids = ctx.let(grouped(ctx, ids, self.shape), "aids")
            mask = None
        red, k = ("tl.max" if self.largest else "tl.min"), len(self.shape)
        if self.dtype.is_float:
            nan = ctx.let(f"({x} != {x})", "anan")
            any_nan = ctx.let(f"{nbr_fold(ctx, 'tl.max', f'{nan}.to(tl.int32)')} > 0", "tnan")
            top = ctx.let(nbr_fold(ctx, red, f"tl.where({nan}, {self.worst}, {x})"), "ttop")
            hit = f"tl.where({against(ctx, any_nan, k)}, {nan}, {x} == {against(ctx, top, k)})"
            top = ctx.let(f"tl.where({any_nan}, float('nan'), {top})", "ttop")
        else:
            top = ctx.let(nbr_fold(ctx, red, x), "ttop")
            hit = f"{x} == {against(ctx, top, k)}"
        sel = f"({hit}) & {mask}" if mask else hit
        tid = ctx.let(nbr_fold(ctx, "tl.min", f"tl.where({sel}, {ids}, {_ID_MAX})"), "tid")
        self._take(ctx, state, (top, tid))

    def _take(self, ctx: Emitter, state: list, other: tuple) -> None:
        """state <- other where other wins: better, or as good with a smaller id."""
        (best, bid), (v, i) = state, other
        op = ">" if self.largest else "<"
        if self.dtype.is_float:
            better = f"(({v} {op} {best}) | (({v} != {v}) & ({best} == {best})))"
            same = f"(({v} == {best}) | (({v} != {v}) & ({best} != {best})))"
        else:
            better, same = f"({v} {op} {best})", f"({v} == {best})"
        take = ctx.let(f"{better} | ({same} & ({i} < {bid}))", "take")
        ctx.emit(f"{best} = tl.where({take}, {v}, {best}).to({tl_dtype(self.dtype)})")
        ctx.emit(f"{bid} = tl.where({take}, {i}, {bid})")

    def layout(self) -> list:
        s = tuple(pow2(d) for d in self.shape)
        return [(s, self.dtype), (s, as_dtype("int64"))]

    def merge(self, ctx: Emitter, state: list, other: list) -> None:
        self._take(ctx, state, tuple(other))

    def finalize(self, ctx: Emitter, state: list) -> list:
        return [ctx.value(f"tl.where({ctx.per_row('cnt', len(self.shape))} > 0, {state[1]}, -1)",
                          self.shape, as_dtype("int64"), ctx.state_lead, "y")]


_ID_MAX = str((1 << 63) - 1)


class OnlineSoftmax:
    """(running max, mass, accumulator), rescaled to the new maximum once per tile."""

    def __init__(self, score_type, value_type):
        self.s_shape, self.v_shape = tuple(score_type.shape), tuple(value_type.shape)
        self.out_dtype = as_dtype(value_type.dtype)
        self.dtype = state_dtype(value_type.dtype)
        self.extra = len(self.v_shape) - len(self.s_shape)

    def init(self, ctx: Emitter) -> list:
        t = tl_dtype(self.dtype)
        return [ctx.let(f"tl.full([{_state_dims(ctx, self.s_shape)}], float('-inf'), {t})",
                        "smax"),
                ctx.let(f"tl.zeros([{_state_dims(ctx, self.s_shape)}], {t})", "smass"),
                ctx.let(f"tl.zeros([{_state_dims(ctx, self.v_shape)}], {t})", "sacc")]

    def _lift(self, expr: str, lead: int = 1) -> str:
        """A score-shaped tile (`lead` leading axes) against the value's trailing axes."""
        if not self.extra:
            return expr
        rank = lead + len(self.s_shape)
        return f"({expr})[{', '.join([':'] * rank + ['None'] * self.extra)}]"

    def fold(self, ctx: Emitter, state: list, msgs: list) -> None:
        mx, mass, acc = state
        s, v = msgs
        t = tl_dtype(self.dtype)
        score = ctx.let(f"tl.where({valid_mask(len(self.s_shape))}, "
                        f"({tile(ctx, s, self.s_shape)}).to({t}), float('-inf'))", "sc")
        value = ctx.let(f"tl.where({valid_mask(len(self.v_shape))}, "
                        f"({tile(ctx, v, self.v_shape)}).to({t}), 0.0)", "vl")
        lead = 1
        if ctx.row_tile is not None:   # lanes by row: [BLOCK_R, BLOCK_N, ...]
            score = ctx.let(grouped(ctx, score, self.s_shape), "sc")
            value = ctx.let(grouped(ctx, value, self.v_shape), "vl")
            lead = 2
        # a NaN score makes the row max NaN, hence the row NaN, as in the reference
        ctx.helpers.add("_tiga_max")
        new = ctx.let(f"_tiga_max({mx}, {nbr_fold(ctx, '_tiga_max', score)})", "mnew")
        # a state that saw only -inf scores keeps a zero base, so exp() never sees -inf - -inf
        base = ctx.let(f"tl.where({new} == float('-inf'), 0.0, {new})", "base")
        alpha = ctx.let(f"tl.exp({mx} - {base})", "alpha")
        p = ctx.let(f"tl.exp({score} - {against(ctx, base, len(self.s_shape))})", "p")
        ctx.emit(f"{mass} = ({mass} * {alpha} + {nbr_fold(ctx, 'tl.sum', p)}).to({t})")
        weighted = nbr_fold(ctx, "tl.sum", f"{self._lift(p, lead)} * {value}")
        ctx.emit(f"{acc} = ({acc} * {self._lift(alpha)} + {weighted}).to({t})")
        ctx.emit(f"{mx} = {new}.to({t})")

    def layout(self) -> list:
        s = tuple(pow2(d) for d in self.s_shape)
        return [(s, self.dtype), (s, self.dtype), (tuple(pow2(d) for d in self.v_shape),
                                                    self.dtype)]

    def merge(self, ctx: Emitter, state: list, other: list) -> None:
        """Two (max, mass, acc) states rescaled to their common maximum."""
        (mx, mass, acc), (omx, omass, oacc) = state, other
        t = tl_dtype(self.dtype)
        ctx.helpers.add("_tiga_max")
        new = ctx.let(f"_tiga_max({mx}, {omx})", "mnew")
        base = ctx.let(f"tl.where({new} == float('-inf'), 0.0, {new})", "base")
        a = ctx.let(f"tl.exp({mx} - {base})", "alpha")
        b = ctx.let(f"tl.exp({omx} - {base})", "beta")
        ctx.emit(f"{mass} = ({mass} * {a} + {omass} * {b}).to({t})")
        ctx.emit(f"{acc} = ({acc} * {self._lift(a)} + {oacc} * {self._lift(b)}).to({t})")
        ctx.emit(f"{mx} = {new}.to({t})")

    def finalize(self, ctx: Emitter, state: list) -> list:
        _, mass, acc = state
        # mass is 0 only where every score is -inf (the max's own weight is exp(0) = 1), and
        # NaN after a NaN or +inf score: both rows are NaN, as the reference's; an empty
        # row is 0 (no 0 / 0 is computed: the interpreter would warn on padded lanes)
        live = self._lift(f"{mass} > 0")
        safe = self._lift(f"tl.where({mass} > 0, {mass}, 1.0)")
        cnt = ctx.per_row("cnt", len(self.v_shape))
        expr = f"tl.where({cnt} > 0, tl.where({live}, {acc} / {safe}, float('nan')), 0.0)"
        return [ctx.value(f"({expr}).to({tl_dtype(self.out_dtype)})", self.v_shape,
                          self.out_dtype, ctx.state_lead, "y")]


def reducer_folds(reducer, msg_types: list) -> list:
    """One fold per output: [(fold, message positions)]."""
    if reducer is None or not reducer.builtin:
        raise TritonUnsupported(f"the user reducer {getattr(reducer, 'name', reducer)!r} "
                                "(built-in reducers are rendered)")
    if reducer.name == "online_softmax":
        if getattr(reducer, "prune_threshold", None) is not None:
            raise TritonUnsupported("online_softmax with prune_threshold")
        return [(OnlineSoftmax(msg_types[i], msg_types[i + 1]), (i, i + 1))
                for i in range(0, len(msg_types), 2)]
    if reducer.name in ("argmin", "argmax"):
        return [(ArgFold(reducer.name, msg_types[i]), (i, i + 1))
                for i in range(0, len(msg_types), 2)]
    return [(Fold(reducer.name, t, getattr(reducer, "empty", None)), (i,))
            for i, t in enumerate(msg_types)]
