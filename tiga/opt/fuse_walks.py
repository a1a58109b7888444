"""opt: one relation walk for several independent sum propagates.

A VJP over an edge MLP asks for several propagates over the same relation that read the
same per-entity rows: the recomputed forward aggregate, the destination cotangent and the
source cotangent. Each walk pays the traversal (for a generated relation, the cell walk and
the distance test of every candidate) and the gathers of the neighbour rows again. Merged,
one walk evaluates all their edge functions on each edge (common subexpressions shared)
and folds each message into its own sum.

Exact: a sum propagate's output is the per-row sum of its messages whichever other
messages the walk also computes. A propagate grouped by source joins destination-grouped
ones only over a symmetric relation (j in N(i) iff i in N(j)); it is then the
destination-grouped propagate with the src/dst roles exchanged. The caller classifies
each relation variable: None (leave its propagates alone), "directed" or "symmetric".
"""
from __future__ import annotations

import heapq

from ..core.passes import cse, dce
from ..core.prims.generated import knn_p, radius_p
from ..core.prims.graph import propagate_p
from ..core.program import ClosedProgram, Eqn, GraphProgram, Lit, Var
from ..core.types import GraphType
from .facts import ProgramFacts

FLIP = {"src": "dst", "dst": "src"}


def fuse_relation_walks(program: GraphProgram, relation_kind) -> GraphProgram:
    """The program with independent sum propagates over the same relation merged;
    `relation_kind(var)` is None, "directed" or "symmetric" per relation variable."""
    while True:
        group = _next_group(program, relation_kind)
        if group is None:
            return program
        program = _merge(program, group)


def relation_kind(graph):
    """How walks over a concrete relation may merge: "symmetric" (a source-grouped walk is
    the destination-grouped one with roles exchanged), "directed", or None (leave them:
    only radius/knn walks, whose traversal dominates, are merged)."""
    if getattr(graph, "kind", None) not in ("radius", "knn"):
        return None
    # radius over one point set, untruncated (the runtime's generated.symmetric, which
    # this layer may not import; a test keeps the two in agreement)
    p = graph.params
    sym = graph.kind == "radius" and p["query"] is None and not p["max_neighbors"]
    return "symmetric" if sym else "directed"


def _generated_kind(eqn):
    """The kind of the relation a radius/knn equation generates: its params are static."""
    p = eqn.params
    if eqn.primitive is radius_p and len(eqn.inputs) == 1 and not p.get("max_neighbors"):
        return "symmetric"  # one point set, untruncated: j in N(i) iff i in N(j)
    return "directed"


def relation_kinds(program: GraphProgram, args=None) -> dict:
    """{id(graph variable): kind} for `program`: binders from the concrete relations in
    `args` (binder order; a traced or missing value counts as unknown, None), relations
    generated inside the program from their generating equation."""
    kinds = {}
    if args is not None:
        for v, a in zip(program.in_binders, args):
            if isinstance(v.type, GraphType) and getattr(a, "kind", None) == v.type.kind:
                kinds[id(v)] = relation_kind(a)
    for e in program.eqns:
        if e.primitive in (radius_p, knn_p):
            kinds[id(e.outputs[0])] = _generated_kind(e)
    return kinds


def fuse_walks_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """Independent sum propagates over one radius/knn relation as one walk; the kinds of
    relation variables come from `facts.relation_kinds` (relation_kinds)."""
    kinds = dict(facts.relation_kinds)

    def kind_of(a):   # a relation the trace captured is a literal: its kind is at hand
        return relation_kind(a.value) if isinstance(a, Lit) else kinds.get(id(a))
    return fuse_relation_walks(program, kind_of), []


def _fusable(eqn) -> bool:
    if eqn.primitive is not propagate_p:
        return False
    p = eqn.params
    r = p["reducer"]
    return (p["update"] is None and r.builtin
            and r.name == "sum" and r.arity == 1 and p["reduce_by"] in ("dst", "src")
            and "edge" not in p["roles"] and isinstance(eqn.inputs[0], Var | Lit))


def _relation(a):
    """What identifies a walk's relation: its variable, or a captured relation itself."""
    return a.value if isinstance(a, Lit) else a


def _descendants(program: GraphProgram) -> list:
    """Per equation, the set of equation positions that (transitively) read its outputs."""
    producer = {}
    for i, e in enumerate(program.eqns):
        for v in e.outputs:
            producer[id(v)] = i
    below: list = [set() for _ in program.eqns]
    readers: list = [set() for _ in program.eqns]
    for i, e in enumerate(program.eqns):
        for a in e.inputs:
            j = producer.get(id(a))
            if j is not None:
                readers[j].add(i)
    for i in range(len(program.eqns) - 1, -1, -1):
        for j in readers[i]:
            below[i].add(j)
            below[i] |= below[j]
    return below


