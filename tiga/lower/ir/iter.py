"""lower/ir: Iter IR, `gf_iter.traverse`: which relation coordinates are visited, in what order.

The computation (relation, roles, reducer, regions) is kept from `gf.apply`; the traversal
adds `coordinate_hierarchy` (how coordinates are produced from the relation kind) and
`ordering` (which entity the walk is grouped by). No threads or tiles yet.
"""
from __future__ import annotations

from typing import ClassVar

from ...core.errors import CompilationError
from ...core.graph_generated import FAST_DIMS
from ...core.records import record
from ..attention_walk import ATTENTION_TILES, claim_computation
from .base import (
    AttrReader,
    GenericOp,
    Module,
    RelationOp,
    TensorOp,
    register_op,
)
from .domain import Computation, ComputationOp, declare_level

# relation kind -> coordinate producer. cat is a block-diagonal union that Graph.cat
# materialises as CSR, so it walks stored rows like compressed-row.
HIERARCHY_OF_KIND = {"csr": "compressed-row", "dense": "dense", "triangular": "triangular",
                     "cu_seqlens": "cu-seqlens", "stencil": "stencil", "cat": "cat",
                     # generated relations (DESIGN.md): points sorted by cell + exact test;
                     # top-k state over growing shells
                     "radius": "cell-directory", "knn": "knn-shells",
                     # a store's relation: its pages are stored CSR rows (the runtime expands
                     # the launch into its page plan, xla_free_runtime/paging/plan.py)
                     "paged": "compressed-row"}
# kNN above FAST_DIMS coordinate dims: the cell directory degenerates (3^d neighbour cells,
# shells that cover the whole grid), so the walk is a tiled scan of query blocks x source
# blocks with a register-blocked distance product, a threshold filter and an exact re-check
# of the few candidates that pass it (lower/llvm/knn_tiled.py)
KNN_TILED = "knn-tiled-scan"
# dot-product attention over a dense, triangular or cu_seqlens relation (the forward and its
# canonical VJP propagates, lower/attention_walk.py): blocks of destination rows against
# blocks of their contiguous source ranges, all heads per tile
HIERARCHIES = tuple(dict.fromkeys(HIERARCHY_OF_KIND.values())) + (KNN_TILED, ATTENTION_TILES)


def hierarchy_for(relation_type) -> str:
    """The coordinate hierarchy that walks a relation of this type: the Iter-level choice
    of traversal (kNN by coordinate dims; every other kind by its kind)."""
    kind = relation_type.kind
    if kind not in HIERARCHY_OF_KIND:
        raise CompilationError(f"relation kind {kind!r} has no coordinate hierarchy (known: "
                               f"{', '.join(HIERARCHY_OF_KIND)})")
    dims = getattr(relation_type, "coord_dims", None)
    if kind == "knn" and dims is not None and dims > FAST_DIMS:
        return KNN_TILED
    return HIERARCHY_OF_KIND[kind]


def walk_hierarchy(comp: Computation) -> str:
    """The hierarchy the Iter stage chooses for a computation: the tiled attention walk when
    it claims the computation (the runtime's predicate), else the relation's (hierarchy_for)."""
    if claim_computation(comp) is not None:
        return ATTENTION_TILES
    return hierarchy_for(comp.relation.type)


ORDERINGS = ("destination-major", "source-major")


def ordering_for(reduce_by) -> str:
    """Reducing by source walks the transposed relation; everything else walks dst rows. A
    walk with one side per output is grouped by its first output's side."""
    first = reduce_by[0] if isinstance(reduce_by, tuple) else reduce_by
    return "source-major" if first == "src" else "destination-major"


def check_traversal(comp: Computation, hierarchy, ordering, where: str) -> None:
    kind = comp.relation.type.kind
    if hierarchy not in HIERARCHIES:
        raise CompilationError(f"{where}: coordinate_hierarchy must be one of "
                               f"{', '.join(HIERARCHIES)}, found {hierarchy!r}")
    if kind not in HIERARCHY_OF_KIND:
        raise CompilationError(f"{where}: relation kind {kind!r} has no coordinate hierarchy")
    want = walk_hierarchy(comp)
    if want != hierarchy:
        raise CompilationError(f"{where}: coordinate_hierarchy {hierarchy!r} does not match "
                               f"the {kind} relation (expected {want!r})")
    if ordering not in ORDERINGS:
        raise CompilationError(f"{where}: ordering must be one of {', '.join(ORDERINGS)}, "
                               f"found {ordering!r}")
    if ordering != ordering_for(comp.reduce_by):
        raise CompilationError(f"{where}: ordering {ordering!r} cannot reduce by "
                               f"{comp.reduce_by!r} (expected {ordering_for(comp.reduce_by)!r})")


@register_op
@record
class TraverseOp(ComputationOp):
    """`gf_iter.traverse`: the computation plus its coordinate walk."""

    comp: Computation
    coordinate_hierarchy: str
    ordering: str
    op_name: ClassVar[str] = "gf_iter.traverse"
    terminator: ClassVar[str] = "gf_iter.yield"

    def own_attrs(self) -> list:
        return [("coordinate_hierarchy", self.coordinate_hierarchy),
                ("ordering", self.ordering)]

    @classmethod
    def from_generic(cls, g: GenericOp) -> TraverseOp:
        r = AttrReader(g.name, g.attrs)
        hierarchy, ordering = r.take("coordinate_hierarchy"), r.take("ordering")
        comp = Computation.from_generic(g, r)
        r.done()
        return cls(comp, hierarchy, ordering)

    def verify(self, where: str, level: str) -> None:
        self.comp.verify(where, level)
        check_traversal(self.comp, self.coordinate_hierarchy, self.ordering, where)


class IterModule(Module):   # (Module's dataclass methods: no fields of its own)
    level: ClassVar[str] = "iter"


parse_iter, print_iter, verify_iter = declare_level(
    IterModule, top=(TensorOp, RelationOp, TraverseOp), nested=(TensorOp, RelationOp, TraverseOp))
