"""lower/passes: Kernel -> Kernel: choose each launch's schedule for a target from its shapes.

A launch prints only the attributes its target runs (ir/kernel.TARGET_KEYS).

cpu-llvm (lower/schedule.py owns the decisions; the runtime lowers each equation through this
pass, renders from the Schedule printed here and runs its row chunks as it says):
- threads: TIGA_NUM_THREADS or os.cpu_count(); 1 when static sizes are below the parallel
  threshold, at most one per row;
- row_partition, chunks_per_thread: how the runtime cuts rows into chunks;
- edge_unroll, prefetch_distance, parallel: what the kernel's edge loop does;
- tiles: the knn-tiled-scan register blocking and cache tiles; the attention-tiles walk's
  register tiles and key blocks (forward or backward kernel; none for the row-statistics
  walks, which run numpy tiles). An attention launch runs on the whole pool (its runtime
  cuts head x row-block jobs of equal work: edge-balanced, chunks_per_thread per thread).

triton (the GPU view of the same launch):
- block_rows: rows whose output fits about 4 KiB (a few cache lines per row), 1..64;
- vector_width: the widest 256-bit SIMD lane count dividing the feature width;
- block_neighbors: 16, or the degree bound rounded up to a power of two when it is smaller;
- num_warps / pipeline_stages: more warps for wider tiles, a second stage once a row is at
  least 256 bytes;
- tiles split_degree: rows of a stored CSR walk above 8 neighbour tiles run split across
  programs whose partial reducer states a combine kernel merges (none under a degree bound).
- tiles row_tile: a stored CSR walk by dst or src gathers block_rows rows x block_neighbors
  neighbours per program as one tile (lower/schedule.triton_row_tile sizes it from the
  widest per-edge value; ROW_TILE_WARPS warps); absent: each program loops over its rows.
  A weight matrix the edge function multiplies only as a tl.dot of the tile (a per-edge
  row times it: lower/triton/rules/linalg.tile_dot_form) is held once per program and is
  no per-edge value; a broadcast product's weight is (it is multiplied on every lane).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.config import config, env_num_threads
from ...core.dtypes import compute_dtype
from ...core.errors import CompilationError
from ...core.types import Dim
from ..attention_walk import ATTENTION_TILES, attention_kernel
from ..ir.kernel import TARGET_KEYS, KernelModule, LaunchOp, Schedule
from ..ir.syntax import AttrDict
from ..schedule import (
    CHUNKS_PER_THREAD,
    ROW_TILE_WARPS,
    attention_tiles,
    cpu_threads,
    edge_unroll,
    host_wide_vectors,
    knn_tiles,
    parallel_mode,
    prefetch_distance,
    row_partition,
    triton_row_tile,
    triton_split_tiles,
)
from ..triton.rules.linalg import TILE_DOT_LANES, tile_dot_form
from .common import expect_level, map_ops

ROW_BYTES_TARGET = 4096
SIMD_BYTES = 32


def default_threads() -> int:
    # one reader (core.config) so the schedule and the runtime pool agree, cap included
    return env_num_threads(CompilationError)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _row_width(op: LaunchOp) -> tuple:
    """(elements per output row, bytes per element of compute) over the launch's results."""
    width, itemsize = 1, 1
    for v in op.results:
        dims = v.type.shape if op.comp.reduce_by == "all" else v.type.shape[1:]
        n = 1
        for d in dims:
            n *= 1 if isinstance(d, Dim) else int(d)
        width = max(width, n)
        itemsize = max(itemsize, compute_dtype(v.type.dtype).itemsize)
    return width, itemsize


