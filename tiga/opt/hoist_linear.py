"""opt: move an edge MLP's linear layers from edges to entities (exact rewrites).

0. Parameter-only work. An edge-function equation that reads only parameters (a weight's
   transpose, a product of two weights) gives the same value on every edge: it runs once
   per call on the whole arrays and its result enters the edge function as a parameter.
1. First layer. An edge function that starts `[p_src - p_dst; x_src] W + b` computes, on
   every edge, a product that is linear in per-entity rows: it equals
   `Z_src[src] + Z_dst[dst]` with `Z_src = [p; x] W + b` and `Z_dst = -p W_p`, two
   (num_entities, hidden) products computed once per call. Each edge then gathers two
   hidden rows instead of multiplying an (in_features, hidden) matrix. A field read at
   several offsets (`[x_dst; x_src - x_dst] W`) multiplies the signed sum of its weight
   rows, `x (W_a - W_b)`: one product per field and role.
2. Last layer. With a sum reducer, `sum_e (h_e W + b) = (sum_e h_e) W + degree * b`: the
   propagate sums the hidden rows and the last product runs once per entity.

Both are algebraic rewrites (exact up to float rounding order) of the staged program, so
Tiga's VJP of the result is what runs backward: per edge it recomputes only the activation
between the two layers (no (num_edges, hidden) tape) and no parameter gradient is folded
over edges; the weight gradients become entity-level products.

Rewrite 1 applies to a propagate without an update function whose edge function feeds
`dot_general(row_form, W)`, `row_form` built from source/destination field rows by add,
sub, neg, concatenate and reshape, W a parameter operand. Rewrite 2 applies to a sum
propagate without update whose single message is `reshape(dot_general(h, W)) [+ b]`.
Anything else is left as it is.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import TigaError
from ..core.passes import cse, dce, use_counts
from ..core.prims.graph import degrees_p, propagate_p, row_type
from ..core.program import ClosedProgram, Eqn, GraphProgram, Lit
from ..core.types import TensorType
from ..trace import math as m
from ..trace.staging import trace_flat
from ..trace.tracer import bind
from .facts import ProgramFacts

MIN_CONTRACTION = 4   # below this, a per-edge product is as cheap as gathering hidden rows


# (the records below are plain slotted classes, not dataclasses: each frozen dataclass
# compiles six methods when the module is imported, ~0.5-1.5 ms apiece, on every
# `import tiga`; these are private, built once per match and only read)

class _Term:
    __slots__ = ("binder", "sign", "offset")

    def __init__(self, binder: int, sign: int, offset: int):
        self.binder = binder    # which edge-function operand (a source or destination row)
        self.sign = sign
        self.offset = offset    # where its row sits in the concatenated feature vector


class _Form:
    """A value that is a signed sum of field rows placed at offsets: `sum sign * row`."""

    __slots__ = ("terms", "width", "lead")

    def __init__(self, terms: tuple, width: int, lead: int = 0):
        self.terms = terms
        self.width = width
        self.lead = lead    # leading unit axes added by reshape


def _negate(f: _Form) -> _Form:
    return _Form(tuple(_Term(t.binder, -t.sign, t.offset) for t in f.terms), f.width, f.lead)


def _combine(a, b, negate_b=False):
    if a is None or b is None or a.width != b.width or a.lead != b.lead:
        return None
    b = _negate(b) if negate_b else b
    return _Form(a.terms + b.terms, a.width, a.lead)


def _param_index(prog, roles, v):
    for i, (b, r) in enumerate(zip(prog.in_binders, roles)):
        if b is v:
            return i if r == "param" else None
    return None


# ---- rewrite 1: the first layer -------------------------------------------------------

class _FirstLayer:
    __slots__ = ("dot", "form", "weight", "axis", "bias_add", "bias")

    def __init__(self, dot, form: _Form, weight: int, axis: int, bias_add=None,
                 bias: int | None = None):
        self.dot = dot            # the dot_general eqn replaced by gathered entity rows
        self.form = form
        self.weight = weight      # operand index of W
        self.axis = axis          # W's contracted (input) axis
        self.bias_add = bias_add  # `add(product, b)` folded into the entity rows
        self.bias = bias


def _find_first(edge: GraphProgram, roles):
    forms = {}
    for i, (v, r) in enumerate(zip(edge.in_binders, roles)):
        if (r in ("src", "dst") and isinstance(v.type, TensorType) and v.type.ndim == 1
                and v.type.dtype.is_float):
            forms[id(v)] = _Form((_Term(i, 1, 0),), int(v.type.shape[0]))

    def form(a):
        return None if isinstance(a, Lit) else forms.get(id(a))

    for k, eqn in enumerate(edge.eqns):
        name, ins, out = eqn.primitive.name, eqn.inputs, eqn.outputs[0]
        f = None
        if name in ("add", "sub") and len(ins) == 2:
            f = _combine(form(ins[0]), form(ins[1]), negate_b=name == "sub")
        elif name == "neg":
            f = form(ins[0]) and _negate(form(ins[0]))
        elif name == "concatenate" and eqn.params.get("dimension") == 0:
            parts = [form(a) for a in ins]
            if all(p is not None and p.lead == 0 for p in parts):
                terms, at = [], 0
                for p in parts:
                    terms += [_Term(t.binder, t.sign, t.offset + at) for t in p.terms]
                    at += p.width
                f = _Form(tuple(terms), at)
        elif name == "reshape":
            src = form(ins[0])
            shape = tuple(out.type.shape)
            if src is not None and shape[-1:] == (src.width,) and all(d == 1 for d in shape[:-1]):
                f = _Form(src.terms, src.width, len(shape) - 1)
        elif name == "dot_general":
            hit = _first_product(edge, roles, eqn, form(ins[0]))
            if hit is not None:
                return _with_bias(edge, roles, k, hit)
        if f is not None:
            forms[id(out)] = f
    return None


def _first_product(edge, roles, eqn, f):
    w = eqn.inputs[1]
    if f is None or isinstance(w, Lit):
        return None
    wi = _param_index(edge, roles, w)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if wi is None or w.type.ndim != 2 or lb or rb or not w.type.dtype.is_float:
        return None
    if tuple(lc) != (f.lead,) or tuple(rc) not in ((0,), (1,)) or f.width < MIN_CONTRACTION:
        return None
    return _FirstLayer(eqn, f, wi, rc[0])


def _with_bias(edge, roles, k, hit: _FirstLayer) -> _FirstLayer:
    """Fold a following `+ b` (b a parameter of the hidden width) into the entity rows."""
    uses = use_counts(edge)
    alias = edge.eqns[k].outputs[0]
    for eqn in edge.eqns[k + 1:]:
        if uses.get(id(alias), 0) != 1:
            return hit
        if eqn.primitive.name == "reshape" and eqn.inputs[0] is alias:
            alias = eqn.outputs[0]
            continue
        if eqn.primitive.name == "add" and alias in eqn.inputs:
            other = eqn.inputs[1] if eqn.inputs[0] is alias else eqn.inputs[0]
            bi = None if isinstance(other, Lit) else _param_index(edge, roles, other)
            if (bi is not None and tuple(other.type.shape) == tuple(alias.type.shape) ==
                    tuple(eqn.outputs[0].type.shape) and other.type.ndim == 1):
                return _FirstLayer(hit.dot, hit.form, hit.weight, hit.axis, eqn, bi)
        if alias in eqn.inputs:
            return hit
    return hit


def _field_blocks(edge, plan: _FirstLayer, weight, hidden: int) -> dict:
    """binder -> (W rows its terms multiply, sign): a field read twice (`[x_dst; x_src -
    x_dst] W` reads x_dst at two offsets) is one product x (W_a - W_b), one matmul per field,
    its weight algebra parameter-sized (width x hidden). A field read once keeps its sign
    for the product: `(p_src - p_dst) W` then multiplies the same array by the same block for
    both roles, one product the program's common subexpressions share (a negated block would
    make it two)."""
    blocks: dict = {}
    for t in plan.form.terms:
        width = int(edge.in_binders[t.binder].type.shape[0])
        start, limit = [0, 0], [hidden, hidden]
        start[plan.axis], limit[plan.axis] = t.offset, t.offset + width
        block = m.slice_static(weight, tuple(start), tuple(limit))
        prev = blocks.get(t.binder)
        if prev is None:
            blocks[t.binder] = (block, t.sign)
        else:
            signed = prev[0] if prev[1] > 0 else m.negative(prev[0])
            blocks[t.binder] = (m.subtract(signed, block) if t.sign < 0 else
                                m.add(signed, block), 1)
    return blocks


def _first_rewrite(eqn, plan: _FirstLayer, ins, notes):
    params = eqn.params
    edge = params["edge_fn"].program
    roles, names = list(params["roles"]), list(params["names"])
    graph, operands = ins[0], ins[1:]
    weight, axis = operands[plan.weight], plan.axis
    hidden = int(edge.in_binders[plan.weight].type.shape[1 - axis])
    z = {}   # Z_role = sum over that role's fields of field @ (its terms' signed W rows)
    for binder, (block, sign) in _field_blocks(edge, plan, weight, hidden).items():
        role = roles[binder]
        part = m.dot_general(operands[binder], block, (((1,), (axis,)), ((), ())))
        part = part if sign > 0 else m.negative(part)
        z[role] = part if role not in z else m.add(z[role], part)
    z_roles = sorted(z)
    if plan.bias is not None:   # every edge reads exactly one row of each Z: add b once
        role = z_roles[0]
        deg = bind(degrees_p, graph, by=role)
        ones = m.convert(m.equal(deg, deg), m._typeof(z[role]).dtype)   # integers: no NaN
        z[role] = m.add(z[role], _rows_times(ones, operands[plan.bias]))
    values = list(operands) + [z[r] for r in z_roles]
    n_orig = len(operands)

    def replace(e, read, rows):
        if e is plan.dot:
            acc = rows[n_orig]
            for extra in rows[n_orig + 1:]:
                acc = m.add(acc, extra)
            return [m.reshape(acc, tuple(e.outputs[0].type.shape))]
        if e is plan.bias_add:
            a, b = e.inputs
            return [read(b) if a is edge.in_binders[plan.bias] else read(a)]
        return None

    fn, kept = _edge_rewrite(edge, values, roles + z_roles, replace)
    all_names = names + [f"hoisted_{r}" for r in z_roles]
    all_roles = roles + z_roles
    notes.append(
        f"hoisted the first Linear ({plan.form.width} -> {hidden}) of the edge function out "
        f"of the edge loop: per-entity rows {', '.join(z_roles)} ({hidden} wide) computed "
        f"once per call; each edge gathers them instead of a {plan.form.width}x{hidden} "
        "product, and that layer's weight gradient is an entity-level product")
    return bind(propagate_p, graph, *[values[i] for i in kept], edge_fn=fn,
                reducer=params["reducer"], roles=tuple(all_roles[i] for i in kept),
                names=tuple(all_names[i] for i in kept), reduce_by=params["reduce_by"],
                update=None)


# ---- rewrite 2: the last layer ---------------------------------------------------------

class _LastLayer:
    __slots__ = ("dot", "weight", "axis", "bias")

    def __init__(self, dot, weight: int, axis: int, bias: int | None):
        self.dot = dot
        self.weight = weight
        self.axis = axis
        self.bias = bias


def _find_last(edge: GraphProgram, roles):
    if len(edge.outs) != 1 or isinstance(edge.outs[0], Lit):
        return None
    producer = {id(v): e for e in edge.eqns for v in e.outputs}
    uses = use_counts(edge)
    v, bias = edge.outs[0], None
    e = producer.get(id(v))
    if e is not None and e.primitive.name == "add":
        for a, b in (e.inputs, e.inputs[::-1]):
            bi = None if isinstance(b, Lit) else _param_index(edge, roles, b)
            if (bi is not None and tuple(b.type.shape) == tuple(v.type.shape) and
                    not isinstance(a, Lit) and uses.get(id(a)) == 1):
                v, bias = a, bi
                break
    e = producer.get(id(v))
    while e is not None and e.primitive.name == "reshape" and uses.get(id(e.inputs[0])) == 1:
        e = producer.get(id(e.inputs[0]))
    if e is None or e.primitive.name != "dot_general":
        return None
    h, w = e.inputs
    wi = None if isinstance(w, Lit) else _param_index(edge, roles, w)
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    if wi is None or w.type.ndim != 2 or lb or rb or not w.type.dtype.is_float:
        return None
    if isinstance(h, Lit) or tuple(lc) != (h.type.ndim - 1,) or tuple(rc) not in ((0,), (1,)):
        return None
    if any(d != 1 for d in h.type.shape[:-1]):
        return None
    return _LastLayer(e, wi, rc[0], bias)


def _last_rewrite(eqn, plan: _LastLayer, ins, notes):
    params = eqn.params
    edge = params["edge_fn"].program
    roles, names = list(params["roles"]), list(params["names"])
    graph, operands = ins[0], ins[1:]
    h = plan.dot.inputs[0]
    width = int(h.type.shape[-1])

    def replace(e, read, rows):
        return None

    fn, kept = _edge_rewrite(edge, operands, roles, replace,
                             outs=lambda read: [m.reshape(read(h), (width,))])
    summed = bind(propagate_p, graph, *[operands[i] for i in kept], edge_fn=fn,
                  reducer=params["reducer"], roles=tuple(roles[i] for i in kept),
                  names=tuple(names[i] for i in kept), reduce_by=params["reduce_by"],
                  update=None)[0]
    weight = operands[plan.weight]
    y = m.dot_general(summed, weight, (((1,), (plan.axis,)), ((), ())))
    if plan.bias is not None:
        bias = operands[plan.bias]
        deg = bind(degrees_p, graph, by=params["reduce_by"])
        y = m.add(y, _rows_times(m.convert(deg, m._typeof(y).dtype), bias))
    out_t = eqn.outputs[0].type
    notes.append(
        f"moved the last Linear ({width} -> {int(m._typeof(y).shape[1])}) after the sum: the "
        f"propagate sums {width}-wide hidden rows and the product (and degree x bias) runs "
        "once per entity")
    return [m.reshape(y, tuple(out_t.shape))]


# ---- rewrite 0: parameter-only work leaves the edge loop -------------------------------

class _Invariant:
    __slots__ = ("moved", "exported")

    def __init__(self, moved: tuple, exported: tuple):
        self.moved = moved        # edge equations that read only parameters (and literals)
        self.exported = exported  # their outputs still read per edge: new parameter operands


def _find_invariant(edge: GraphProgram, roles):
    inv = {id(v) for v, r in zip(edge.in_binders, roles) if r == "param"}
    moved = []
    for e in edge.eqns:
        vars_in = [a for a in e.inputs if not isinstance(a, Lit)]
        if vars_in and all(id(a) in inv for a in vars_in) and not _has_region(e):
            moved.append(e)
            inv.update(id(o) for o in e.outputs)
    if not moved:
        return None
    made = {id(o) for e in moved for o in e.outputs}
    moved_ids = {id(e) for e in moved}
    read_outside = {id(a) for e in edge.eqns if id(e) not in moved_ids for a in e.inputs}
    read_outside |= {id(a) for a in edge.outs}
    # an equation with any output still read per edge exports all of them (one value each)
    exported = tuple(o for e in moved if any(id(x) in read_outside for x in e.outputs)
                     for o in e.outputs)
    if not any(id(o) in made for o in exported):
        return None
    return _Invariant(tuple(moved), exported)


def _has_region(e) -> bool:
    return any(isinstance(v, ClosedProgram) or (isinstance(v, tuple) and any(
        isinstance(x, ClosedProgram) for x in v)) for v in e.params.values())  # (cond branches)


def _invariant_rewrite(eqn, plan: _Invariant, ins, notes):
    params = eqn.params
    edge = params["edge_fn"].program
    roles, names = list(params["roles"]), list(params["names"])
    graph, operands = ins[0], ins[1:]
    env = {id(b): o for b, o in zip(edge.in_binders, operands)}

    def top(a):
        return a.value if isinstance(a, Lit) else env[id(a)]

    for e in plan.moved:   # once per call, on the whole parameter arrays
        outs = bind(e.primitive, *[top(a) for a in e.inputs], **e.params)
        for v, o in zip(e.outputs, outs if isinstance(outs, (list, tuple)) else [outs]):
            env[id(v)] = o
    values = list(operands) + [env[id(v)] for v in plan.exported]
    at = {id(v): len(operands) + k for k, v in enumerate(plan.exported)}

    def replace(e, read, rows):
        if all(id(o) in at for o in e.outputs):
            return [rows[at[id(o)]] for o in e.outputs]
        return None

    all_roles = roles + ["param"] * len(plan.exported)
    fn, kept = _edge_rewrite(edge, values, all_roles, replace)
    all_names = names + [f"hoisted{k}" for k in range(len(plan.exported))]
    notes.append(f"moved {len(plan.moved)} parameter-only operation(s) of the edge function "
                 f"({', '.join(sorted({e.primitive.name for e in plan.moved}))}) out of the "
                 "edge loop: computed once per call")
    return bind(propagate_p, graph, *[values[i] for i in kept], edge_fn=fn,
                reducer=params["reducer"], roles=tuple(all_roles[i] for i in kept),
                names=tuple(all_names[i] for i in kept), reduce_by=params["reduce_by"],
                update=None)


# ---- shared machinery ------------------------------------------------------------------

def _rows_times(column, row):
    """`column[:, None] * row[None, :]` as an outer product (dot_general contracting
    nothing): the result takes the relation's size from `column` (possibly symbolic, N)
    without a reshape or broadcast to it."""
    return m.dot_general(column, row, (((), ()), ((), ())))


class _NotClosed(TigaError):
    """A rewrite would turn array literals into captures; the program stays as staged."""


def _edge_rewrite(edge, values, roles, replace, outs=None):
    """Re-trace `edge` over the rows of `values` with some equations replaced; returns the
    closed edge function (unused operands dropped) and the kept operand indices."""
    n_orig = len(edge.in_binders)

    def fn(*rows):
        env = {id(v): a for v, a in zip(edge.in_binders, rows[:n_orig])}

        def read(a):
            return a.value if isinstance(a, Lit) else env[id(a)]

        for e in edge.eqns:
            new = replace(e, read, rows)
            if new is None:
                new = bind(e.primitive, *[read(a) for a in e.inputs], **e.params)
                new = new if isinstance(new, (list, tuple)) else [new]
            for v, o in zip(e.outputs, new):
                env[id(v)] = o
        return outs(read) if outs is not None else [read(a) for a in edge.outs]

    types = [row_type(m._typeof(v)) if r != "param" else m._typeof(v).strong()
             for v, r in zip(values, roles)]
    prog, caps, _ = trace_flat(fn, types)
    if caps:
        raise _NotClosed("the rewritten edge function would capture array constants")
    prog = dce(prog)   # operands of replaced equations die here
    read = {id(a) for e in prog.eqns for a in e.inputs} | {id(a) for a in prog.outs}
    kept = [i for i, v in enumerate(prog.in_binders) if id(v) in read]
    prog = GraphProgram(tuple(prog.in_binders[i] for i in kept), prog.eqns, prog.outs)
    return ClosedProgram(prog), kept


def _rewrite(program: GraphProgram, find, apply, notes: list, sum_only=False,
             any_axis=False):
    plans = {}
    for eqn in program.eqns:
        p = eqn.params if eqn.primitive is propagate_p else None
        # an update function's binders follow the operand list: leave such calls alone
        if (p is None or p["update"] is not None or p["edge_fn"].consts or
                (p["reduce_by"] not in ("dst", "src") and not any_axis)):
            continue
        if sum_only and not (p["reducer"].builtin and p["reducer"].name == "sum"):
            continue
        hit = find(p["edge_fn"].program, p["roles"])
        if hit is not None:
            plans[id(eqn)] = hit
    if not plans:
        return program

    def run(*args):
        env = {id(v): a for v, a in zip(program.in_binders, args)}

        def read(a):
            return a.value if isinstance(a, Lit) else env[id(a)]

        for eqn in program.eqns:
            ins = [read(a) for a in eqn.inputs]
            plan = plans.get(id(eqn))
            outs = (bind(eqn.primitive, *ins, **eqn.params) if plan is None else
                apply(eqn, plan, ins, notes))
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            for v, o in zip(eqn.outputs, outs):
                env[id(v)] = o
        return [read(a) for a in program.outs]

    new, caps, _ = trace_flat(run, program.in_types, top=False)
    return _literals_back(new, caps, program)


def _literals_back(new: GraphProgram, caps, old: GraphProgram) -> GraphProgram:
    """A relation closed over by a jitted function is a literal of `old`; the re-trace
    returns it as a capture, and what ran eagerly on it (its degrees) as captured arrays.
    Bind them as literals again (values of the constant relation)."""
    if not caps:
        return new
    lits = {id(a.value): a for e in old.eqns for a in e.inputs if isinstance(a, Lit)}
    sub = {}
    for b, c in zip(new.in_binders, caps):
        if id(c) in lits:
            sub[id(b)] = lits[id(c)]
        elif hasattr(c, "__tiga_type__") or isinstance(c, np.ndarray):
            sub[id(b)] = Lit(np.asarray(c), b.type)
        else:
            raise _NotClosed(f"the rewritten program would capture a {type(c).__name__}")
    n = len(caps)
    eqns = [Eqn(e.primitive, tuple(sub.get(id(a), a) for a in e.inputs), e.params, e.outputs)
            for e in new.eqns]
    return GraphProgram(new.in_binders[n:], eqns, tuple(sub.get(id(a), a) for a in new.outs))


def hoist_linear_projections(program: GraphProgram) -> tuple[GraphProgram, list]:
    """(program, notes): first layers moved to entity rows, last layers after the sum."""
    if not any(e.primitive is propagate_p for e in program.eqns):
        return program, []
    notes: list = []
    try:
        new = _rewrite(program, _find_invariant, _invariant_rewrite, notes, any_axis=True)
        new = _rewrite(new, _find_first, _first_rewrite, notes)
        new = _rewrite(new, _find_last, _last_rewrite, notes, sum_only=True)
    except _NotClosed:
        return program, []
    except TigaError as exc:   # an optimisation never stops a call: run it as staged
        return program, [f"layer rewrites skipped ({exc})"]
    # a field read as both source and destination (positions) yields the same product twice
    if not notes:
        return program, notes
    # cse keys literals by their bytes: a constant relation (a literal graph) has none
    plain = all(isinstance(a.value, np.ndarray) for e in new.eqns for a in e.inputs
                if isinstance(a, Lit))
    return (cse(new) if plain else new), notes


def hoist_linear_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """hoist_linear_projections as a program pass (its notes say what moved)."""
    return hoist_linear_projections(program)


__all__ = ["hoist_linear_pass", "hoist_linear_projections"]
