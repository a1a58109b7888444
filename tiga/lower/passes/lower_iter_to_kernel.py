"""lower/passes: Iter -> Kernel: each gf_iter.traverse becomes one fused gf_kernel.launch with
its traversal, the arrays it must materialise and the guards it relies on (no schedule yet;
select_kernel_schedule adds it)."""
from __future__ import annotations

from ...core.config import config
from ...core.types import GraphType
from ..ir.iter import IterModule, TraverseOp
from ..ir.kernel import READS_ROW_PTR, KernelModule, LaunchOp, materialized_for, traversal_for
from ..ir.syntax import AttrDict
from .common import expect_level, map_ops


def degree_bound(g: GraphType, hierarchy: str, ordering: str):
    """The largest row length when the relation kind fixes it, else "dynamic"."""
    if hierarchy == "dense":
        return g.num_src if ordering == "destination-major" else g.num_dst
    if hierarchy == "triangular":
        return g.num_dst
    return "dynamic"


def guards_for(op: TraverseOp) -> AttrDict:
    traversal = traversal_for(op.coordinate_hierarchy, op.ordering)
    pairs = []
    if traversal in READS_ROW_PTR:
        pairs += [("row_ptr", "validated"), ("col_idx", "in-bounds")]
    pairs.append(("max_degree", degree_bound(op.comp.relation.type, op.coordinate_hierarchy,
                                             op.ordering)))
    return AttrDict(tuple(pairs))


def _launch(op):
    if not isinstance(op, TraverseOp):
        return op
    h, o = op.coordinate_hierarchy, op.ordering
    return LaunchOp(op.comp, h, o, traversal_for(h, o), materialized_for(h, o), guards_for(op))


def lower_iter_to_kernel(module: IterModule) -> KernelModule:
    expect_level(module, IterModule, "lower-iter-to-kernel")
    out = KernelModule(module.name, map_ops(module.body, _launch))
    if config.check:     # (TIGA_CHECK, on in tests: a warm first call skips it)
        out.verify()
    return out
