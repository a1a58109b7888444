"""lower/triton: elementwise and math primitives, one Triton expression per tile.

Rank-0 operands broadcast against a row (core's only broadcast), by trailing unit axes.
Math follows the reference's formulas where Triton has no direct function (logistic in its
two-sided form, rsqrt as 1/sqrt) so results agree to rounding.
"""
from __future__ import annotations

from ...registry import register_elementwise
from ..emitter import TV, TritonUnsupported, tl_dtype

_UNARY = {
    "neg": "-({x})", "exp": "tl.exp({x})", "log": "tl.log({x})", "sqrt": "tl.sqrt({x})",
    "rsqrt": "(1.0 / tl.sqrt({x}))", "abs": "tl.abs({x})", "sin": "tl.sin({x})",
    "cos": "tl.cos({x})", "floor": "tl.floor({x})", "ceil": "tl.ceil({x})",
    "log1p": "tl.log(1.0 + {x})", "expm1": "(tl.exp({x}) - 1.0)",
    "erf": "tl.erf({x})",
    # two-sided forms: never exponentiate a large positive number
    "logistic": "tl.where({x} >= 0, 1.0 / (1.0 + tl.exp(-tl.abs({x}))), "
                "tl.exp(-tl.abs({x})) / (1.0 + tl.exp(-tl.abs({x}))))",
    "tanh": "tl.where({x} >= 0, 1.0, -1.0) * (1.0 - 2.0 / (tl.exp(2.0 * tl.abs({x})) + 1.0))",
    "sign": "tl.where({x} > 0, 1, 0) - tl.where({x} < 0, 1, 0)",
    "not": "({x} == 0)",
}
_BINARY = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})",
           "div": "({a} / {b})",
           # NaN wins, as numpy's maximum/minimum (tl.maximum's default drops it)
           "max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
           "min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
           "and": "({a} & {b})", "or": "({a} | {b})"}
_HALF = ("float16", "bfloat16")
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _lead(*vals: TV) -> str:
    leads = {v.lead for v in vals}
    return "edge" if "edge" in leads else ("row" if "row" in leads else "const")


def _cast(ctx, expr: str, v: TV, out) -> str:
    """`expr` in the output dtype (a weak literal adapts by itself)."""
    if v.lead == "const" or v.dtype == out.dtype:
        return expr
    return f"({expr}).to({tl_dtype(out.dtype)})"


def _out(ctx, expr: str, out, *vals: TV, hint="e") -> list:
    lead = _lead(*vals)
    if lead == "const":   # an op on literals only: a row value
        expr = f"tl.full([1], {expr}, {tl_dtype(out.dtype)})"
        lead = "row"
    return [ctx.value(expr, out.shape, out.dtype, lead, hint)]


def _unary_rule(name):
    def rule(ctx, in_types, out_types, x, **params):
        if name == "sign" and not x.dtype.is_float:
            expr = (f"(tl.where({x.expr} > 0, 1, 0) - tl.where({x.expr} < 0, 1, 0))"
                    f".to({tl_dtype(x.dtype)})")
        elif name == "sign":
            expr = (f"tl.where({x.expr} > 0, 1.0, tl.where({x.expr} < 0, -1.0, {x.expr}))"
                    f".to({tl_dtype(x.dtype)})")
        elif name == "abs" and not x.dtype.is_float:
            expr = f"tl.where({x.expr} < 0, -{x.expr}, {x.expr})"
        else:
            arg = x.expr
            if x.dtype.name in _HALF and name not in ("neg", "not", "abs"):
                # Triton's math functions take float32/float64 only (compiled and
                # interpreted); numpy computes a half's exp in float32 and rounds, too
                arg = f"({arg}).to(tl.float32)"
            expr = _UNARY[name].format(x=arg)
            if x.dtype.is_float and name not in ("neg", "not", "abs"):
                expr = f"({expr}).to({tl_dtype(x.dtype)})"
        return _out(ctx, expr, out_types[0], x)
    return rule


def _operands(ctx, out, *vals: TV) -> list:
    rank = len(out.shape)
    return [_cast(ctx, ctx.expand(v, rank), v, out) for v in vals]


def _binary_rule(name):
    def rule(ctx, in_types, out_types, a, b, **params):
        out = out_types[0]
        xa, xb = _operands(ctx, out, a, b)
        if name == "pow":
            if not out.dtype.is_float:
                raise TritonUnsupported("pow on integers")
            if out.dtype.name in _HALF:   # (tl.exp/tl.log: float32/float64 only)
                xa, xb = (x if v.lead == "const" else f"({x}).to(tl.float32)"
                          for x, v in ((xa, a), (xb, b)))
            expr = f"tl.exp({xb} * tl.log({xa}))"
            if b.lead == "const" and float(b.expr) == 2.0:
                expr = f"({xa} * {xa})"
            elif b.lead == "const" and float(b.expr).is_integer():
                expr = _int_power(xa, int(float(b.expr)))
            else:   # libdevice pow is not available to the interpreter; exp/log keeps
                # the sign rule of a positive base and the 0**y limits of the reference
                expr = (f"tl.where({xa} == 0, tl.where({xb} == 0, 1.0, "
                        f"tl.where({xb} > 0, 0.0, float('inf'))), {expr})")
            return _out(ctx, f"({expr}).to({tl_dtype(out.dtype)})", out, a, b)
        return _out(ctx, _BINARY[name].format(a=xa, b=xb), out, a, b)
    return rule


def _int_power(x: str, n: int) -> str:
    if n == 0:
        return f"({x} * 0 + 1)"
    body = " * ".join([f"({x})"] * abs(n))
    return f"({body})" if n > 0 else f"(1.0 / ({body}))"


def _compare_rule(name):
    def rule(ctx, in_types, out_types, a, b, **params):
        # operands meet in the strong operand's dtype, as in the reference
        strong = [v for v in (a, b) if v.lead != "const"]
        common = strong[0] if strong else a
        rank = max(len(a.shape), len(b.shape))
        xa = _cast(ctx, ctx.expand(a, rank), a, common)
        xb = _cast(ctx, ctx.expand(b, rank), b, common)
        return _out(ctx, f"({xa} {_COMPARE[name]} {xb})", out_types[0], a, b)
    return rule


def select_rule(ctx, in_types, out_types, pred, x, y, **params):
    out = out_types[0]
    xp = ctx.expand(pred, len(out.shape))
    xx, xy = _operands(ctx, out, x, y)
    expr = f"tl.where({xp}, {xx}, {xy})"
    if x.lead == "const" and y.lead == "const":
        expr = f"({expr}).to({tl_dtype(out.dtype)})"
    return _out(ctx, expr, out, pred, x, y)


def convert_rule(ctx, in_types, out_types, x, *, new_dtype):
    out = out_types[0]
    if x.lead == "const":
        return _out(ctx, x.expr, out, x)
    if out.dtype.name == "bool":
        return _out(ctx, f"({x.expr} != 0)", out, x)
    return _out(ctx, f"{x.expr}.to({tl_dtype(out.dtype)})", out, x)


def stop_gradient_rule(ctx, in_types, out_types, x, **params):
    return [x]


register_elementwise("triton", _unary_rule, _binary_rule, _compare_rule, select_rule,
                     convert_rule, stop_gradient_rule)
