"""lower/triton: the built-in reducers as per-row state folded one neighbour tile at a time.

State tiles are `[1, *padded]`; a fold first broadcasts the tile's messages to
`[BLOCK_N, *padded]` and replaces invalid neighbours (past the row's degree) by the
identity. Empty rows finalise as the reference does: sum/mean/max/min/online_softmax -> 0,
prod -> 1. Half-precision states accumulate in float32.
"""
from __future__ import annotations

from ...core.dtypes import as_dtype
from .emitter import TV, Emitter, TritonUnsupported, pow2, tl_dtype
from .rules.reductions import identity

_FOLD = {"sum": "tl.sum({x}, axis=0, keep_dims=True)",
         "max": "tl.max({x}, axis=0, keep_dims=True)",
         "min": "tl.min({x}, axis=0, keep_dims=True)",
         "prod": "tl.reduce({x}, 0, _tiga_mul, keep_dims=True)"}
_COMBINE = {"sum": "{a} + {b}", "max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})",
            "prod": "{a} * {b}"}


def state_dtype(dtype):
    d = as_dtype(dtype)
    return as_dtype("float32") if d.name in ("float16", "bfloat16") else d


def _dims(shape) -> str:
    return ", ".join(["1"] + [str(pow2(d)) for d in shape])


def tile(ctx: Emitter, m: TV, shape=None) -> str:
    """`m` as a full `[BLOCK_N, *padded]` tile (per-row and literal messages repeat)."""
    shape = tuple(m.shape if shape is None else shape)
    dims = ", ".join(["BLOCK_N"] + [str(pow2(d)) for d in shape])
    if m.lead == "const":
        return f"tl.full([{dims}], {m.expr}, {tl_dtype(m.dtype)})"
    return f"tl.broadcast_to({ctx.expand(m, len(shape))}, [{dims}])"


def valid_mask(rank: int) -> str:
    return "valid" if rank == 0 else f"valid[:, {', '.join(['None'] * rank)}]"


class Fold:
    """sum / mean / max / min / prod over one message part."""

    def __init__(self, name: str, msg_type):
        self.name = name
        self.shape = tuple(msg_type.shape)
        self.out_dtype = as_dtype(msg_type.dtype)
        self.dtype = state_dtype(msg_type.dtype)
        if self.name == "mean" and not self.dtype.is_float:
            raise TritonUnsupported("mean over integer messages")
        if self.out_dtype.name == "bool":
            raise TritonUnsupported(f"{name} over bool messages")

    def _op(self) -> str:
        return "sum" if self.name == "mean" else self.name

    def init(self, ctx: Emitter) -> list:
        ident = identity(self._op(), self.dtype)
        return [ctx.let(f"tl.full([{_dims(self.shape)}], {ident}, {tl_dtype(self.dtype)})",
                        "acc")]

    def fold(self, ctx: Emitter, state: list, msgs: list) -> None:
        op = self._op()
        if op == "prod":
            ctx.helpers.add("_tiga_mul")
        (acc,), (m,) = state, msgs
        x = f"tl.where({valid_mask(len(self.shape))}, ({tile(ctx, m, self.shape)})" \
            f".to({tl_dtype(self.dtype)}), {identity(op, self.dtype)})"
        part = _FOLD[op].format(x=x)
        ctx.emit(f"{acc} = ({_COMBINE[op].format(a=acc, b=part)}).to({tl_dtype(self.dtype)})")

    def layout(self) -> list:
        """(padded shape, dtype) of each state tile (the split path stores them per chunk)."""
        return [(tuple(pow2(d) for d in self.shape), self.dtype)]

    def merge(self, ctx: Emitter, state: list, other: list) -> None:
        """Fold another chunk's state (same row, later edges) into `state`."""
        (acc,), (o,) = state, other
        ctx.emit(f"{acc} = ({_COMBINE[self._op()].format(a=acc, b=o)})"
                 f".to({tl_dtype(self.dtype)})")

    def finalize(self, ctx: Emitter, state: list) -> list:
        (acc,) = state
        if self.name == "mean":
            expr = f"{acc} / tl.maximum(cnt, 1).to({tl_dtype(self.dtype)})"
        elif self.name in ("max", "min"):
            expr = f"tl.where(cnt > 0, {acc}, 0)"
        else:
            expr = acc
        return [ctx.value(f"({expr}).to({tl_dtype(self.out_dtype)})", self.shape,
                          self.out_dtype, "row", "y")]


