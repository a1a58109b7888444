"""lower/ir: what every IR level shares: values, regions, gf_tensor ops, relations, modules,
the op registry, the SSA verifier, the printer (text.py parses its output back) and the
conversion of regions back to GraphPrograms (which the verifier type-checks with).

Regions are isolated from above (everything they read arrives as a block argument), so a
value name is unique within its region and a nested region starts a fresh scope.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from ...core import reducers
from ...core.errors import CompilationError, UnsupportedError
from ...core.primitive import abstract_eval_rules, get_primitive
from ...core.prims.graph import propagate_p
from ...core.program import ClosedProgram, Eqn, GraphProgram, Lit, Var
from ...core.records import record
from ...core.types import GraphType, TensorType
from .syntax import VALUE_NAME_RE, AttrDict, RegionRef, format_attr, format_type, to_attr


@record
class Value:
    """An SSA value `%name` of a type."""

    name: str
    type: Any


@record
class Region:
    """One block: `^bb0(args): ops; yield results`."""

    args: tuple
    ops: tuple
    results: tuple


@record
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


@record
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
        return tuple(r for _, v in self.params if is_regions(v) for r in regions_of(v))

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
        params = {}
        for k, v in self.params:
            if is_regions(v):
                for r in regions_of(v):
                    verify_region(r, f"{where} {k} region", level, LEVEL_OPS[level][1])
                v = map_regions(v, closed_from_region)
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
@record
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
    return tuple((k, v if is_regions(v) else to_attr(v)) for k, v in params.items())


def is_regions(v) -> bool:
    """Whether a gf_tensor parameter is a sub-program: a Region, or a tuple of them (cond's
    branches)."""
    return isinstance(v, Region) or (isinstance(v, tuple) and v != ()
                                     and all(isinstance(r, Region) for r in v))


def regions_of(v) -> tuple:
    """The regions of a sub-program parameter (is_regions), in order."""
    return (v,) if isinstance(v, Region) else v


def map_regions(v, fn):
    """`fn` applied to each region of a sub-program parameter, keeping its shape."""
    return fn(v) if isinstance(v, Region) else tuple(fn(r) for r in v)


def walk_ops(region):
    """Every op of a region, each followed by the ops of its own regions (depth first)."""
    for op in region.ops:
        yield op
        for r in getattr(op, "regions", ()) or ():
            if hasattr(r, "ops"):
                yield from walk_ops(r)


# ---- modules and verification ------------------------------------------------------------------

@record
class Module:
    """`module @name { func.func @main(args) -> results { ops } }` at one IR level."""

    name: str
    body: Region
    level: ClassVar[str] = ""

    def __str__(self) -> str:
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


# ---- printing (text.py parses it back) -------------------------------------------------------


def print_module(module: Module) -> str:
    body = module.body
    args = ", ".join(f"%{a.name}: {format_type(a.type)}" for a in body.args)
    lines = [f'module @{module.name} attributes {{gf.level = "{module.level}"}} {{',
             f"  func.func @main({args}) -> {_result_sig(body.results)} {{"]
    lines += _print_ops(body.ops, 4)
    lines.append(_terminator("func.return", body.results, 4))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def print_op(op) -> str:
    """One op as it prints inside a module (regions included): the compile cache's key.

    Its own operands and results print by position (`%in0`, `%out0`; a value passed twice
    keeps one name), not by the module's names for them: those never change the code (a
    region is isolated from above), and two launches that differ only there (the 50 sweeps
    of a Python loop unrolled under tg.jit) must share one compiled kernel, not build 50."""
    if isinstance(op, TensorOp) and not op.regions:
        return "\n".join(_print_ops([op], 0)) + "\n"
    g = _to_generic(op)
    ins: dict = {}
    operands = tuple(Value(ins.setdefault(v.name, f"in{len(ins)}"), v.type) for v in g.operands)
    results = tuple(Value(f"out{i}", v.type) for i, v in enumerate(g.results))
    return "\n".join(_print_generic(replace(g, operands=operands, results=results), 0)) + "\n"


def _result_sig(values) -> str:
    types = [format_type(v.type) for v in values]
    return types[0] if len(types) == 1 else f"({', '.join(types)})"


def _names(values) -> str:
    return ", ".join(f"%{v.name}" for v in values)


def _terminator(name: str, values, indent: int) -> str:
    types = ", ".join(format_type(v.type) for v in values)
    return f'{" " * indent}"{name}"({_names(values)}) : ({types}) -> ()'


def _print_ops(ops, indent: int) -> list:
    lines = []
    for op in ops:
        if isinstance(op, TensorOp) and not op.regions:
            lines.append(" " * indent + _print_custom(op))
        else:
            lines += _print_generic(_to_generic(op), indent)
    return lines


def _to_generic(op) -> GenericOp:
    if not isinstance(op, TensorOp):
        return op.to_generic()
    regions, attrs = [], []
    for k, v in op.params:
        if is_regions(v):
            refs = []
            for r in regions_of(v):
                refs.append(RegionRef(len(regions)))
                regions.append(r)
            attrs.append((k, refs[0] if isinstance(v, Region) else tuple(refs)))
        else:
            attrs.append((k, v))
    return GenericOp(f"gf_tensor.{op.prim}", op.results, op.operands, tuple(regions),
                     tuple(attrs))


def _print_custom(op: TensorOp) -> str:
    lhs = f"{_names(op.results)} = " if op.results else ""
    in_types = [v.type for v in op.operands]
    out_types = [v.type for v in op.results]
    if op.prim == "constant":
        return f"{lhs}{op.name} {format_attr(op.params[0][1])} : {format_type(out_types[0])}"
    attrs = ("" if not op.params else
        " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in op.params) + "}")
    operands = f" {_names(op.operands)}" if op.operands else ""
    types = in_types + out_types
    if len(out_types) == 1 and in_types and all(t == types[0] for t in types):
        sig = format_type(types[0])
    else:
        sig = _func_sig(in_types, out_types)
    return f"{lhs}{op.name}{operands}{attrs} : {sig}"


def _func_sig(in_types, out_types) -> str:
    ins = ", ".join(format_type(t) for t in in_types)
    outs = [format_type(t) for t in out_types]
    return f"({ins}) -> {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}"


def _print_generic(g: GenericOp, indent: int) -> list:
    pad = " " * indent
    lhs = f"{_names(g.results)} = " if g.results else ""
    lines = [f'{pad}{lhs}"{g.name}"({_names(g.operands)})']
    term = terminator_for(g.name)
    for i, region in enumerate(g.regions):
        lines[-1] += " ({" if i == 0 else ", {"
        args = ", ".join(f"%{a.name}: {format_type(a.type)}" for a in region.args)
        lines.append(f"{pad}^bb0({args}):")
        lines += _print_ops(region.ops, indent + 2)
        lines.append(_terminator(term, region.results, indent + 2))
        lines.append(f"{pad}}}" + (")" if i == len(g.regions) - 1 else ""))
    inline = ", ".join(f"{k} = {format_attr(v)}" for k, v in g.attrs)
    if g.attrs and len(inline) <= 48:
        lines[-1] += f" {{{inline}}}"
    elif g.attrs:
        lines[-1] += " {"
        items = [f"{pad}  {k} = {format_attr(v)}" for k, v in g.attrs]
        lines += [s + "," for s in items[:-1]] + items[-1:]
        lines.append(f"{pad}}}")
    sig = (_func_sig([v.type for v in g.operands], [v.type for v in g.results])
        if g.results else f"({', '.join(format_type(v.type) for v in g.operands)}) -> ()")
    lines[-1] += f" : {sig}"
    return lines


# ---- back to GraphPrograms: primitives' abstract-eval rules type-check IR ops (the verifier
# above) and the reference interpreter runs any level (the oracle for lowering) -------------

def closed_from_region(region: Region) -> ClosedProgram:
    return ClosedProgram(program_from_region(region))


def program_from_module(module: Module) -> GraphProgram:
    """The module's function as a GraphProgram (every level keeps the computation)."""
    return program_from_region(module.body)


