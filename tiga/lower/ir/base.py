"""lower/ir: what every IR level shares: values, regions, gf_tensor ops, relations, modules,
the op registry and the SSA verifier.

Regions are isolated from above (everything they read arrives as a block argument), so a
value name is unique within its region and a nested region starts a fresh scope.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ...core.errors import CompilationError
from ...core.primitive import abstract_eval_rules, get_primitive
from ...core.types import GraphType, TensorType
from .syntax import VALUE_NAME_RE, AttrDict, format_type, to_attr


@dataclass(frozen=True)
class Value:
    """An SSA value `%name` of a type."""

    name: str
    type: Any


@dataclass(frozen=True)
class Region:
    """One block: `^bb0(args): ops; yield results`."""

    args: tuple
    ops: tuple
    results: tuple


@dataclass(frozen=True)
class GenericOp:
    """The generic form every structured op prints through: `"name"(...) ({...}) {...} : sig`."""

    name: str
    results: tuple
    operands: tuple
    regions: tuple = ()
    attrs: tuple = ()


_MISSING = object()


class AttrReader:
    """Consume an op's attributes by name; what is left over is an unknown attribute."""

    def __init__(self, op_name: str, attrs: tuple):
        self.op_name = op_name
        self.attrs = dict(attrs)

    def take(self, key: str, default=_MISSING):
        if key in self.attrs:
            return self.attrs.pop(key)
        if default is _MISSING:
            raise CompilationError(f"{self.op_name}: missing attribute {key!r}")
        return default

    def done(self) -> None:
        if self.attrs:
            raise CompilationError(f"{self.op_name}: unknown attribute "
                                   f"{', '.join(map(repr, self.attrs))}")


# ---- registries ------------------------------------------------------------------------------

OP_CLASSES: dict[str, type] = {}       # generic op name -> class with from_generic
TERMINATOR_OF: dict[str, str] = {"gf_tensor": "gf_tensor.yield", "func": "func.return"}
MODULE_CLASSES: dict[str, type] = {}   # level -> Module subclass
LEVEL_OPS: dict[str, tuple] = {}       # level -> (classes allowed at top level, nested)


def register_op(cls):
    OP_CLASSES[cls.op_name] = cls
    TERMINATOR_OF[cls.op_name] = cls.terminator
    return cls


def register_level(cls, top: tuple, nested: tuple):
    MODULE_CLASSES[cls.level] = cls
    LEVEL_OPS[cls.level] = (top, nested)
    return cls


def terminator_for(op_name: str) -> str:
    if op_name.startswith("gf_tensor."):
        return TERMINATOR_OF["gf_tensor"]
    return TERMINATOR_OF[op_name]


# ---- gf_tensor ops ---------------------------------------------------------------------------

FLOAT_SPELL = {
    "add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
    "max": "arith.maximumf", "min": "arith.minimumf", "neg": "arith.negf", "pow": "math.powf",
    "exp": "math.exp", "log": "math.log", "log1p": "math.log1p", "expm1": "math.expm1",
    "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "abs": "math.absf", "tanh": "math.tanh",
    "erf": "math.erf", "sin": "math.sin", "cos": "math.cos", "floor": "math.floor",
    "ceil": "math.ceil"}
INT_SPELL = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli",
             "max": "arith.maxsi", "min": "arith.minsi"}
SPELL_TO_PRIM = {v: k for table in (FLOAT_SPELL, INT_SPELL) for k, v in table.items()}
SPELL_TO_PRIM.update({"arith.constant": "constant", "gf_tensor.constant": "constant"})


def spelling(prim: str, in_types: list, out_types: list) -> str:
    """Scalar elementwise ops read as MLIR arith/math; everything else is gf_tensor.<prim>."""
    if prim == "constant":
        return "arith.constant" if out_types[0].shape == () else "gf_tensor.constant"
    types = list(in_types) + list(out_types)
    if (len(out_types) == 1 and in_types and all(t == types[0] for t in types)
            and isinstance(types[0], TensorType) and types[0].shape == ()):
        d = types[0].dtype
        table = FLOAT_SPELL if d.is_float else INT_SPELL if d.kind == "int" else {}
        if prim in table:
            return table[prim]
    return f"gf_tensor.{prim}"


