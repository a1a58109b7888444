"""lower/ir: the parser that reads the MLIR-like printer's output back, for every level (the
printer, print_module and print_op, is base.py's; both are imported from here too).

Structured ops print in MLIR's generic form (`%r = "gf.apply"(%g, %x) ({ ^bb0(...): ... })
{attrs} : (types) -> type`); gf_tensor ops print in a short custom form
(`%m = arith.mulf %a, %b : f32`). Printing is deterministic, so
`print(parse(text)) == text` for every printed module.
"""
from __future__ import annotations

from ...core.errors import CompilationError
from .base import (
    MODULE_CLASSES,
    OP_CLASSES,
    SPELL_TO_PRIM,
    TERMINATOR_OF,
    GenericOp,
    Module,
    Region,
    TensorOp,
    Value,
    print_module,  # noqa: F401  (the printer: imported from here too)
    print_op,  # noqa: F401
    terminator_for,
)
from .syntax import (
    IDENT_RE,
    VALUE_NAME_RE,
    Cursor,
    RegionRef,
    parse_attr,
    parse_attr_dict,
    parse_type,
)

# ---- parsing ---------------------------------------------------------------------------------


def parse_module(text: str) -> Module:
    """Parse IR text of any level; the `gf.level` attribute picks the module class."""
    cur = Cursor(text)
    cur.expect("module", "'module'")
    cur.expect("@", "'@name'")
    name = cur.regex(IDENT_RE, "a module name")
    cur.expect("attributes", "'attributes {gf.level = ...}'")
    level_pos = cur.pos
    level = dict(parse_attr_dict(cur)).get("gf.level")
    if level not in MODULE_CLASSES:
        cur.error(f"gf.level to be one of {', '.join(map(repr, MODULE_CLASSES))}", level_pos)
    cur.expect("{")
    cur.expect("func.func", "'func.func'")
    cur.expect("@main", "'@main'")
    cur.expect("(")
    args = _parse_block_args(cur, ")")
    cur.expect("->")
    sig_pos = cur.pos
    result_types = _parse_result_types(cur)
    cur.expect("{")
    ops, results = _parse_ops(cur, "func.return")
    if [v.type for v in results] != result_types:
        cur.error("func.return types to match the function's result types", sig_pos)
    cur.expect("}")
    cur.expect("}")
    if not cur.done():
        cur.error("end of input after the module")
    return MODULE_CLASSES[level](name, Region(tuple(args), tuple(ops), tuple(results)))


def _parse_block_args(cur: Cursor, close: str) -> list:
    args = []
    if cur.take(close):
        return args
    while True:
        name = _value_name(cur)
        cur.expect(":")
        args.append(Value(name, parse_type(cur)))
        if cur.take(close):
            return args
        cur.expect(",", f"',' or {close!r}")


def _value_name(cur: Cursor) -> str:
    cur.expect("%", "a value '%name'")
    return cur.regex(VALUE_NAME_RE, "a value name")


def _value_names(cur: Cursor, stop: tuple) -> list:
    names = []
    if any(cur.at(s) for s in stop):
        return names
    while True:
        names.append(_value_name(cur))
        if not cur.take(","):
            return names


def _parse_result_types(cur: Cursor) -> list:
    if cur.take("("):
        types = []
        if cur.take(")"):
            return types
        while True:
            types.append(parse_type(cur))
            if cur.take(")"):
                return types
            cur.expect(",", "',' or ')'")
    return [parse_type(cur)]


def _parse_ops(cur: Cursor, terminator: str) -> tuple:
    ops = []
    while True:
        cur.ws()
        start = cur.pos
        op = _parse_op(cur)
        if isinstance(op, tuple):  # a terminator: (name, operands)
            if op[0] != terminator:
                cur.error(f"the terminator {terminator!r}", start)
            return ops, op[1]
        ops.append(op)


def _parse_op(cur: Cursor):
    cur.ws()
    start = cur.pos
    results = _value_names(cur, ('"',)) if cur.at("%") else []
    if results:
        cur.expect("=")
    try:
        if cur.at('"'):
            return _parse_generic(cur, results, start)
        return _parse_custom(cur, results)
    except CompilationError as exc:
        if str(exc).startswith("IR parse error"):
            raise
        raise CompilationError(f"IR parse error at {cur.where(start)}: {exc}") from None