def program_from_region(region: Region) -> GraphProgram:
    env: dict[str, object] = {}
    binders = []
    for a in region.args:
        env[a.name] = Var(a.type)
        binders.append(env[a.name])
    eqns: list = []
    for op in region.ops:
        _convert_op(op, env, eqns)
    try:
        outs = tuple(env[v.name] for v in region.results)
    except KeyError as exc:
        raise CompilationError(f"%{exc.args[0]} is yielded but never defined") from None
    return GraphProgram(tuple(binders), tuple(eqns), outs)


def _convert_op(op, env: dict, eqns: list) -> None:
    if getattr(op, "op_name", "").startswith("gf_storage."):
        return  # transfers, releases and joins order work; they compute no values
    if getattr(op, "op_name", "") == "gf_task.launch":
        return _inline_task(op, env, eqns)
    if isinstance(op, TensorOp) and op.prim == "constant":
        (res,) = op.results
        t = res.type
        env[res.name] = Lit(np.reshape(np.asarray(op.params[0][1], t.dtype.np), t.shape), t)
        return
    try:
        inputs = tuple(env[v.name] for v in op.operands)
    except KeyError as exc:
        raise CompilationError(f"{op_label(op)}: %{exc.args[0]} is used before it is "
                               "defined") from None
    outs = tuple(Var(v.type) for v in op.results)
    if isinstance(op, TensorOp):
        params = {k: map_regions(v, closed_from_region) if is_regions(v) else v
                  for k, v in op.params}
        eqns.append(Eqn(get_primitive(op.prim), inputs, params, outs))
    elif hasattr(op, "comp"):
        eqns.append(Eqn(propagate_p, inputs, propagate_params(op.comp), outs))
    else:
        raise UnsupportedError(f"{op_label(op)} has no GraphProgram form",
                               hint="a constant relation is kept by digest only: lower a "
                                    "program that takes the relation as an argument")
    for v, var in zip(op.results, outs):
        env[v.name] = var


