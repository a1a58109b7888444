"""lower/triton: reductions over row axes. Padded lanes are set to the reduction's identity
first (their values are unspecified), then the axes are reduced from the last one down."""
from __future__ import annotations

from ....core.prims.reductions import reduce_p
from ...registry import lowering_rules
from ..emitter import TV, TritonUnsupported, tl_dtype

R = lowering_rules["triton"]
_FN = {"reduce_sum": "tl.sum({x}, axis={a})", "reduce_max": "tl.max({x}, axis={a})",
       "reduce_min": "tl.min({x}, axis={a})",
       "reduce_prod": "tl.reduce({x}, {a}, _tiga_mul)",
       # float max/min keep NaN, as the reference's numpy does (tl.max drops it)
       "nan_reduce_max": "tl.reduce({x}, {a}, _tiga_max)",
       "nan_reduce_min": "tl.reduce({x}, {a}, _tiga_min)"}
_HELPER = {"reduce_prod": "_tiga_mul", "nan_reduce_max": "_tiga_max",
           "nan_reduce_min": "_tiga_min"}


def identity(name: str, dtype) -> str:
    """The identity of a reduction as a Python literal for `dtype`."""
    import numpy as np

    if name in ("reduce_sum", "sum", "mean"):
        return "0.0" if dtype.is_float else "0"
    if name in ("reduce_prod", "prod"):
        return "1.0" if dtype.is_float else "1"
    high = name in ("reduce_min", "min")
    if dtype.is_float:
        return "float('inf')" if high else "float('-inf')"
    if dtype.name == "bool":
        return "1" if high else "0"
    info = np.iinfo(dtype.np)
    return str(int(info.max if high else info.min))


def reduce_rule(name):
    def rule(ctx, in_types, out_types, x: TV, *, axes):
        out = out_types[0]
        if x.lead == "const" or not axes:
            return [x]
        if x.dtype.name == "bool":
            raise TritonUnsupported(f"{name} over bool")
        fn = (f"nan_{name}" if name in ("reduce_max", "reduce_min") and x.dtype.is_float
            else name)
        if fn in _HELPER:
            ctx.helpers.add(_HELPER[fn])
        expr = x.expr
        masks = [m for m in (ctx.axis_mask(x.shape, a) for a in axes) if m is not None]
        if masks:
            expr = f"tl.where({' & '.join(masks)}, {expr}, {identity(name, x.dtype)})"
        for a in sorted(axes, reverse=True):
            expr = _FN[fn].format(x=expr, a=a + 1)
        return [ctx.value(f"({expr}).to({tl_dtype(out.dtype)})", out.shape, out.dtype,
                          x.lead, "r")]
    return rule


for _n, _p in reduce_p.items():
    R[_p] = reduce_rule(_n)