@dataclass(frozen=True)
class TensorOp:
    """One GraphProgram equation: `gf_tensor.<prim>` (arith/math spelling for scalars).

    `params` keeps the equation's parameters in order; a sub-program parameter is a Region.
    `prim == "constant"` is a literal with `params == (("value", v),)`.
    """

    prim: str
    operands: tuple
    results: tuple
    params: tuple = ()
    op_name: ClassVar[str] = "gf_tensor"

    @property
    def name(self) -> str:
        return spelling(self.prim, [v.type for v in self.operands],
                        [v.type for v in self.results])

    @property
    def regions(self) -> tuple:
        return tuple(v for _, v in self.params if isinstance(v, Region))

    def verify(self, where: str, level: str) -> None:
        if self.prim == "constant":
            return _verify_constant(self, where)
        if self.prim == "propagate":
            raise CompilationError(f"{where}: propagate is written as gf.apply (or a lower-level "
                                   "traversal op), not gf_tensor.propagate")
        try:
            prim = get_primitive(self.prim)
        except KeyError:
            raise CompilationError(f"{where}: unknown primitive {self.prim!r}") from None
        from .convert import closed_from_region

        params = {}
        for k, v in self.params:
            if isinstance(v, Region):
                verify_region(v, f"{where} {k} region", level, LEVEL_OPS[level][1])
                v = closed_from_region(v)
            params[k] = v
        check_rule(prim, self.operands, self.results, params, where)


def check_rule(prim, operands, results, params: dict, where: str) -> None:
    """Type-check an op with the primitive's abstract-eval rule."""
    for v in operands:
        if not isinstance(v.type, (TensorType, GraphType)):
            raise CompilationError(f"{where}: operand %{v.name} of type {format_type(v.type)} "
                                   f"cannot feed {prim.name} (events order tasks only)")
    try:
        expected = abstract_eval_rules[prim](*[v.type for v in operands], **params)
    except Exception as exc:  # noqa: BLE001 - the rule's own error is the finding
        raise CompilationError(f"{where}: {prim.name} rejects its operands: {exc}") from None
    found = [strip(v.type) for v in results]
    if [strip(t) for t in expected] != found:
        raise CompilationError(
            f"{where}: results typed ({', '.join(format_type(t) for t in found)}) but "
            f"{prim.name} gives ({', '.join(format_type(strip(t)) for t in expected)})")


def strip(t):
    return t.strong() if isinstance(t, TensorType) else t


def _verify_constant(op: TensorOp, where: str) -> None:
    if op.operands or len(op.results) != 1 or [k for k, _ in op.params] != ["value"]:
        raise CompilationError(f"{where}: a constant has no operands, one result and a value")
    t, value = op.results[0].type, op.params[0][1]
    if not isinstance(t, TensorType) or t.is_symbolic:
        raise CompilationError(f"{where}: a constant needs a static tensor type, found "
                               f"{format_type(t)}")
    flat = value if isinstance(value, tuple) else (value,)
    size = 1
    for d in t.shape:
        size *= d
    if len(flat) != size or (t.shape == () and isinstance(value, tuple)):
        raise CompilationError(f"{where}: constant value has {len(flat)} element(s) but its "
                               f"type {format_type(t)} holds {size}")
    kinds = (bool,) if t.dtype.kind == "bool" else (int,) if t.dtype.is_int else (int, float)
    if not all(isinstance(x, kinds) and (t.dtype.kind == "bool" or not isinstance(x, bool))
               for x in flat):
        raise CompilationError(f"{where}: constant value {value!r} does not fit "
                               f"{format_type(t)}")


