"""lower/passes: Domain -> Iter: each gf.apply becomes a gf_iter.traverse whose coordinate
hierarchy follows the relation kind and whose ordering follows reduce_by."""
from __future__ import annotations

from ...core.config import config
from ...core.errors import CompilationError
from ..ir.domain import ApplyOp, DomainModule
from ..ir.iter import HIERARCHY_OF_KIND, IterModule, TraverseOp, ordering_for, walk_hierarchy
from .common import expect_level, map_ops


def _traverse(op):
    if not isinstance(op, ApplyOp):
        return op
    kind = op.comp.relation.type.kind
    if kind not in HIERARCHY_OF_KIND:
        raise CompilationError(f"lower-domain-to-iter: relation kind {kind!r} has no "
                               f"coordinate hierarchy (known: {', '.join(HIERARCHY_OF_KIND)})")
    # the walk is chosen here: tiled attention for the propagates its runtime claims, else by
    # kind, and for kNN by coordinate dims (walk_hierarchy)
    return TraverseOp(op.comp, walk_hierarchy(op.comp), ordering_for(op.comp.reduce_by))


def lower_domain_to_iter(module: DomainModule) -> IterModule:
    expect_level(module, DomainModule, "lower-domain-to-iter")
    out = IterModule(module.name, map_ops(module.body, _traverse))
    if config.check:     # (TIGA_CHECK, on in tests: a warm first call skips it)
        out.verify()
    return out
