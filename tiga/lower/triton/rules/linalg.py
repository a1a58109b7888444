"""lower/triton: small `dot_general`s (edge MLPs, per-head dots) as broadcast products summed
over the contracted axis: the operands are a few dozen wide, below tl.dot's 16x16 minimum,
and a tile of edges times a weight matrix is one broadcast multiply."""
from __future__ import annotations

from ....core.prims.linalg import dot_general_p
from ...registry import lowering_rules
from ..emitter import TV, TritonUnsupported, tl_dtype

R = lowering_rules["triton"]


def _permuted(ctx, v: TV, order: list) -> str:
    if order == sorted(order):
        return v.expr
    return f"tl.permute({v.expr}, (0, {', '.join(str(a + 1) for a in order)}))"


def _masked(ctx, v: TV, expr: str, axis: int) -> str:
    m = ctx.axis_mask(v.shape, axis)
    return expr if m is None else f"tl.where({m}, {expr}, 0)"


def _index(n_lead_free: int, middle: int, n_tail: int, keep_middle: bool = True) -> str:
    parts = [":"] + [":"] * n_lead_free + ([":"] * middle if keep_middle else []) + \
        ["None"] * n_tail
    return "[" + ", ".join(parts) + "]"


def dot_general_rule(ctx, in_types, out_types, x: TV, y: TV, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    out = out_types[0]
    if lb or rb or len(lc) != 1 or x.lead == "const" or y.lead == "const":
        raise TritonUnsupported("dot_general with batch axes or several contracted axes")
    (a,), (b,) = lc, rc
    xs = _masked(ctx, x, x.expr, a)
    ys = _masked(ctx, y, y.expr, b)
    xfree = [i for i in range(len(x.shape)) if i != a]
    yfree = [i for i in range(len(y.shape)) if i != b]
    xp = _permuted(ctx, TV(xs, x.shape, x.dtype, x.lead), xfree + [a])
    yp = _permuted(ctx, TV(ys, y.shape, y.dtype, y.lead), [b] + yfree)
    # x: [L, xfree..., K, None * len(yfree)]   y: [L, None * len(xfree), K, yfree...]
    xe = f"({xp})[{', '.join([':'] * (1 + len(xfree) + 1) + ['None'] * len(yfree))}]"
    ye = f"({yp})[{', '.join([':'] + ['None'] * len(xfree) + [':'] * (1 + len(yfree)))}]"
    acc = "tl.float32" if out.dtype.name in ("float16", "bfloat16") else tl_dtype(out.dtype)
    expr = f"tl.sum(({xe}).to({acc}) * ({ye}).to({acc}), axis={1 + len(xfree)})"
    lead = "edge" if "edge" in (x.lead, y.lead) else "row"
    return [ctx.value(f"({expr}).to({tl_dtype(out.dtype)})", out.shape, out.dtype, lead, "d")]


R[dot_general_p] = dot_general_rule
