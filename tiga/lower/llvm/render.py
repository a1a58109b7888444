"""lower/llvm: the render stage of the cpu-llvm backend: a scheduled `gf_kernel.launch` ->
LLVM text and the signature the runtime calls it by (an abi.KernelSource).

This module is the only caller of the code generators (`codegen_*`, the attention kernels'
`forward_ir` / `backward_ir`). Each kernel family has one function, chosen by the launch's
traversal; each reads the computation (edge, reducer and update regions, roles, names,
reduce_by) and the schedule from the op, never an equation's params. What the IR text
cannot carry is handed in as `CallData`: the walk's layout constants (a stencil's offsets,
cu_seqlens causality), whether the bound CSR has an edge permutation, the generated-walk
spec, the attention head width. `tiga-opt FILE --render` renders from the text alone, so
walks whose tables are call data are refused there with their name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...core.dtypes import as_dtype
from ...core.errors import UnsupportedError
from ...core.types import Dim, GraphType
from ..abi import TEXT_RELATIONS, KernelSignature, KernelSource
from ..attention_walk import ATTENTION_TILES
from ..ir import KernelModule, LaunchOp
from ..ir.base import propagate_params
from .kernel import KernelSchedule, codegen_propagate
from .values import CodegenUnsupported

# row walks rendered by codegen_propagate (the IR text of abi.TEXT_RELATIONS' traversals is
# the whole kernel; the others' walk layout is call data)
ROW_TRAVERSALS = ("csr-row", "transposed-csr-row", "dense-row", "triangular-row",
                  "segment-row", "stencil-row", "transposed-dense-row",
                  "transposed-triangular-row", "transposed-segment-row",
                  "transposed-stencil-row")
GENERATED_TRAVERSALS = ("cell-directory-row", "knn-shell-row", "knn-tile-row")


# the symbols a relation's counts print as in a size-generic launch (by operand role)
COUNT_DIMS = {"src": Dim("S"), "dst": Dim("N"), "edge": Dim("E")}


def size_generic(op: LaunchOp) -> LaunchOp:
    """`op` with its relation's counts, and the leading axis of every src/dst/edge field and
    every grouped output, printed as the symbols S, N and E, for a row walk (ROW_TRAVERSALS);
    any other launch as it is. The row renderer reads only the row shapes (abi's
    propagate_operands); the kernel takes the counts at run time (its row range, row_ptr,
    walk_params), so launches differing only in the counts render the same code, and a key
    printed from this op compiles once for every batch of graphs. Whole operands (`param`
    fields, reduce_by="all" outputs) keep their shapes: the code reads them."""
    comp = op.comp
    gtype = comp.relation.type
    if op.traversal not in ROW_TRAVERSALS or not isinstance(gtype, GraphType):
        return op
    counts = replace(gtype, num_src=COUNT_DIMS["src"], num_dst=COUNT_DIMS["dst"],
                     num_edges=COUNT_DIMS["edge"])
    inputs = tuple(v if role == "param" else _leading(v, COUNT_DIMS[role])
                   for v, role in zip(comp.inputs, comp.input_roles))
    sides = (comp.reduce_by if isinstance(comp.reduce_by, tuple) else
             (comp.reduce_by,) * len(comp.results))
    results = tuple(v if side == "all" else _leading(v, COUNT_DIMS[side])
                    for v, side in zip(comp.results, sides))
    return replace(op, comp=replace(comp, relation=replace(comp.relation, type=counts),
                                    inputs=inputs, results=results))


def _leading(value, dim: Dim):
    """`value` (an SSA value of a tensor type) with its leading axis printed as `dim`."""
    t = value.type
    return replace(value, type=replace(t, shape=(dim,) + tuple(t.shape[1:])))


@dataclass(frozen=True)
class CallData:
    """What a launch's IR text cannot carry, bound by the runtime at a call."""

    relation: tuple | None = None   # abi.relation_descriptor of the bound relation
    has_edge_perm: bool = False     # the walked CSR order differs from the user's edge order
    index_dtype: str | None = None  # the bound relation's index dtype (default: its type's)
    walk_spec: object = None        # generated.GeoSpec of a radius/knn walk
    head_width: int = 0             # attention: the width of one head of q, k and v


def render(op: LaunchOp, *, symbol: str, call: CallData | None = None) -> KernelSource:
    """The LLVM text and signature of one scheduled launch (the cpu-llvm backend's renderer).
    Raises CodegenUnsupported (a tg.UnsupportedError) naming what is not compiled."""
    call = call or CallData()
    if op.schedule is None:
        raise CodegenUnsupported("gf_kernel.launch: no schedule attributes",
                               hint="run --select-kernel-schedule first")
    if op.traversal != ATTENTION_TILES and op.comp.reducer.stats:
        # (only the attention kernels keep a row's max and mass; the row walks return the
        # finalised value alone, so their statistics outputs would be left unwritten)
        raise CodegenUnsupported(
            "online_softmax's row statistics (with_stats) are returned by the tiled attention "
            "kernels only, and this edge function is not plain dot-product attention",
            hint="the reference interpreter computes them; or use tg.online_softmax() "
                 "without with_stats()")
    if op.traversal in ROW_TRAVERSALS:
        return _render_rows(op, symbol, call)
    if op.traversal in GENERATED_TRAVERSALS:
        return _render_generated(op, symbol, call)
    if op.traversal == ATTENTION_TILES:
        return _render_attention(op, symbol, call)
    raise CodegenUnsupported(f"gf_kernel.launch: traversal {op.traversal!r} has no "
                             "cpu-llvm renderer", hint=f"rendered: {', '.join(_ALL)}")


