"""runtime: a call's binding: how each propagate walks the relation value it is given.

`call_binding(program, args)` is one `lower.binding.RelationBinding` (or None: as typed) per
propagate, in program order, decided from the call's relation values by the same questions the
launch handlers ask (the relation's kernel-ABI walk, a generated relation's state, a stored
relation's pages). The executor lowers the program *with* it, once per binding, so the Task
module it interprets, and `ir("task")` prints, holds the Kernel op every launch runs and names
the fixed kernels beside them.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.prims.graph import propagate_p
from ...core.program import Lit
from ...core.types import GraphType
from ...lower import CPU_LLVM_AVAILABLE
from ...lower.abi import relation_descriptor
from ...lower.attention_walk import claim_attention
from ...lower.backends import selected_backend, targets_triton
from ...lower.binding import HaloLayout, RelationBinding
from ..backends.cpu.generated import GENERATED_KINDS, generated_binding, generated_relations
from ..backends.triton.launch import triton_walk
from ..distributed.plan import exchanged
from ..memory.scope import budget_scope
from ..paging.gather import kernel_name as gather_kernel
from ..paging.pages import pageable
from ..paging.resident import RESIDENT_KINDS


def call_target(backend: str | None = None) -> str:
    """The Kernel-op target a call on `backend` (default: the selected one) is lowered for."""
    return "triton" if targets_triton(backend or selected_backend()) else "cpu-llvm"


def call_binding(program, args: list) -> tuple:
    """The binding of a call of `program` on `args` for the selected backend's target (()
    when every propagate walks its relation as typed)."""
    triton = call_target() == "triton"
    if not triton and not CPU_LLVM_AVAILABLE:
        return ()
    bind = triton_binding if triton else relation_binding
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    generated = None
    out = []
    for eqn in program.eqns:
        if eqn.primitive is not propagate_p:
            continue
        rel = eqn.inputs[0]
        graph = rel.value if isinstance(rel, Lit) else known.get(id(rel))
        if graph is None and rel.type.kind in GENERATED_KINDS:
            if generated is None:     # (a radius/knn generated inside the program)
                generated = generated_relations(program)
            graph = generated.get(id(rel))
        out.append(None if graph is None else bind(eqn, graph))
    return tuple(out) if any(b is not None for b in out) else ()


def distributed_binding(program, args: list) -> tuple:
    """The binding of a call over DistributedGraph(s): each propagate over one runs its
    rank's halo plan, which unrolls the propagate's one-page module over a CSR (() when
    none does)."""
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    out = []
    for eqn in program.eqns:
        if eqn.primitive is propagate_p:
            rel = eqn.inputs[0]
            graph = rel.value if isinstance(rel, Lit) else known.get(id(rel))
            if getattr(graph, "tiga_distributed", False) is not True:
                out.append(None)
                continue
            # (the rank's relation as its halo plan types it: a CSR of the same sizes; a
            # partition kept in a store is walked by pages, as a stored relation is)
            csr = replace(rel.type, kind="csr")
            local = (None if getattr(graph, "local_store", None) is None else
                     replace(paged_binding(eqn, graph), kernels=(), pages=False))
            out.append(RelationBinding(csr, pages=True, local=local,
                                       halo=halo_layout(eqn, graph)))
    return tuple(out) if any(b is not None for b in out) else ()


def halo_layout(eqn, dg) -> HaloLayout:
    """The rank's share of the partition `dg` that `eqn`'s halo plan is lowered over (one
    plan per share, exchanged fields and overlap: part of the call's binding)."""
    p = dg.plan
    by_dst = eqn.params["reduce_by"] == "dst"
    return HaloLayout(
        int(dg.comm.rank), int(dg.comm.size), int(p.n_owned), int(p.n_interior),
        int(p.num_edges), tuple((int(q), int(a), int(b)) for q, a, b in p.recv),
        tuple(int(q) for q in p.peers()),
        tuple((int(a), int(b)) for (a, b), _ in dg.interior_chunks),
        tuple(sorted(set(exchanged(eqn).values()))), bool(dg.overlap) and by_dst)


def relation_binding(eqn, graph) -> RelationBinding | None:
    """How `eqn` walks `graph` on cpu-llvm (None: as its type says)."""
    kind = getattr(graph, "kind", None)
    if kind == "paged":
        return paged_binding(eqn, graph)
    if resident_pages(eqn, graph):
        return _resident(eqn, graph, _cpu_walk(eqn, graph))
    return _cpu_walk(eqn, graph)


def _cpu_walk(eqn, graph) -> RelationBinding | None:
    gtype = eqn.inputs[0].type
    kind = getattr(graph, "kind", None)
    if kind in GENERATED_KINDS:
        # (a walk its cells do not run: by source over an asymmetric relation, edge fields,
        # a relation resolved already: the generic kernel over the materialised CSR)
        return generated_binding(eqn, graph) or RelationBinding(_csr(gtype))
    if claim_attention(gtype.kind, eqn.params,
                         [a.type for a in eqn.inputs[1:]]) is not None:
        return None            # attention walks its pairing as typed
    walk = "src" if eqn.params["reduce_by"] == "src" else "dst"
    if gtype.kind != "csr" and relation_descriptor(graph, walk, target="cpu-llvm") == ("csr",):
        return RelationBinding(_csr(gtype))
    return None


def triton_binding(eqn, graph) -> RelationBinding | None:
    """How `eqn` walks `graph` on a Triton backend (None: as typed, or attention's fixed
    kernels): the relation type its kernel renders for, with the relation's index dtype (a
    stored relation: its pages', whose one-page module holds the page kernel)."""
    if getattr(graph, "kind", None) == "paged":
        return _indexed(paged_binding(eqn, graph), graph)
    if claim_attention(eqn.inputs[0].type.kind, eqn.params,
                       [a.type for a in eqn.inputs[1:]]) is not None:
        return None
    bound = triton_walk(eqn, graph)[2]
    found = None if bound == eqn.inputs[0].type else RelationBinding(bound)
    if resident_pages(eqn, graph):
        found = _resident(eqn, graph, found)
        return replace(found, page=_indexed(found.page, graph))
    return found


def _indexed(found: RelationBinding, graph) -> RelationBinding:
    """`found` walking a relation of `graph`'s index dtype (a Triton kernel renders per
    index width)."""
    return replace(found, relation=replace(found.relation, index_dtype=graph.index_dtype))


def _resident(eqn, graph, walk: RelationBinding | None) -> RelationBinding:
    """A relation held in memory that may page (resident_pages): the call's module walks it
    as `walk` says (None: as typed), its one-page module as a stored relation's pages do."""
    if walk is None:
        walk = RelationBinding(eqn.inputs[0].type)
    return replace(walk, pages=True, page=paged_binding(eqn, graph))


def resident_pages(eqn, graph) -> bool:
    """Whether `eqn` over `graph`, a relation held in memory, may run by pages at this call:
    under a host budget its disk-tier fields and result may not fit (paging.resident decides
    as the call runs, from what is left of the budget then), so its one-page module is lowered
    with the call's and the in-memory kernel beside it."""
    return (getattr(graph, "kind", None) in RESIDENT_KINDS and pageable(eqn.params)
            and budget_scope("host") is not None)


def paged_binding(eqn, graph) -> RelationBinding:
    """Every page runs the kernel over the page's CSR (a walk by source: over the transposed
    store's, roles swapped) and gathers its distinct rows; a grouping pages cannot complete
    reads the CSR whole."""
    gtype = eqn.inputs[0].type
    if not pageable(eqn.params):
        return RelationBinding(_csr(gtype))
    bits = 8 * graph.index_dtype.np.itemsize
    if eqn.params["reduce_by"] == "src":
        csr = replace(_csr(gtype), num_src=gtype.num_dst, num_dst=gtype.num_src)
        return RelationBinding(csr, swapped=True, kernels=(gather_kernel(bits),), pages=True)
    return RelationBinding(_csr(gtype), kernels=(gather_kernel(bits),), pages=True)


def _csr(gtype: GraphType) -> GraphType:
    return replace(gtype, kind="csr", coord_dims=None)


__all__ = ["call_binding", "call_target", "distributed_binding", "relation_binding",
           "triton_binding"]
