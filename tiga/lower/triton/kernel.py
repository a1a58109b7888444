"""lower/triton: one fused Triton kernel per `propagate` over compressed rows (an
abi.KernelSource: source text + signature; the runtime compiles and launches it:
xla_free_runtime/backends/triton/launch.py).

    kernel[(cdiv(n_rows, BLOCK_R),)](row_ptr, col_idx, [edge_perm,] fields..., outs...,
                                     n_rows, BLOCK_R=..., BLOCK_N=...)

Each program owns BLOCK_R consecutive rows. For each row it loads the row's fields once,
walks the row's edges in tiles of BLOCK_N neighbours (a degree guard masks the last tile),
gathers the neighbour and edge rows of the tile, evaluates the edge function on the tile
(rules/<family>.py), folds the tile into the reducer state (reducers.py), finalises, applies
`update` and stores the row. No (num_edges, F) message array exists. reduce_by="src" walks
the transposed relation (rows are sources: implicit kinds natively, walks_transposed.py; a
stored relation its transposed CSR, edge ids through its permutation); "edge" stores each
message at its edge id; "all" (sum or mean without update) stores one partial sum per row,
which the launcher adds up. A stored CSR folded by dst or src whose schedule has the tile
row_tile renders row_tiles.TiledBody instead: the program's BLOCK_R rows walk together as
one [BLOCK_R, BLOCK_N] tile of edges per trip (same arguments, same launch); a radius cell
walk with that tile renders cell_tiles.CellTiledBody (one more argument: row_order).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...core.dtypes import as_dtype
from ...core.types import GraphType
from ..abi import (
    TRANSPOSED_KINDS,
    KernelSignature,
    KernelSource,
    operand_slots,
    propagate_operands,
    walk_of,
)
from .cell_tiles import CellTiledBody
from .emitter import TritonUnsupported
from .row_loop import _Body
from .row_tiles import TILED_RELATIONS, TiledBody
from .walks import walk_slots

# _tiga_max / _tiga_min: NaN wins, as numpy's maximum/minimum (the reference); tl.max and
# tl.maximum's default drop it. One max.NaN instruction on the GPU; np.maximum interpreted
HELPERS = {"_tiga_mul": "@triton.jit\ndef _tiga_mul(a, b):\n    return a * b\n",
           "_tiga_max": "@triton.jit\ndef _tiga_max(a, b):\n    return tl.maximum(a, b, "
                        "propagate_nan=tl.PropagateNan.ALL)\n",
           "_tiga_min": "@triton.jit\ndef _tiga_min(a, b):\n    return tl.minimum(a, b, "
                        "propagate_nan=tl.PropagateNan.ALL)\n"}


@dataclass(frozen=True)
class TritonSchedule:
    """What the source and the launch depend on (from the launch's Kernel IR Schedule)."""

    block_rows: int = 1
    block_neighbors: int = 16
    num_warps: int = 4
    num_stages: int = 1
    split_degree: int = 0     # rows of a larger degree run in the split kernels (0: none)
    row_tile: bool = False    # a stored CSR's rows gathered as one tile (row_tiles.py)


def signature_of(params: dict, in_types: list, index_dtype, has_perm: bool,
                 schedule: TritonSchedule, symbol: str,
                 relation: tuple = ("csr",)) -> KernelSignature:
    graph_t, fields = in_types[0], list(in_types[1:])
    if not isinstance(graph_t, GraphType):
        raise TritonUnsupported("a propagate whose first operand is not a relation")
    index = as_dtype(index_dtype)
    if index.name not in ("int32", "int64"):
        raise TritonUnsupported(f"index dtype {index.name} (int32/int64 are rendered)")
    reduce_by, roles = params["reduce_by"], tuple(params["roles"])
    combine = _combine(params)
    if params["update"] is not None and reduce_by != "dst":
        raise TritonUnsupported("an update function needs reduce_by='dst'")
    operands = propagate_operands(params, graph_t, fields)
    if "bool" in operands["field_dtypes"] + operands["out_dtypes"]:
        raise TritonUnsupported("a bool field or output (stored as bytes, not rendered)")
    walk = walk_of(reduce_by)
    # by source: the implicit kinds' transposed walks, the symmetric radius walk (the same
    # walk), else the transposed CSR
    if walk == "src" and relation[0] != "radius" and relation[0] not in TRANSPOSED_KINDS:
        relation = ("csr",)
    if walk == "dst" and relation[0] in TRANSPOSED_KINDS:
        raise TritonUnsupported(f"the walk by source {relation[0]!r} for a propagate grouped "
                                "by destination")
    if relation[0] == "radius" and ("edge" in roles or reduce_by == "edge"):
        raise TritonUnsupported("edge fields over a radius cell walk (its edges are not "
                                "numbered in the reference's order)")
    perm = (relation == ("csr",) and (has_perm or walk == "src")) or relation == ("csr_rows",)
    walked = walk_slots(relation)
    if relation[0] == "radius" and schedule.row_tile and reduce_by in ("dst", "src"):
        walked += ("row_order",)    # (rows in cell order: cell_tiles.py)
    slots = operand_slots(walked, perm, len(fields), len(operands["out_dtypes"]))
    # the split path needs a row's edges as one id range of a stored CSR and a reducer state
    split = (schedule.split_degree if relation == ("csr",) and reduce_by in ("dst", "src")
        else 0)
    return KernelSignature(target="triton", symbol=symbol, walk=walk, reduce_by=reduce_by,
                           slots=slots, index_dtype=index.name, relation=tuple(relation),
                           block_rows=schedule.block_rows,
                           block_neighbors=schedule.block_neighbors,
                           num_warps=schedule.num_warps, num_stages=schedule.num_stages,
                           combine=combine, split_degree=split, **operands)


def _combine(params: dict) -> str:
    """reduce_by="all": how the per-row partials are added ("sum" | "mean"); else ""."""
    if params["reduce_by"] != "all":
        return ""
    r = params["reducer"]
    if (params["update"] is not None or r is None or not r.builtin or
            r.name not in ("sum", "mean")):
        raise TritonUnsupported("reduce_by='all' with a reducer other than sum/mean or "
                                "with an update (per-row partials are added)")
    return r.name


def render_propagate(params: dict, in_types: list, index_dtype, has_perm: bool = False,
                     schedule: TritonSchedule | None = None, *,
                     symbol: str = "tiga_propagate",
                     relation: tuple = ("csr",)) -> KernelSource:
    """Triton source and signature of one fused kernel for a propagate equation.
    Raises TritonUnsupported (a tg.UnsupportedError) naming what is not rendered."""
    schedule = schedule or TritonSchedule()
    sig = signature_of(params, list(in_types), index_dtype, has_perm, schedule, symbol,
                       relation)
    main = main_body(params, sig, schedule.row_tile)
    if sig.split_degree:
        sig = replace(sig, split_states=main.state_layout())
    args = [s.replace(":", "") for s in sig.slots]
    tail = ["n_rows", "BLOCK_R: tl.constexpr", "BLOCK_N: tl.constexpr"]
    bodies = [(symbol, args, main.render())]
    if sig.split_degree:
        extra = [f"part{j}" for j in range(len(sig.split_states))] + ["split_a", "split_b"]
        bodies += [(f"{symbol}_{mode}", args + extra, _Body(params, sig, mode).render())
                   for mode in ("part", "comb")]
    head = ["# generated by tiga (lower/triton); do not edit",
            "import triton", "import triton.language as tl", ""]
    helpers = [HELPERS[h] for h in sorted(set().union(*(b.helpers for _, _, b in bodies)))]
    text = "\n".join(head) + "\n" + "\n".join(helpers) + ("\n" if helpers else "")
    text += "\n\n".join(f"@triton.jit\ndef {name}({', '.join(a + tail)}):\n" +
                         "\n".join(b.lines) + "\n" for name, a, b in bodies)
    return KernelSource(text, sig)


def main_body(params: dict, sig, row_tile: bool) -> _Body:
    """The main kernel's body: row-tiled where the schedule says so (tile row_tile) and the
    walk is a stored CSR's rows folded into reducer states; else the row loop."""
    if row_tile and tuple(sig.relation) in TILED_RELATIONS and sig.reduce_by in ("dst", "src"):
        return TiledBody(params, sig)
    if row_tile and sig.relation[0] == "radius" and "row_order" in sig.slots:
        return CellTiledBody(params, sig)
    return _Body(params, sig)
