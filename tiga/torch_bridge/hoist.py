"""torch_bridge: hoist an edge MLP's first Linear layer from edges to entities.

An edge function that starts `W^T [p_src - p_dst; x_src] + b` computes, on every edge, a
product that is linear in per-entity rows: it equals `Z_src[src] + Z_dst[dst] + b` with
`Z_src = [p; x] W` and `Z_dst = -p W_p`, two (num_entities, hidden) products computed once
per call by BLAS. Each edge then gathers two hidden rows instead of multiplying a
(in_features, hidden) matrix, forward and backward (the VJP recomputes only the cheap
rest of the MLP per edge), and the first layer's weight gradient becomes two entity-level
products instead of a per-edge outer product folded over all edges. No (num_edges, hidden)
array exists.

The pass is an exact algebraic rewrite (up to float rounding order). It applies to a
top-level propagate without an update function whose edge function feeds a
`dot_general(row_form, W)` where `row_form` is built from source/destination field rows by
add, sub, neg, concatenate and reshape, and W is a parameter operand. Anything else is
left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.passes import dce
from ..core.prims.graph import propagate_p, row_type
from ..core.prims.linalg import dot_general_p
from ..core.program import ClosedProgram, GraphProgram, Lit
from ..core.types import TensorType
from ..trace import math as m
from ..trace.staging import trace_flat
from ..trace.tracer import bind

MIN_CONTRACTION = 4   # below this, a per-edge product is as cheap as gathering hidden rows


@dataclass(frozen=True)
class _Term:
    binder: int    # which edge-function operand (a source or destination field row)
    sign: int
    offset: int    # where its row sits in the concatenated feature vector


@dataclass(frozen=True)
class _Form:
    """A value that is a signed sum of field rows placed at offsets: `sum sign * row`."""

    terms: tuple
    width: int
    lead: int = 0   # leading unit axes added by reshape


def _negate(f: _Form) -> _Form:
    return _Form(tuple(_Term(t.binder, -t.sign, t.offset) for t in f.terms), f.width, f.lead)


def _combine(a, b, negate_b=False):
    if a is None or b is None or a.width != b.width or a.lead != b.lead:
        return None
    b = _negate(b) if negate_b else b
    return _Form(a.terms + b.terms, a.width, a.lead)


def _find(edge: GraphProgram, roles) -> tuple | None:
    """(dot_general eqn, its form, weight binder index) of the first hoistable product."""
    index = {id(v): i for i, v in enumerate(edge.in_binders)}
    forms = {}
    for i, (v, r) in enumerate(zip(edge.in_binders, roles)):
        if r in ("src", "dst") and isinstance(v.type, TensorType) and v.type.ndim == 1 \
                and v.type.dtype.is_float:
            forms[id(v)] = _Form((_Term(i, 1, 0),), int(v.type.shape[0]))

    def form(a):
        return None if isinstance(a, Lit) else forms.get(id(a))

    for eqn in edge.eqns:
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
            hit = _product(eqn, form(ins[0]), ins[1], index, roles)
            if hit is not None:
                return hit
        if f is not None:
            forms[id(out)] = f
    return None


def _product(eqn, f, w, index, roles):
    if f is None or isinstance(w, Lit) or id(w) not in index:
        return None
    wi = index[id(w)]
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    if roles[wi] != "param" or w.type.ndim != 2 or lb or rb:
        return None
    if tuple(lc) != (f.lead,) or tuple(rc) not in ((0,), (1,)) or f.width < MIN_CONTRACTION:
        return None
    if not w.type.dtype.is_float:
        return None
    return eqn, f, wi


def hoist_linear_projections(program: GraphProgram) -> tuple[GraphProgram, list]:
    """(program, notes): the program with hoistable first layers moved to entities."""
    plans = {}
    for eqn in program.eqns:
        if eqn.primitive is propagate_p and eqn.params["update"] is None and \
                eqn.params["reduce_by"] in ("dst", "src") and not eqn.params["edge_fn"].consts:
            hit = _find(eqn.params["edge_fn"].program, eqn.params["roles"])
            if hit is not None:
                plans[id(eqn)] = hit
    if not plans:
        return program, []
    notes = []

    def run(*args):
        env = {id(v): a for v, a in zip(program.in_binders, args)}

        def read(a):
            return a.value if isinstance(a, Lit) else env[id(a)]

        for eqn in program.eqns:
            ins = [read(a) for a in eqn.inputs]
            plan = plans.get(id(eqn))
            if plan is None:
                outs = bind(eqn.primitive, *ins, **eqn.params)
            else:
                outs = _hoisted(eqn, plan, ins, notes)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            for v, o in zip(eqn.outputs, outs):
                env[id(v)] = o
        return [read(a) for a in program.outs]

    new, caps, _ = trace_flat(run, program.in_types, top=False)
    assert not caps, "the rewritten program is closed"
    return new, notes


def _hoisted(eqn, plan, ins, notes):
    dot, form, wi = plan
    params = eqn.params
    edge = params["edge_fn"].program
    roles, names = list(params["roles"]), list(params["names"])
    graph, operands = ins[0], ins[1:]
    weight = operands[wi]
    (_, (axis,)), _ = dot.params["dimension_numbers"]   # W's contracted (input) axis
    hidden = int(edge.in_binders[wi].type.shape[1 - axis])
    # entity-level products, one per role: Z_role = sum_terms sign * field @ W[rows of term]
    z = {}
    for t in form.terms:
        role, field = roles[t.binder], operands[t.binder]
        width = int(edge.in_binders[t.binder].type.shape[0])
        start, limit = [0, 0], [hidden, hidden]
        start[axis], limit[axis] = t.offset, t.offset + width
        block = m.slice_static(weight, tuple(start), tuple(limit))
        part = m.dot_general(field, block, (((1,), (axis,)), ((), ())))
        part = m.negative(part) if t.sign < 0 else part
        z[role] = part if role not in z else m.add(z[role], part)
    z_roles = sorted(z)
    values = list(operands) + [z[r] for r in z_roles]
    all_roles = roles + z_roles
    n_orig = len(operands)

    def edge_fn(*rows):
        env = {id(v): a for v, a in zip(edge.in_binders, rows[:n_orig])}

        def read(a):
            return a.value if isinstance(a, Lit) else env[id(a)]

        for e in edge.eqns:
            if e is dot:
                acc = rows[n_orig]
                for extra in rows[n_orig + 1:]:
                    acc = m.add(acc, extra)
                outs = [m.reshape(acc, tuple(e.outputs[0].type.shape))]
            else:
                outs = bind(e.primitive, *[read(a) for a in e.inputs], **e.params)
                outs = outs if isinstance(outs, (list, tuple)) else [outs]
            for v, o in zip(e.outputs, outs):
                env[id(v)] = o
        return [read(a) for a in edge.outs]

    types = [row_type(_typeof(v)) if r != "param" else _typeof(v).strong()
             for v, r in zip(values, all_roles)]
    prog, caps, _ = trace_flat(edge_fn, types)
    assert not caps, "the hoisted edge function is closed"
    prog = dce(prog)  # the replaced product's operands (concatenate, sub, ...) die here
    used = _used_binders(prog)
    keep = [i for i in range(len(values)) if i in used]
    prog = GraphProgram(tuple(prog.in_binders[i] for i in keep), prog.eqns, prog.outs)
    z_names = [f"hoisted_{r}" for r in z_roles]
    all_names = names + z_names
    notes.append(
        f"hoisted the first Linear ({form.width} -> {hidden}) of the edge function out of "
        f"the edge loop: per-entity products {', '.join(f'{r} ({hidden} wide)' for r in z_roles)} "
        "by BLAS once per call; each edge gathers those rows instead of a "
        f"{form.width}x{hidden} product (forward and VJP), and that layer's weight gradient "
        "is an entity-level product, not a per-edge fold")
    return bind(propagate_p, graph, *[values[i] for i in keep],
                edge_fn=ClosedProgram(prog), reducer=params["reducer"],
                roles=tuple(all_roles[i] for i in keep),
                names=tuple(all_names[i] for i in keep),
                reduce_by=params["reduce_by"], update=None)


def _typeof(v):
    return m._typeof(v)


def _used_binders(prog: GraphProgram) -> set:
    read = {id(a) for e in prog.eqns for a in e.inputs}
    read |= {id(a) for a in prog.outs}
    return {i for i, v in enumerate(prog.in_binders) if id(v) in read}


__all__ = ["hoist_linear_projections"]