def choose_schedule(op: LaunchOp, threads: int, target: str = "cpu-llvm") -> Schedule:
    g = op.comp.relation.type
    rows = g.num_src if op.ordering == "source-major" else g.num_dst
    if target == "cpu-llvm":
        return _cpu_schedule(op, threads, rows, g.num_edges)
    if target != "triton":
        raise CompilationError(f"select-kernel-schedule: target must be one of "
                               f"{', '.join(TARGET_KEYS)}, found {target!r}")
    width, itemsize = _row_width(op)
    row_bytes = width * itemsize
    block_rows = min(64, _pow2_floor(ROW_BYTES_TARGET // row_bytes))
    vector_width = 1
    while (vector_width * 2 <= min(16, SIMD_BYTES // itemsize)
           and width % (vector_width * 2) == 0):
        vector_width *= 2
    bound = dict(op.guards).get("max_degree")
    block_neighbors = min(16, _pow2_ceil(bound)) if type(bound) is int else 16
    num_warps = min(8, _pow2_floor(block_rows * width // 128))
    stages = 2 if row_bytes >= 256 else 1
    tiles = AttrDict(triton_split_tiles(block_neighbors, op.traversal, op.comp.reduce_by,
                                        bound))
    tiled = _row_tile(op, block_neighbors)
    if tiled:
        block_rows, num_warps = tiled, ROW_TILE_WARPS
        tiles = AttrDict(tuple(tiles) + (("row_tile", 1),))
    return Schedule(target="triton", block_rows=block_rows, block_neighbors=block_neighbors,
                    vector_width=vector_width, num_warps=num_warps, pipeline_stages=stages,
                    parallel=_parallel(op), tiles=tiles)


def _row_tile(op: LaunchOp, block_neighbors: int) -> int:
    """Rows of a row-tiled program (0: the row loop), sized by what the tile holds per edge.
    A product of the tile and a weight matrix is a tl.dot when the tile has TILE_DOT_LANES
    lanes (rows x neighbours): the matrix is held once per program, not per edge; with
    fewer lanes it is a broadcast product and counts per edge."""
    rows = triton_row_tile(op.traversal, op.comp.reduce_by, block_neighbors,
                           _edge_width(op, _tile_dot_weights(op)))
    if rows and rows * block_neighbors < TILE_DOT_LANES:
        rows = triton_row_tile(op.traversal, op.comp.reduce_by, block_neighbors,
                               _edge_width(op))
    return rows


def _edge_width(op: LaunchOp, held: frozenset = frozenset()) -> int:
    """Padded elements of the widest value the edge function holds per edge (its arguments,
    parameters included: a weight matrix bounds the broadcast product of its dot), except
    the values named in `held` (matrices a tl.dot holds once per program)."""
    region = op.comp.edge
    width = 1
    for v in list(region.args) + [r for o in region.ops for r in getattr(o, "results", ())]:
        if v.name in held:
            continue
        n = 1
        for d in getattr(v.type, "shape", ()):
            n *= 1 if isinstance(d, Dim) else _pow2_ceil(int(d))
        width = max(width, n)
    return width


def _tile_dot_weights(op: LaunchOp) -> frozenset:
    """Names of the parameter matrices the edge function reads only as the weight of a tile
    product, a per-edge row times the matrix that lower/triton renders as one tl.dot
    (rules/linalg.tile_dot_form); any other use (a broadcast, an elementwise op) keeps it
    counted per edge."""
    region, roles = op.comp.edge, op.comp.input_roles
    if len(region.args) != len(roles):
        return frozenset()
    per_edge = {a.name for a, r in zip(region.args, roles) if r != "param"}
    params = {a.name for a, r in zip(region.args, roles) if r == "param"}
    dots, other = set(), set()
    for o in region.ops:
        names = [v.name for v in getattr(o, "operands", ())]
        if any(n in per_edge for n in names):
            per_edge.update(r.name for r in o.results)
        if getattr(o, "prim", None) == "dot_general" and _is_tile_dot(o, per_edge, params):
            dots.add(names[1])
        else:
            other.update(names)
    return frozenset(dots - other)


def _is_tile_dot(o, per_edge: set, params: set) -> bool:
    x, y = o.operands
    (lc, rc), (lb, rb) = dict(o.params)["dimension_numbers"]
    if lb or rb or len(lc) != 1 or x.name not in per_edge or y.name not in params:
        return False
    dtypes = {x.type.dtype.name, y.type.dtype.name, o.results[0].type.dtype.name}
    return tile_dot_form(tuple(x.type.shape), tuple(y.type.shape), int(lc[0]), dtypes)


def _parallel(op: LaunchOp) -> str:
    comp, red = op.comp, op.comp.reducer
    return parallel_mode(comp.reduce_by, red.name, red.builtin, comp.update is not None)


def _cpu_schedule(op: LaunchOp, threads: int, rows, edges) -> Schedule:
    """The cpu-llvm launch: how the runtime chunks rows and what the kernel's loops do."""
    comp, red = op.comp, op.comp.reducer
    if op.traversal == ATTENTION_TILES:
        return _attention_schedule(op, threads)
    states = [group[0] for group in red.state if group]
    tiles = (AttrDict(knn_tiles(host_wide_vectors())) if op.traversal == "knn-tile-row"
        else AttrDict())
    return Schedule(target="cpu-llvm", threads=cpu_threads(threads, rows, edges),
                    row_partition=row_partition(op.traversal),
                    chunks_per_thread=CHUNKS_PER_THREAD,
                    edge_unroll=edge_unroll(red.name, red.builtin, states, comp.reduce_by,
                                            op.traversal),
                    prefetch_distance=prefetch_distance(op.traversal),
                    parallel=_parallel(op), tiles=tiles)


def _attention_schedule(op: LaunchOp, threads: int) -> Schedule:
    kernel = attention_kernel(op.comp)
    tiles = AttrDict(attention_tiles(kernel)) if kernel is not None else AttrDict()
    return Schedule(target="cpu-llvm", threads=threads, row_partition="edge-balanced",
                    chunks_per_thread=CHUNKS_PER_THREAD, edge_unroll=1, prefetch_distance=0,
                    parallel="rows", tiles=tiles)


def select_kernel_schedule(module: KernelModule, *, threads: int | None = None,
                           target: str = "cpu-llvm") -> KernelModule:
    expect_level(module, KernelModule, "select-kernel-schedule")
    n = default_threads() if threads is None else threads

    def schedule(op):
        return (replace(op, schedule=choose_schedule(op, n, target))
            if isinstance(op, LaunchOp) else op)

    out = KernelModule(module.name, map_ops(module.body, schedule))
    if config.check:     # (TIGA_CHECK, on in tests: a warm first call skips it)
        out.verify()
    return out
