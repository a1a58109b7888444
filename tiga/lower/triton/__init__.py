"""lower/triton: Kernel IR -> Triton source (an abi.KernelSource: text + signature); no
triton import needed to render. Registers lowering_rules['triton'] (rules/<family>.py)."""
from __future__ import annotations

from ...core.prims.graph import propagate_p
from ..abi import TEXT_RELATIONS, KernelSource, radius_descriptor_of_launch
from ..ir.base import propagate_params
from ..ir.kernel import LaunchOp
from ..registry import lowering_rules, register_lowered
from . import rules  # noqa: F401  (registers lowering_rules["triton"])
from .emitter import TritonUnsupported
from .kernel import TritonSchedule, render_propagate


def schedule_of(op: LaunchOp) -> TritonSchedule:
    """The Triton view of the launch's Schedule (select_kernel_schedule chose it)."""
    s = op.schedule
    if s is None or getattr(s, "target", "triton") != "triton" or s.block_rows is None:
        raise TritonUnsupported("gf_kernel.launch has no triton schedule",
                                hint="run --select-kernel-schedule with target triton")
    tiles = dict(s.tiles)
    return TritonSchedule(s.block_rows, s.block_neighbors, s.num_warps, s.pipeline_stages,
                          tiles.get("split_degree", 0), bool(tiles.get("row_tile", 0)))


def render_launch(op: LaunchOp, *, symbol: str, has_perm: bool = False,
                  relation: tuple | None = None) -> KernelSource:
    """Render one scheduled `gf_kernel.launch`. `relation` (abi.relation_descriptor with
    target="triton") names the walk the launcher binds; without it the traversal names it
    where the IR text holds the whole walk (csr, dense, triangular) and the others walk
    their resolved CSR."""
    if op.traversal not in ("csr-row", "transposed-csr-row", "dense-row", "triangular-row",
                            "segment-row", "stencil-row", "cell-directory-row",
                            "transposed-dense-row", "transposed-triangular-row",
                            "transposed-segment-row", "transposed-stencil-row"):
        raise TritonUnsupported(f"traversal {op.traversal!r} has no Triton rendering yet")
    if op.comp.reducer.stats:       # (the row walks return the finalised value alone)
        raise TritonUnsupported("online_softmax's row statistics (with_stats) are returned "
                                "by the attention kernels only")
    gtype = op.comp.relation.type
    if relation is None and op.traversal == "cell-directory-row":
        relation = radius_descriptor_of_launch(gtype.coord_dims, op.comp.reduce_by,
                                               tuple(propagate_params(op.comp)["roles"]))
    if relation is None:
        relation = TEXT_RELATIONS.get(op.traversal, ("csr",))
    in_types = [gtype] + [v.type for v in op.comp.inputs]
    return render_propagate(propagate_params(op.comp), in_types, gtype.index_dtype, has_perm,
                            schedule_of(op), symbol=symbol, relation=relation)


def propagate_lowering_rule(ctx, in_types, out_types, *in_vals, **params):
    """lowering_rules['triton'][propagate_p]: [KernelSource] of a top-level propagate."""
    if not isinstance(ctx, TritonSchedule):
        raise TritonUnsupported("a propagate nested inside an edge/update function")
    return [render_propagate(params, in_types, in_types[0].index_dtype, False, ctx)]


lowering_rules["triton"][propagate_p] = propagate_lowering_rule
register_lowered("triton")

__all__ = ["render_launch", "render_propagate", "TritonSchedule", "TritonUnsupported",
           "schedule_of"]