def _parse_generic(cur: Cursor, result_names: list, start: int):
    name = cur.regex(r'"[A-Za-z0-9_.]+"', "a quoted op name")[1:-1]
    known = name in OP_CLASSES or name.startswith("gf_tensor.")
    if not known and not name.endswith((".yield", ".return")):
        cur.error(f"a known op, not {name!r}", start)
    cur.expect("(")
    operand_names = _value_names(cur, (")",))
    cur.expect(")")
    regions = []
    if cur.at("("):
        if not TERMINATOR_OF.get(name) and not name.startswith("gf_tensor."):
            cur.error(f"no regions on {name}")
        cur.take("(")
        while True:
            regions.append(_parse_region(cur, terminator_for(name)))
            if cur.take(")"):
                break
            cur.expect(",", "',' or ')'")
    attrs = parse_attr_dict(cur) if cur.at("{") else ()
    cur.expect(":")
    in_types, out_types = _parse_func_sig(cur, len(operand_names), len(result_names))
    operands = tuple(Value(n, t) for n, t in zip(operand_names, in_types))
    if name.endswith((".yield", ".return")):
        if result_names or regions or attrs or out_types:
            cur.error(f"{name} to take only operands", start)
        return (name, operands)
    results = tuple(Value(n, t) for n, t in zip(result_names, out_types))
    g = GenericOp(name, results, operands, tuple(regions), attrs)
    if name.startswith("gf_tensor."):
        return _tensor_from_generic(g)
    return OP_CLASSES[name].from_generic(g)


def _tensor_from_generic(g: GenericOp) -> TensorOp:
    params, used = [], []
    def region(ref):
        if not 0 <= ref.index < len(g.regions) or ref.index in used:
            raise CompilationError(f"{g.name}: #region<{ref.index}> does not name an unused "
                                   "region of this op")
        used.append(ref.index)
        return g.regions[ref.index]

    for k, v in g.attrs:
        if isinstance(v, RegionRef):
            v = region(v)
        elif isinstance(v, tuple) and v and all(isinstance(r, RegionRef) for r in v):
            v = tuple(region(r) for r in v)       # (cond's branches)
        params.append((k, v))
    if sorted(used) != list(range(len(g.regions))):
        raise CompilationError(f"{g.name}: every region must be named by a #region<i> "
                               "attribute")
    return TensorOp(g.name[len("gf_tensor."):], g.operands, g.results, tuple(params))


def _parse_region(cur: Cursor, terminator: str) -> Region:
    cur.expect("{")
    cur.expect("^bb0", "a block header '^bb0(...):'")
    cur.expect("(")
    args = _parse_block_args(cur, ")")
    cur.expect(":")
    ops, results = _parse_ops(cur, terminator)
    cur.expect("}")
    return Region(tuple(args), tuple(ops), tuple(results))


def _parse_func_sig(cur: Cursor, n_in: int, n_out: int) -> tuple:
    pos = cur.pos
    cur.expect("(", "a function type '(...) -> ...'")
    ins = []
    if not cur.take(")"):
        while True:
            ins.append(parse_type(cur))
            if cur.take(")"):
                break
            cur.expect(",", "',' or ')'")
    cur.expect("->")
    outs = _parse_result_types(cur)
    if len(ins) != n_in or len(outs) != n_out:
        cur.error(f"a type for each of {n_in} operand(s) and {n_out} result(s) (the "
                  f"signature has {len(ins)} and {len(outs)})", pos)
    return ins, outs


def _parse_custom(cur: Cursor, result_names: list) -> TensorOp:
    pos = cur.pos
    name = cur.regex(r"[a-z_]+\.[a-z_0-9]+", "an op name")
    if name.startswith("gf_tensor."):
        prim = name[len("gf_tensor."):]
    elif name in SPELL_TO_PRIM:
        prim = SPELL_TO_PRIM[name]
    else:
        cur.error(f"a known op, not {name!r}", pos)
    if prim == "constant":
        value = parse_attr(cur)
        cur.expect(":")
        t = parse_type(cur)
        if len(result_names) != 1:
            cur.error("a constant to have one result", pos)
        op = TensorOp("constant", (), (Value(result_names[0], t),), (("value", value),))
    else:
        operand_names = _value_names(cur, ("{", ":"))
        params = parse_attr_dict(cur) if cur.at("{") else ()
        cur.expect(":")
        if cur.at("("):
            ins, outs = _parse_func_sig(cur, len(operand_names), len(result_names))
        else:
            t = parse_type(cur)
            if len(result_names) != 1 or not operand_names:
                cur.error("a function type '(...) -> ...' (the short ': type' form needs "
                          "operands and one result)", pos)
            ins, outs = [t] * len(operand_names), [t]
        op = TensorOp(prim, tuple(Value(n, t) for n, t in zip(operand_names, ins)),
                      tuple(Value(n, t) for n, t in zip(result_names, outs)), params)
    if op.name != name:
        cur.error(f"the spelling {op.name!r} for {prim} on these types", pos)
    return op


def parse_checked(text: str, cls: type) -> Module:
    """Parse IR text, require the level of `cls`, and verify it."""
    module = parse_module(text)
    if not isinstance(module, cls):
        raise CompilationError(f"expected the {cls.level} level, found a {module.level} "
                               "module")
    module.verify()
    return module