@register_op
@dataclass(frozen=True)
class RelationOp:
    """`gf.relation`: a relation fixed when the program was traced (a jit constant)."""

    result: Value
    attrs: tuple = ()
    op_name: ClassVar[str] = "gf.relation"
    terminator: ClassVar[str] = ""

    operands = ()
    regions = ()

    @property
    def results(self) -> tuple:
        return (self.result,)

    def to_generic(self) -> GenericOp:
        return GenericOp(self.op_name, (self.result,), (), (), self.attrs)

    @classmethod
    def from_generic(cls, g: GenericOp) -> RelationOp:
        if g.operands or g.regions or len(g.results) != 1:
            raise CompilationError("gf.relation: takes no operands or regions, has one result")
        return cls(g.results[0], g.attrs)

    def verify(self, where: str, level: str) -> None:
        if not isinstance(self.result.type, GraphType):
            raise CompilationError(f"{where}: gf.relation must produce a !gf.relation type")
        origin = dict(self.attrs).get("origin")
        if origin != "constant":
            raise CompilationError(f"{where}: gf.relation origin must be \"constant\", found "
                                   f"{origin!r}")


def op_label(op) -> str:
    return op.name if isinstance(op, TensorOp) else op.op_name


def tensor_params(params: dict) -> tuple:
    return tuple((k, v if isinstance(v, Region) else to_attr(v)) for k, v in params.items())


# ---- modules and verification ------------------------------------------------------------------

@dataclass(frozen=True)
class Module:
    """`module @name { func.func @main(args) -> results { ops } }` at one IR level."""

    name: str
    body: Region
    level: ClassVar[str] = ""

    def __str__(self) -> str:
        from .text import print_module

        return print_module(self)

    def verify(self) -> None:
        verify_module(self)


def verify_module(module: Module) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", module.name):
        raise CompilationError(f"module name {module.name!r} must be an identifier")
    if module.level not in LEVEL_OPS:
        raise CompilationError(f"unknown IR level {module.level!r}")
    verify_region(module.body, f"@{module.name}", module.level, LEVEL_OPS[module.level][0])


def verify_region(region: Region, where: str, level: str, allowed: tuple) -> None:
    """SSA (defined once, before use, with one type) and each op's own rules."""
    defined: dict[str, Any] = {}

    def define(v, at):
        if not isinstance(v, Value) or not re.fullmatch(VALUE_NAME_RE, v.name):
            raise CompilationError(f"{at}: {v!r} is not a value with a valid name")
        if v.name in defined:
            raise CompilationError(f"{at}: %{v.name} is defined twice (single assignment)")
        defined[v.name] = v.type

    def use(v, at):
        if v.name not in defined:
            raise CompilationError(f"{at}: %{v.name} is used before it is defined")
        if defined[v.name] != v.type:
            raise CompilationError(f"{at}: %{v.name} is used as {format_type(v.type)} but "
                                   f"defined as {format_type(defined[v.name])}")

    for a in region.args:
        define(a, f"{where} block arguments")
    for i, op in enumerate(region.ops):
        at = f"{where}, op {i} ({op_label(op)})"
        if not isinstance(op, allowed):
            raise CompilationError(f"{at}: {op_label(op)} is not allowed here in a {level} "
                                   "module (run the lowering passes in order: domain, iter, "
                                   "kernel, task)")
        for v in op.operands:
            use(v, at)
        op.verify(at, level)
        for v in op.results:
            define(v, at)
    for v in region.results:
        use(v, f"{where} terminator")


def dict_attr(pairs) -> AttrDict:
    return AttrDict(tuple(pairs))


def parse_checked(text: str, cls: type) -> Module:
    """Parse IR text, require the level of `cls`, and verify it."""
    from .text import parse_module

    module = parse_module(text)
    if not isinstance(module, cls):
        raise CompilationError(f"expected the {cls.level} level, found a {module.level} "
                               "module")
    module.verify()
    return module
