"""lower/llvm: elementwise and math primitives: one loop nest over the output row shape.

Transcendentals use LLVM intrinsics where LLVM has them (exp, log, sqrt, sin, cos, pow,
floor, ceil, fabs) and the C math library otherwise (log1p, expm1, tanh, erf), resolved
from the process when the object is loaded. No fast-math flags: results follow IEEE
semantics like the numpy reference (NaN propagation in max/min included).
"""
from __future__ import annotations

from llvmlite import ir

from ...registry import register_elementwise
from ..values import F16, F32, CodegenUnsupported, Val, cast, const

_INTRINSIC = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "sin": "llvm.sin",
              "cos": "llvm.cos", "floor": "llvm.floor", "ceil": "llvm.ceil", "abs": "llvm.fabs"}
_LIBM = ("log1p", "expm1", "tanh", "erf")
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def elementwise(ctx, out_type, vals: list, fn) -> Val:
    """out[idx] = fn(*(v[idx] for v in vals)); rank-0 operands broadcast."""
    shape = tuple(out_type.shape)
    b = ctx.b
    if not shape or all(v.is_scalar for v in vals):
        return Val(shape, out_type.dtype, scalar=fn(*[v.load(b, []) for v in vals]))
    out = ctx.new_buf(shape, out_type.dtype)
    ctx.loop_nest(shape, lambda idx: out.store(b, idx, fn(*[v.load(b, idx) for v in vals])))
    return out


def op_dtype(in_types):
    """The dtype operands meet in: the strong one (a weak Python scalar adapts)."""
    strong = [t.dtype for t in in_types if not t.weak]
    return strong[0] if strong else in_types[0].dtype


def _casting(b, vals, dtype, fn):
    def run(*xs):
        return fn(*[cast(b, x, v.dtype, dtype) for x, v in zip(xs, vals)])
    return run


# ---- unary ---------------------------------------------------------------------------------

def _float_unary(ctx, name, x):
    b = ctx.b
    if name == "neg":
        return b.fneg(x)
    if name in _INTRINSIC:
        return b.call(ctx.intrinsic(_INTRINSIC[name], x.type), [x])
    if name in _LIBM:
        if x.type == F16:  # C has no half math: compute in float, round once
            return b.fptrunc(b.call(ctx.libm(name, F32), [b.fpext(x, F32)]), F16)
        return b.call(ctx.libm(name, x.type), [x])
    one = ir.Constant(x.type, 1.0)
    if name == "rsqrt":
        return b.fdiv(one, b.call(ctx.intrinsic("llvm.sqrt", x.type), [x]))
    if name == "logistic":
        # two-sided form like the reference: never exponentiates a large positive number
        e = b.call(ctx.intrinsic("llvm.exp", x.type),
                   [b.fneg(b.call(ctx.intrinsic("llvm.fabs", x.type), [x]))])
        den = b.fadd(one, e)
        pos = b.fcmp_ordered(">=", x, ir.Constant(x.type, 0.0))
        return b.select(pos, b.fdiv(one, den), b.fdiv(e, den))
    if name == "sign":
        zero = ir.Constant(x.type, 0.0)
        neg = b.select(b.fcmp_ordered("<", x, zero), ir.Constant(x.type, -1.0), x)
        return b.select(b.fcmp_ordered(">", x, zero), one, neg)
    raise CodegenUnsupported(f"{name} on floating operands has no cpu-llvm lowering")


def _int_unary(ctx, name, x, dtype):
    b = ctx.b
    zero = ir.Constant(x.type, 0)
    if dtype.name == "bool":
        if name == "not":
            return b.xor(x, ir.Constant(x.type, 1))
        raise CodegenUnsupported(f"{name} on bool operands has no cpu-llvm lowering")
    if name == "neg":
        return b.sub(zero, x)
    if name == "abs":
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    if name == "sign":
        neg = b.select(b.icmp_signed("<", x, zero), ir.Constant(x.type, -1), zero)
        return b.select(b.icmp_signed(">", x, zero), ir.Constant(x.type, 1), neg)
    raise CodegenUnsupported(f"{name} on integer operands has no cpu-llvm lowering")