def _inline_task(op, env: dict, eqns: list) -> None:
    """A task computes what its region computes, once its events fired."""
    inner = {a.name: env[v.name] for a, v in zip(op.body.args, op.inputs)}
    for inner_op in op.body.ops:
        _convert_op(inner_op, inner, eqns)
    for v, r in zip(op.results, op.body.results):
        env[v.name] = inner[r.name]


def propagate_params(comp) -> dict:
    """The propagate parameters a Domain/Iter/Kernel computation stands for."""
    return dict(edge_fn=closed_from_region(comp.edge), reducer=reducer_from_spec(comp.reducer),
                roles=comp.input_roles, names=comp.input_names, reduce_by=comp.reduce_by,
                update=None if comp.update is None else closed_from_region(comp.update))


def _region_only(*_args):
    raise UnsupportedError("this reducer was rebuilt from IR and exists only as regions",
                           hint="trace the original Python reducer to call its functions")


def reducer_from_spec(spec) -> reducers.Reducer:
    if spec.builtin:
        if spec.name not in reducers.BUILTIN:
            raise CompilationError(f"reducer {spec.name!r} is not built in")
        if spec.name == "online_softmax":
            found = reducers.online_softmax(spec.prune_threshold)
            return found.with_stats() if spec.stats else found
        if spec.name in reducers.ARG:
            return getattr(reducers, spec.name)(spec.of)
        if spec.name in reducers.EMPTY_SETTABLE:
            return getattr(reducers, spec.name)(spec.empty)
        return getattr(reducers, spec.name)()
    r = reducers.Reducer(spec.name, spec.identity, combine=_region_only,
                         commutative=spec.commutative, associative=spec.associative)
    return r.with_regions(tuple(None if g is None else closed_from_region(g)
                                for g in (spec.lift, spec.combine, spec.finalize)))
