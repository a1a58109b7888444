"""lower/triton: the source builder: Triton values of one kernel body and the text they form.

Inside a propagate kernel every value of the edge function is a tile with a leading axis:
`BLOCK_N` neighbours for per-edge values, 1 for per-row values (destination rows, parameters,
reducer states), none for Python literals. Row axes are padded to the next power of two
(Triton tiles are power-of-two shaped); padded lanes hold unspecified values, so every
reduction over a row axis and every store masks them (`TV.shape` is the logical shape).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...core.dtypes import DType, as_dtype
from ...core.errors import UnsupportedError
from ...core.program import Lit

TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
            "float64": "tl.float64", "int8": "tl.int8", "int16": "tl.int16",
            "int32": "tl.int32", "int64": "tl.int64", "uint8": "tl.uint8", "bool": "tl.int1"}


class TritonUnsupported(UnsupportedError):
    """This propagate (or a primitive in it) has no Triton rendering yet; the runtime runs
    the reference interpreter for it (explain() says why; strict mode refuses it)."""


def pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def tl_dtype(dtype) -> str:
    name = as_dtype(dtype).name
    if name not in TL_DTYPE:
        raise TritonUnsupported(f"dtype {name} has no Triton type")
    return TL_DTYPE[name]


@dataclass(frozen=True)
class TV:
    """A Triton value: `expr` names it; `lead` is "edge" ([BLOCK_N, ...]), "row" ([1, ...])
    or "const" (a Python scalar, no axes); `shape` the logical row shape."""

    expr: str
    shape: tuple
    dtype: DType
    lead: str = "edge"

    @property
    def padded(self) -> tuple:
        return tuple(pow2(d) for d in self.shape)

    @property
    def exact(self) -> bool:
        return self.padded == tuple(self.shape)


class Emitter:
    """Lines of a kernel body, fresh names and the shared index vectors (`tl.arange`)."""

    def __init__(self, indent: int = 1):
        self.lines: list[str] = []
        self.indent = indent
        self.count = 0
        self.helpers: set = set()   # names of module-level @triton.jit helpers the body uses
        # the extent of a per-edge tile's lead axis; a row-tiled body (row_tiles.py) sets
        # row_tile to its rows per program: lanes are then rows x neighbours while the edge
        # function runs, the rows alone from the finalize on, and reducer states are
        # [row_tile, ...] ("edge"-led) instead of [1, ...]
        self.lanes = "BLOCK_N"
        self.row_tile: str | None = None
        # the lanes' count where the body knows it (its schedule's blocks; 0: unknown): a
        # product of an edge tile takes tl.dot only where it has tl.dot's 16 rows
        self.edge_lanes = 0

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def let(self, expr: str, hint: str = "v") -> str:
        name = self.fresh(hint)
        self.emit(f"{name} = {expr}")
        return name

    def value(self, expr: str, shape, dtype, lead: str, hint: str = "v") -> TV:
        return TV(self.let(expr, hint), tuple(shape), as_dtype(dtype), lead)

    @property
    def state_lead(self) -> str:
        """The lead of a reducer state and of what finalize makes of it."""
        return "row" if self.row_tile is None else "edge"

    def per_row(self, name: str, rank: int) -> str:
        """A per-row scalar (`cnt`) against a state of logical rank `rank`: one scalar, or a
        [row_tile] vector lifted by trailing unit axes."""
        if self.row_tile is None or rank == 0:
            return name
        return f"{name}[:, {', '.join(['None'] * rank)}]"

    # ---- index vectors and masks over padded row axes -----------------------------------

    @staticmethod
    def arange(p: int) -> str:
        return f"tl.arange(0, {p})"

    def axis_mask(self, shape: tuple, axis: int, lead: bool = True) -> str | None:
        """Mask of the valid lanes of one padded axis, shaped to broadcast against a tile
        (with its lead axis when `lead`)."""
        d, p = shape[axis], pow2(shape[axis])
        if d == p:
            return None
        k = len(shape)
        return f"({self.arange(p)}{_axis_index(axis + lead, k + lead)} < {d})"

    # ---- broadcasting ---------------------------------------------------------------------

    @staticmethod
    def expand(v: TV, rank: int) -> str:
        """`v` with trailing unit axes up to logical rank `rank` (core broadcasts rank-0
        operands only, so this only lifts a rank-0 tile against a larger row)."""
        if v.lead == "const" or len(v.shape) >= rank:
            return v.expr
        axes = [":"] * (1 + len(v.shape)) + ["None"] * (rank - len(v.shape))
        return f"{v.expr}[{', '.join(axes)}]"

    def operand(self, a, env: dict) -> TV:
        if isinstance(a, Lit):
            return literal(a)
        return env[id(a)]


def _axis_index(axis: int, rank: int) -> str:
    if rank == 1:
        return ""
    return "[" + ", ".join(":" if i == axis else "None" for i in range(rank)) + "]"


def literal(a: Lit) -> TV:
    import numpy as np

    value = np.asarray(a.value)
    flat = value.reshape(-1)
    if value.size == 0 or not (flat == flat[0]).all() and not np.isnan(flat).all():
        # (a uniform array, like zeros/full of a row shape, is one value every lane shares)
        raise TritonUnsupported(f"a non-uniform array literal of shape {value.shape} in an "
                                "edge function")
    x = flat[0].item()
    dtype = as_dtype(a.type.dtype)
    if dtype.is_float:
        text = repr(float(x)) if np.isfinite(x) else (
            "float('nan')" if np.isnan(x) else f"float('{'-' if x < 0 else ''}inf')")
    elif dtype.name == "bool":
        text = "True" if x else "False"
    else:
        text = repr(int(x))
    if a.type.shape:   # a uniform row literal: a row value every lane shares
        dims = "".join(f", {pow2(int(d))}" for d in a.type.shape)
        return TV(f"tl.full([1{dims}], {text}, {tl_dtype(dtype)})", tuple(a.type.shape),
                  dtype, "row")
    if not a.type.weak:
        return TV(f"tl.full([1], {text}, {tl_dtype(dtype)})", (), dtype, "row")
    return TV(text, (), dtype, "const")


def eval_program(ctx: Emitter, closed, args: list) -> list:
    """Render a sub-program (edge function or update) on tiles; returns its output values."""
    from ..registry import lowering_rules

    rules = lowering_rules["triton"]
    prog = closed.program
    env: dict[int, TV] = {}
    consts = [literal(Lit(c, v.type)) for c, v in zip(closed.consts, prog.in_binders)]
    for v, x in zip(prog.in_binders, consts + list(args)):
        env[id(v)] = x
    for eqn in prog.eqns:
        rule = rules.get(eqn.primitive)
        if rule is None:
            raise TritonUnsupported(f"primitive {eqn.primitive.name} has no Triton rendering")
        vals = [ctx.operand(a, env) for a in eqn.inputs]
        outs = rule(ctx, [a.type for a in eqn.inputs], [o.type for o in eqn.outputs], *vals,
                    **eqn.params)
        for o, val in zip(eqn.outputs, outs):
            env[id(o)] = val
    return [ctx.operand(a, env) for a in prog.outs]