_ALL = ROW_TRAVERSALS + GENERATED_TRAVERSALS + (ATTENTION_TILES,)


def _call_data_needed(op: LaunchOp, what: str) -> CodegenUnsupported:
    return CodegenUnsupported(f"gf_kernel.launch: traversal {op.traversal!r} cannot be rendered "
                            f"from IR text ({what} is call data)",
                            hint=f"renderable from text: {', '.join(TEXT_RELATIONS)}")


def _render_rows(op: LaunchOp, symbol: str, call: CallData) -> KernelSource:
    """A compressed-row, dense, triangular, cu_seqlens or stencil walk (codegen_propagate)."""
    relation = call.relation or TEXT_RELATIONS.get(op.traversal)
    if relation is None:
        raise _call_data_needed(op, "the walk's layout (stencil offsets, cu_seqlens)")
    gtype = op.comp.relation.type
    in_types = [gtype] + [v.type for v in op.comp.inputs]
    index_dtype = as_dtype(call.index_dtype or gtype.index_dtype)
    schedule = KernelSchedule(has_edge_perm=call.has_edge_perm, relation=relation,
                              launch=op.schedule)
    text, sig = codegen_propagate(propagate_params(op.comp), in_types, index_dtype, schedule,
                                  symbol=symbol)
    return KernelSource(text, sig)


def _render_generated(op: LaunchOp, symbol: str, call: CallData) -> KernelSource:
    """A radius/kNN walk over coordinates (cell directory, kNN shells, tiled kNN scan): the
    walk's spec (mode, dims, k, block) is call data."""
    from .generated import codegen_generated
    from .knn_tiled import codegen_tiled

    if call.walk_spec is None:
        raise _call_data_needed(op, "the generated walk's spec")
    in_types = [op.comp.relation.type] + [v.type for v in op.comp.inputs]
    codegen = codegen_tiled if call.walk_spec.mode == "tiled" else codegen_generated
    text, sig = codegen(propagate_params(op.comp), in_types, call.walk_spec, symbol=symbol)
    return KernelSource(text, sig)


def render_directory(dims: int, pos_dtype: str, *, symbol: str) -> KernelSource:
    """The cell directory of a generated walk (a counting sort of the points by cell): a
    helper kernel of the walk, with no launch of its own."""
    from .generated import codegen_directory

    return KernelSource(*codegen_directory(dims, pos_dtype, symbol=symbol))


def _render_attention(op: LaunchOp, symbol: str, call: CallData) -> KernelSource:
    """The float32 attention tiles: the forward (an online_softmax launch) or the fused
    backward (its VJP's propagates), with the schedule's tiles."""
    if call.head_width <= 0:
        raise _call_data_needed(op, "the head width of the bound fields")
    tiles = dict(op.schedule.tiles)
    forward = op.comp.reducer.name == "online_softmax"
    if forward:
        from .attention import forward_ir as emit
        tag, walk = "attention", "dst"
    else:
        from .attention_backward import backward_ir as emit
        tag, walk = "attention-backward", "src"
    # (relation: the tiles the kernel was rendered with, as the schedule named them)
    sig = KernelSignature(target="cpu-llvm", symbol=symbol, walk=walk, reduce_by=walk,
                          slots=(), roles=(), field_shapes=(), field_dtypes=(), out_shapes=(),
                          out_dtypes=(), index_dtype="int64", parallel="rows",
                          relation=(tag,) + tuple(sorted(tiles.items())))
    return KernelSource(emit(symbol, call.head_width, tiles), sig)


def render_kernel_module(module: KernelModule) -> str:
    """The LLVM text of every launch of a kernel-level module, in order (tiga-opt --render)."""
    if not isinstance(module, KernelModule):
        raise UnsupportedError(f"--render needs a kernel-level module, found a {module.level} "
                               "module", hint="run --lower-iter-to-kernel first")
    launches = [op for op in module.body.ops if isinstance(op, LaunchOp)]
    return "".join(render(op, symbol=f"{module.name}_{i}").text
                   for i, op in enumerate(launches))


@dataclass(frozen=True)
class PropagateLowering:
    """The `ctx` of the top-level propagate lowering rule."""

    index_dtype: str = "int64"
    schedule: KernelSchedule = KernelSchedule()
    symbol: str = "tiga_propagate"


def propagate_lowering_rule(ctx, in_types, out_types, *in_vals, **params):
    """lowering_rules['cpu-llvm'][propagate_p]: [(llvm_ir_text, signature)] at top level
    (the registry's per-primitive form of this render stage)."""
    if not isinstance(ctx, PropagateLowering):
        raise CodegenUnsupported("a propagate nested inside an edge/update function")
    return [codegen_propagate(params, in_types, ctx.index_dtype, ctx.schedule,
                              symbol=ctx.symbol)]