def _next_group(program: GraphProgram, relation_kind):
    cands = [i for i, e in enumerate(program.eqns)
             if _fusable(e) and relation_kind(e.inputs[0]) is not None]
    if len(cands) < 2:
        return None
    below = _descendants(program)
    for n, i in enumerate(cands):
        ei = program.eqns[i]
        group = [i]
        symmetric = relation_kind(ei.inputs[0]) == "symmetric"
        for j in cands[n + 1:]:
            ej = program.eqns[j]
            if _relation(ej.inputs[0]) is not _relation(ei.inputs[0]):
                continue
            same = ej.params["reduce_by"] == ei.params["reduce_by"]
            if not (same or symmetric):
                continue
            if any(j in below[k] or k in below[j] for k in group):
                continue
            group.append(j)
        if len(group) > 1:
            return group
    return None


def _normalised(eqn, by: str) -> tuple:
    """(roles, edge fn) of `eqn` as a propagate grouped by `by`."""
    roles = tuple(eqn.params["roles"])
    if eqn.params["reduce_by"] != by:
        roles = tuple(FLIP.get(r, r) for r in roles)
    return roles, eqn.params["edge_fn"]


def _merge(program: GraphProgram, group: list) -> GraphProgram:
    members = [program.eqns[i] for i in group]
    # destination-grouped where any member is: a stored-CSR walk then needs no transpose
    bys = [e.params["reduce_by"] for e in members]
    by = "dst" if "dst" in bys else bys[0]
    graph = members[0].inputs[0]
    fields, roles, names, binder_of = [], [], [], {}
    consts, const_binders = [], []
    body, outs = [], []
    for eqn in members:
        eroles, fn = _normalised(eqn, by)
        sub = fn.program
        rename = {}
        nc = len(fn.consts)
        for b, c in zip(sub.in_binders[:nc], fn.consts):
            nb = Var(b.type)
            const_binders.append(nb)
            consts.append(c)
            rename[id(b)] = nb
        for b, x, r, name in zip(sub.in_binders[nc:], eqn.inputs[1:], eroles,
                                 eqn.params["names"]):
            key = (id(x), r)
            if key not in binder_of:
                binder_of[key] = Var(b.type)
                fields.append(x)
                roles.append(r)
                names.append(f"{name}_{len(names)}")
            rename[id(b)] = binder_of[key]

        def sub_atom(a, rename=rename):
            return rename.get(id(a), a) if isinstance(a, Var) else a

        for e in sub.eqns:
            new_outs = tuple(Var(v.type) for v in e.outputs)
            for v, nv in zip(e.outputs, new_outs):
                rename[id(v)] = nv
            body.append(Eqn(e.primitive, tuple(sub_atom(a) for a in e.inputs), e.params,
                            new_outs))
        outs += [sub_atom(a) for a in sub.outs]
    field_binders = [binder_of[(id(x), r)] for x, r in zip(fields, roles)]
    fused_fn = cse(GraphProgram(tuple(const_binders) + tuple(field_binders), body, outs))
    fused_fn = dce(fused_fn)
    params = {**members[0].params, "edge_fn": ClosedProgram(fused_fn, tuple(consts)),
              "roles": tuple(roles), "names": tuple(names), "reduce_by": by}
    fused = Eqn(propagate_p, (graph, *fields), params,
                tuple(v for e in members for v in e.outputs))
    return GraphProgram(program.in_binders, _schedule(program, group, fused), program.outs)


def _schedule(program: GraphProgram, group: list, fused: Eqn) -> list:
    """The equations in a dependency order with `group` replaced by `fused`, otherwise as
    close to the original order as possible (the fused walk sits at its first member)."""
    eqns = list(program.eqns)
    members = set(group)
    nodes = [i for i in range(len(eqns)) if i not in members or i == group[0]]
    eqn_of = {i: eqns[i] for i in nodes}
    eqn_of[group[0]] = fused
    producer = {}
    for i in nodes:
        for v in eqn_of[i].outputs:
            producer[id(v)] = i
    deps = {i: {producer[id(a)] for a in eqn_of[i].inputs if id(a) in producer} - {i}
            for i in nodes}
    readers: dict = {i: [] for i in nodes}
    for i in nodes:
        for j in deps[i]:
            readers[j].append(i)
    waiting = {i: len(deps[i]) for i in nodes}
    ready = [i for i in nodes if not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in readers[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):  # members are pairwise independent: no cycle can form
        raise AssertionError("fuse_relation_walks: cyclic schedule")
    return [eqn_of[i] for i in order]


__all__ = ["fuse_relation_walks", "fuse_walks_pass", "relation_kind", "relation_kinds"]
