"""lower/passes: Kernel -> Kernel: choose each launch's schedule from its shapes.

- threads: TIGA_NUM_THREADS or os.cpu_count(), capped by the number of row blocks when the
  row count is static;
- block_rows: rows whose output fits about 4 KiB (a few cache lines per row), 1..64;
- vector_width: the widest 256-bit SIMD lane count dividing the feature width;
- block_neighbors: 16, or the degree bound rounded up to a power of two when it is smaller;
- num_warps / pipeline_stages: the Triton view of the same tile (more warps for wider tiles,
  a second stage once a row is at least 256 bytes);
- row_partition: edge-balanced chunks unless every row has the same length;
- edge_unroll, prefetch_distance, parallel: what the cpu-llvm renderer reads (lower/schedule.py
  owns those decisions; the runtime lowers each equation through this pass and hands the
  renderer the Schedule printed here).
"""
from __future__ import annotations

from dataclasses import replace

from ...core.config import env_num_threads
from ...core.dtypes import compute_dtype
from ...core.errors import CompilationError
from ...core.types import Dim
from ..ir.kernel import KernelModule, LaunchOp, Schedule
from ..schedule import edge_unroll, parallel_mode, prefetch_distance
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


def choose_schedule(op: LaunchOp, threads: int) -> Schedule:
    width, itemsize = _row_width(op)
    row_bytes = width * itemsize
    block_rows = min(64, _pow2_floor(ROW_BYTES_TARGET // row_bytes))
    vector_width = 1
    while (vector_width * 2 <= min(16, SIMD_BYTES // itemsize)
           and width % (vector_width * 2) == 0):
        vector_width *= 2
    bound = dict(op.guards).get("max_degree")
    block_neighbors = min(16, _pow2_ceil(bound)) if type(bound) is int else 16
    g = op.comp.relation.type
    rows = g.num_src if op.ordering == "source-major" else g.num_dst
    if isinstance(rows, int):
        threads = min(threads, max(1, -(-rows // block_rows)))
    num_warps = min(8, _pow2_floor(block_rows * width // 128))
    stages = 2 if row_bytes >= 256 else 1
    uniform = op.traversal in ("dense-row", "stencil-row")
    return Schedule(block_rows, block_neighbors, vector_width, threads, num_warps, stages,
                    "row-balanced" if uniform else "edge-balanced", *_renderer_knobs(op))


def _renderer_knobs(op: LaunchOp) -> tuple:
    """(edge_unroll, prefetch_distance, parallel) of the cpu-llvm kernel for this launch."""
    comp, red = op.comp, op.comp.reducer
    states = [group[0] for group in red.state if group]
    return (edge_unroll(red.name, red.builtin, states, comp.reduce_by, op.traversal),
            prefetch_distance(op.traversal),
            parallel_mode(comp.reduce_by, red.name, red.builtin, comp.update is not None))


def select_kernel_schedule(module: KernelModule, *, threads: int | None = None) -> KernelModule:
    expect_level(module, KernelModule, "select-kernel-schedule")
    n = default_threads() if threads is None else threads

    def schedule(op):
        return replace(op, schedule=choose_schedule(op, n)) if isinstance(op, LaunchOp) else op

    out = KernelModule(module.name, map_ops(module.body, schedule))
    out.verify()
    return out
