"""lower/triton: `dot_general`s of an edge function or update (edge MLPs, per-head dots).

A tile of edges times a weight, `[lanes, K] x [K, N]` (a per-edge row against a parameter
matrix), is one `tl.dot` where the tile has tl.dot's minimum of 16 lanes and K and N pad to
16 or more: the contracted lanes past K are masked to 0 in both operands (padded columns
past N hold unspecified values, as every padded lane: never stored). Products accumulate in
float32 (float64 for float64), exact float32 (ieee) for float32 operands, tensor cores for
float16 / bfloat16. Each output row reads its own edge's row only, so an invalid lane's
values never reach a valid one. Anything else (narrower operands, several free axes,
per-edge weights) is a broadcast product summed over the contracted axis."""
from __future__ import annotations

from ....core.prims.linalg import dot_general_p
from ...registry import lowering_rules
from ..emitter import TV, TritonUnsupported, pow2, tl_dtype

R = lowering_rules["triton"]


def _permuted(ctx, v: TV, order: list) -> str:
    if order == sorted(order):
        return v.expr
    return f"tl.permute({v.expr}, (0, {', '.join(str(a + 1) for a in order)}))"


def _masked(ctx, v: TV, expr: str, axis: int) -> str:
    m = ctx.axis_mask(v.shape, axis)
    return expr if m is None else f"tl.where({m}, {expr}, 0)"


def _index(n_lead_free: int, middle: int, n_tail: int, keep_middle: bool = True) -> str:
    parts = ([":"] + [":"] * n_lead_free + ([":"] * middle if keep_middle else []) +
        ["None"] * n_tail)
    return "[" + ", ".join(parts) + "]"


def dot_general_rule(ctx, in_types, out_types, x: TV, y: TV, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    out = out_types[0]
    if lb or rb or len(lc) != 1 or x.lead == "const" or y.lead == "const":
        raise TritonUnsupported("dot_general with batch axes or several contracted axes")
    (a,), (b,) = lc, rc
    xs = _masked(ctx, x, x.expr, a)
    ys = _masked(ctx, y, y.expr, b)
    if _tiled(ctx, x, y, a, out):
        return [_tile_dot(ctx, x, y, xs, ys, b, out)]
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


TILE_DOT_LANES = 16     # tl.dot's minimum rows: an edge tile with fewer lanes broadcasts
_DOT_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def tile_dot_form(x_shape, y_shape, contracted: int, dtypes: set) -> bool:
    """Whether a per-edge value of shape `x_shape` (K,) or (1, .., K), contracted over its
    last axis with a 2-D parameter matrix `y_shape`, is a tl.dot of the edge tile (given
    TILE_DOT_LANES lanes): one float dtype for both operands and the result (`dtypes`, its
    names) and both matrix sides padding to 16 or more. select_kernel_schedule asks the
    same question to size row tiles (the matrix is then held once per program)."""
    return (contracted == len(x_shape) - 1 and all(d == 1 for d in x_shape[:-1]) and
            len(y_shape) == 2 and all(type(d) is int for d in y_shape) and
            len(dtypes) == 1 and dtypes <= _DOT_FLOATS and min(pow2(d) for d in y_shape) >= 16)


def _tiled(ctx, x: TV, y: TV, a: int, out) -> bool:
    """An edge tile's rows (K,) or (1, .., K) times a parameter matrix, wide enough for
    tl.dot."""
    return (x.lead == "edge" and y.lead == "row" and ctx.edge_lanes >= TILE_DOT_LANES and
            tile_dot_form(x.shape, y.shape, a, {x.dtype.name, y.dtype.name, out.dtype.name}))


def _tile_dot(ctx, x: TV, y: TV, xs: str, ys: str, b: int, out) -> TV:
    """[lanes, K] x [K, N] as one tl.dot; y is [1, K, N] (b == 0) or [1, N, K] (b == 1);
    x's and the result's unit axes (a (1, K) row) are reshaped away and back."""
    k = pow2(x.shape[-1])
    xt = xs if len(x.shape) == 1 else f"tl.reshape({xs}, [{ctx.lanes}, {k}])"
    w = f"tl.reshape({ys}, ({pow2(y.shape[0])}, {pow2(y.shape[1])}))"
    w = w if b == 0 else f"tl.trans({w})"
    acc = "tl.float64" if out.dtype.name == "float64" else "tl.float32"
    expr = f"tl.dot({xt}, {w}, input_precision=\"ieee\", out_dtype={acc})"
    if len(out.shape) > 1:
        expr = f"({expr})[:, {', '.join(['None'] * (len(out.shape) - 1))}, :]"
    return ctx.value(f"({expr}).to({tl_dtype(out.dtype)})", out.shape, out.dtype, "edge", "d")


R[dot_general_p] = dot_general_rule