class OnlineSoftmax:
    """(running max, mass, accumulator), rescaled to the new maximum once per tile."""

    def __init__(self, score_type, value_type):
        self.s_shape, self.v_shape = tuple(score_type.shape), tuple(value_type.shape)
        self.out_dtype = as_dtype(value_type.dtype)
        self.dtype = state_dtype(value_type.dtype)
        self.extra = len(self.v_shape) - len(self.s_shape)

    def init(self, ctx: Emitter) -> list:
        t = tl_dtype(self.dtype)
        return [ctx.let(f"tl.full([{_dims(self.s_shape)}], float('-inf'), {t})", "smax"),
                ctx.let(f"tl.zeros([{_dims(self.s_shape)}], {t})", "smass"),
                ctx.let(f"tl.zeros([{_dims(self.v_shape)}], {t})", "sacc")]

    def _lift(self, expr: str) -> str:
        """A score-shaped tile against the value's trailing axes."""
        if not self.extra:
            return expr
        rank = 1 + len(self.s_shape)
        return f"({expr})[{', '.join([':'] * rank + ['None'] * self.extra)}]"

    def fold(self, ctx: Emitter, state: list, msgs: list) -> None:
        mx, mass, acc = state
        s, v = msgs
        t = tl_dtype(self.dtype)
        score = ctx.let(f"tl.where({valid_mask(len(self.s_shape))}, "
                        f"({tile(ctx, s, self.s_shape)}).to({t}), float('-inf'))", "sc")
        value = ctx.let(f"tl.where({valid_mask(len(self.v_shape))}, "
                        f"({tile(ctx, v, self.v_shape)}).to({t}), 0.0)", "vl")
        new = ctx.let(f"tl.maximum({mx}, tl.max({score}, axis=0, keep_dims=True))", "mnew")
        # a state that saw only -inf scores keeps a zero base, so exp() never sees -inf - -inf
        base = ctx.let(f"tl.where({new} == float('-inf'), 0.0, {new})", "base")
        alpha = ctx.let(f"tl.exp({mx} - {base})", "alpha")
        p = ctx.let(f"tl.exp({score} - {base})", "p")
        ctx.emit(f"{mass} = ({mass} * {alpha} + tl.sum({p}, axis=0, keep_dims=True)).to({t})")
        ctx.emit(f"{acc} = ({acc} * {self._lift(alpha)} + tl.sum({self._lift(p)} * {value}, "
                 f"axis=0, keep_dims=True)).to({t})")
        ctx.emit(f"{mx} = {new}.to({t})")

    def layout(self) -> list:
        s = tuple(pow2(d) for d in self.s_shape)
        return [(s, self.dtype), (s, self.dtype), (tuple(pow2(d) for d in self.v_shape),
                                                    self.dtype)]

    def merge(self, ctx: Emitter, state: list, other: list) -> None:
        """Two (max, mass, acc) states rescaled to their common maximum."""
        (mx, mass, acc), (omx, omass, oacc) = state, other
        t = tl_dtype(self.dtype)
        new = ctx.let(f"tl.maximum({mx}, {omx})", "mnew")
        base = ctx.let(f"tl.where({new} == float('-inf'), 0.0, {new})", "base")
        a = ctx.let(f"tl.exp({mx} - {base})", "alpha")
        b = ctx.let(f"tl.exp({omx} - {base})", "beta")
        ctx.emit(f"{mass} = ({mass} * {a} + {omass} * {b}).to({t})")
        ctx.emit(f"{acc} = ({acc} * {self._lift(a)} + {oacc} * {self._lift(b)}).to({t})")
        ctx.emit(f"{mx} = {new}.to({t})")

    def finalize(self, ctx: Emitter, state: list) -> list:
        _, mass, acc = state
        safe = f"tl.where({mass} > 0, {mass}, 1.0)"
        expr = f"tl.where({self._lift(mass + ' > 0')}, {acc} / {self._lift(safe)}, 0.0)"
        return [ctx.value(f"({expr}).to({tl_dtype(self.out_dtype)})", self.v_shape,
                          self.out_dtype, "row", "y")]


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
    return [(Fold(reducer.name, t), (i,)) for i, t in enumerate(msg_types)]