def _unary_rule(name):
    def rule(ctx, in_types, out_types, x, **params):
        dtype = out_types[0].dtype
        if dtype.is_float:
            fn = _casting(ctx.b, [x], dtype, lambda v: _float_unary(ctx, name, v))
        else:
            fn = _casting(ctx.b, [x], dtype, lambda v: _int_unary(ctx, name, v, dtype))
        return [elementwise(ctx, out_types[0], [x], fn)]
    return rule


# ---- binary --------------------------------------------------------------------------------

def _float_binary(ctx, name, x, y):
    b = ctx.b
    simple = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}
    if name in simple:
        return simple[name](x, y)
    if name == "pow":
        return b.call(ctx.intrinsic("llvm.pow", x.type), [x, y])
    if name in ("max", "min"):
        # numpy maximum/minimum: a NaN in either operand wins
        better = b.fcmp_ordered(">" if name == "max" else "<", x, y)
        pick = b.select(better, x, y)
        return b.select(b.fcmp_unordered("uno", x, x), x, pick)
    raise CodegenUnsupported(f"{name} on floating operands has no cpu-llvm lowering")


def _int_binary(ctx, name, x, y, dtype):
    b = ctx.b
    if dtype.name == "bool":
        if name in ("and", "or"):
            return (b.and_ if name == "and" else b.or_)(x, y)
        raise CodegenUnsupported(f"{name} on bool operands has no cpu-llvm lowering")
    simple = {"add": b.add, "sub": b.sub, "mul": b.mul}
    if name in simple:
        return simple[name](x, y)
    if name in ("max", "min"):
        return b.select(b.icmp_signed(">" if name == "max" else "<", x, y), x, y)
    raise CodegenUnsupported(f"integer {name} has no cpu-llvm lowering (numpy's true-divide "
                             "and power semantics on integers are not compiled)")


def _binary_rule(name):
    def rule(ctx, in_types, out_types, x, y, **params):
        dtype = out_types[0].dtype
        if dtype.is_float:
            op = (lambda u, v: _float_binary(ctx, name, u, v))
        else:
            op = (lambda u, v: _int_binary(ctx, name, u, v, dtype))
        return [elementwise(ctx, out_types[0], [x, y], _casting(ctx.b, [x, y], dtype, op))]
    return rule


def _compare_rule(name):
    def rule(ctx, in_types, out_types, x, y, **params):
        dtype = op_dtype(in_types)
        b = ctx.b

        def op(u, v):
            if dtype.is_float:
                if name == "ne":  # numpy: NaN != anything is True
                    return b.fcmp_unordered("!=", u, v)
                return b.fcmp_ordered(_FCMP[name], u, v)
            if dtype.name == "bool":
                return b.icmp_unsigned(_ICMP[name], u, v)
            return b.icmp_signed(_ICMP[name], u, v)

        return [elementwise(ctx, out_types[0], [x, y], _casting(b, [x, y], dtype, op))]
    return rule


def select_rule(ctx, in_types, out_types, pred, x, y):
    dtype = out_types[0].dtype
    b = ctx.b

    def op(p, u, v):
        return b.select(p, cast(b, u, x.dtype, dtype), cast(b, v, y.dtype, dtype))

    return [elementwise(ctx, out_types[0], [pred, x, y], op)]


def convert_rule(ctx, in_types, out_types, x, *, new_dtype):
    dtype = out_types[0].dtype
    if x.dtype == dtype:
        return [x]
    return [elementwise(ctx, out_types[0], [x], lambda u: cast(ctx.b, u, x.dtype, dtype))]


def identity_rule(ctx, in_types, out_types, x):
    return [x]


register_elementwise("cpu-llvm", _unary_rule, _binary_rule, _compare_rule, select_rule,
                     convert_rule, identity_rule)

__all__ = ["elementwise", "op_dtype", "const"]
