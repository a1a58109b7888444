"""lower: a call's binding, an input of lowering: what each propagate's relation is bound to.

The runtime decides, from a call's relation values, how each propagate walks its relation: as
the relation's own kind (an implicit walk, a generated relation's cell walk, attention's
pairing), as the CSR it resolves to (a page's CSR, a generated relation it materialised), or,
for a source-grouped propagate over a symmetric relation, as the destination-grouped one with
the roles swapped. That decision is a `RelationBinding` per propagate (in program order), part
of the call signature; `bind_program` rewrites the program so that the stages lower exactly the
walks that run (each bound propagate reads a trailing binder of its bound relation type), and
`bind_tasks` lists, on each propagate's gf_task.launch, the fixed kernels it runs beside its
region (cell directory builds, page gathers). The Task module lowered this way is the one the
runtime interprets and `ir("task")` prints.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.prims.graph import propagate_p
from ..core.program import Eqn, GraphProgram, Var
from ..core.types import GraphType
from .ir.task import TaskLaunchOp, TaskModule


@dataclass(frozen=True)
class HaloLayout:
    """A rank's share of a partitioned relation, as its halo plan reads it (plain ints and
    tuples): the sizes of its owned and interior rows and edges, (peer, first, end) of the
    ghost rows each peer sends, its peers, its interior row chunks (one launch each), the
    source fields exchanged (positions among the field operands) and whether interior
    launches overlap the exchange (destination-grouped only)."""

    rank: int
    num_ranks: int
    n_owned: int
    n_interior: int
    num_edges: int
    recv: tuple
    peers: tuple
    chunks: tuple
    fields: tuple
    overlap: bool


@dataclass(frozen=True)
class RelationBinding:
    """How one propagate walks its relation at a call."""

    relation: GraphType          # the type the kernel walks
    swapped: bool = False        # roles exchanged: by source over a symmetric relation
    kernels: tuple = ()          # the fixed kernels its task runs, by name
    pages: bool = False          # it runs by pages: its one-page Task module is lowered too
    page: RelationBinding | None = None   # how its pages walk, where that differs from how
    #                                the call's module walks it (a relation held in memory
    #                                that pages only when its fields exceed the budget)
    local: RelationBinding | None = None  # how a rank's paged local relation's pages walk
    #                                (a halo plan over a partition kept in a store)
    halo: HaloLayout | None = None   # the rank's share its one-page module is unrolled over
    #                                (lower/passes/plan_halo_tasks), where it is partitioned


def swapped_params(params: dict) -> dict:
    """A reduce_by='src' propagate over a symmetric relation as a destination-grouped one with
    the roles exchanged: rows are the sources, their neighbours the destinations. The edge
    function takes its operands by position, so only the labels change."""
    flip = {"src": "dst", "dst": "src"}
    return dict(params, roles=tuple(flip.get(r, r) for r in params["roles"]), reduce_by="dst")


def bind_program(program: GraphProgram, binding: tuple) -> GraphProgram:
    """`program` with the k-th propagate bound by `binding[k]` (None: as it is): its params
    swapped where bound so, and its relation operand of the bound type. A relation every
    propagate reading it binds alike is retyped where it is (same binder, same position);
    one bound two ways gives the other propagates a trailing binder of their type (never
    transferred from the call's arguments). The equations keep their order and outputs, so
    the runtime pairs ops with equations as before."""
    bound = _bound_types(program, binding)
    propagates = [e for e in program.eqns if e.primitive is propagate_p]
    if not bound and not any(b is not None and (b.swapped or b.relation != e.inputs[0].type)
                             for e, b in zip(propagates, binding)):
        return program    # (a relation the program computes is bound through its readers)
    # (a constant relation is a literal of its own class: tracer.GraphLit)
    retyped = {k: (Var(t) if isinstance(a, Var) else type(a)(a.value, t))
               for k, (a, t) in bound.items() if t is not None}
    extra: dict = {}
    eqns: list = []
    k = 0
    for e in program.eqns:
        ins = tuple(retyped.get(id(a), a) for a in e.inputs)
        params = e.params
        if e.primitive is propagate_p:
            b = binding[k] if k < len(binding) else None
            k += 1
            if b is not None:
                params = swapped_params(params) if b.swapped else params
                if ins[0].type != b.relation:     # (bound another way than its relation)
                    rel = extra.setdefault((id(e.inputs[0]), b.relation), Var(b.relation))
                    ins = (rel,) + ins[1:]
        eqns.append(Eqn(e.primitive, ins, params, e.outputs))
    binders = [retyped.get(id(v), v) for v in program.in_binders] + list(extra.values())
    outs = [retyped.get(id(a), a) for a in program.outs]
    return GraphProgram(binders, eqns, outs)


def _bound_types(program: GraphProgram, binding: tuple) -> dict:
    """{id(relation operand): (operand, the type every propagate reading it binds it to, or
    None where they disagree)} for relation binders and literals bound to another type than
    their own (a relation an equation computes keeps its type: its propagates read trailing
    binders of theirs)."""
    defined = {id(v) for e in program.eqns for v in e.outputs}
    found: dict = {}
    k = 0
    for e in program.eqns:
        if e.primitive is not propagate_p:
            continue
        b = binding[k] if k < len(binding) else None
        k += 1
        rel = e.inputs[0]
        if id(rel) in defined:
            continue
        want = rel.type if b is None else b.relation
        have = found.get(id(rel))
        found[id(rel)] = (rel, want if have is None or have[1] == want else None)
    return {k: v for k, v in found.items() if v[1] != v[0].type}


def page_program(eqn, binding: RelationBinding | None = None) -> GraphProgram:
    """The one-equation program of a propagate over a CSR relation: what one page of a paged
    run (and one rank's launches of a distributed run) executes; `binding`: the relation
    type and roles its pages walk (a walk by source: the transposed relation, swapped)."""
    binders = [Var(a.type) for a in eqn.inputs]
    binders[0] = Var(replace(eqn.inputs[0].type, kind="csr") if binding is None else
                     binding.relation)
    swap = binding is not None and binding.swapped
    params = swapped_params(eqn.params) if swap else eqn.params
    outs = [Var(v.type) for v in eqn.outputs]
    return GraphProgram(binders, [Eqn(eqn.primitive, tuple(binders), params, tuple(outs))],
                        outs)


def paged_propagates(program: GraphProgram, binding: tuple) -> list:
    """[(k, equation, its binding)] of the propagates `binding` runs by pages (k: their
    position among the program's propagates)."""
    found = [e for e in program.eqns if e.primitive is propagate_p]
    return [(k, e, b) for k, (e, b) in enumerate(zip(found, binding))
            if b is not None and b.pages]


def bind_tasks(module: TaskModule, binding: tuple) -> TaskModule:
    """`module` with each propagate's gf_task.launch listing the fixed kernels its binding
    runs (the k-th task launch is the k-th propagate: the stages keep program order)."""
    if not any(b is not None and b.kernels for b in binding):
        return module
    ops, k = [], 0
    for op in module.body.ops:
        if isinstance(op, TaskLaunchOp):
            b = binding[k] if k < len(binding) else None
            k += 1
            if b is not None and b.kernels:
                op = replace(op, kernels=tuple(b.kernels))
        ops.append(op)
    return replace(module, body=replace(module.body, ops=tuple(ops)))


__all__ = ["RelationBinding", "bind_program", "bind_tasks", "page_program", "paged_propagates",
           "swapped_params"]
