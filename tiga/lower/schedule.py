"""lower: the schedule decisions of the cpu-llvm propagate kernel, as pure functions.

`select_kernel_schedule` calls these on a `gf_kernel.launch`; the renderer (lower/llvm/kernel.py)
reads the result from the Schedule it receives and only calls them itself when it is handed
no Schedule (the generated-relation walks), so each decision has one owner.

- edge_unroll: independent accumulators per row for reassociable folds (sum/mean over
  float32/float64 or integers). One accumulator makes every edge wait for the previous add
  (4 cycles), which bounds a 32-feature weighted sum at about 1.5 ns per edge; several let
  edges overlap. The budget keeps every accumulator in vector registers. Only contiguous
  walks (a row's edges are one id range) unroll, and walks of a static pattern (a
  stencil's offsets, LANE_FOLD_TRAVERSALS: offset k folds into accumulator k % lanes), and
  only row reductions (dst/src).
- stencil_window: a stencil sum whose messages depend on their source only slides a window
  of column sums along the last axis (lower/llvm/stencil_window.py) where that evaluates
  fewer messages a point than the pattern has offsets (the 26-point box: 9 source rows a
  point, not 26).
- prefetch_distance: edges ahead for the software prefetch of gathered neighbour rows; only
  compressed-row walks gather at random (implicit walks read regular sources). 16 edges cover
  the memory latency at a few ns per edge.
- parallel: "rows" (any row chunks), "partial_sums" (reduce_by='all' with sum and no update:
  each chunk folds into its own output and the runtime adds them) or "single" (one call).
- threads, row_partition, chunks_per_thread: how the runtime splits rows over its pool
  (xla_free_runtime/threads.row_chunks reads them from the launch's Schedule). Rows are
  balanced by rows + edges where rows differ in length and by rows where every row costs
  the same or the edge count is unknown before the walk (radius/kNN); CHUNKS_PER_THREAD
  chunks per thread absorb uneven rows and a thread the OS preempts (threads claim chunks
  inside native code, one atomic add each, so fine chunks cost nothing measurable). Below
  PARALLEL_MIN_WORK rows + edges one call on the caller's thread wins.
- knn_tiles: the register blocking and cache tiles of the knn-tiled-scan walk.
- attention_tiles: the register tiles and key blocks of the float32 attention kernels
  (lower/llvm/attention.py forward, attention_backward.py backward), which the runtime also
  cuts its jobs and scratch arrays by.
"""
from __future__ import annotations

from ..core.dtypes import as_dtype

EDGE_UNROLL = 4
UNROLL_STATE_BYTES = 512   # total accumulator bytes (all lanes) of an unrolled edge loop
PREFETCH_DISTANCE = 16
GATHERING_TRAVERSALS = ("csr-row", "transposed-csr-row")
# (radius/kNN walks compute their neighbours: no edge id range to unroll over)
# (walks by source of implicit relations compute each edge's id: not one range either)
NON_CONTIGUOUS_TRAVERSALS = ("stencil-row", "cell-directory-row", "knn-shell-row",
                             "knn-tile-row", "transposed-dense-row",
                             "transposed-triangular-row", "transposed-segment-row",
                             "transposed-stencil-row")
# (a stencil's offsets are static: edge k of the pattern folds into accumulator k % lanes)
LANE_FOLD_TRAVERSALS = ("stencil-row",)
# (a stencil sum of source-only messages slides a window of column sums along the last
# axis where that evaluates fewer messages per row than the pattern has offsets)
WINDOW_TRAVERSALS = ("stencil-row",)
CHUNKS_PER_THREAD = 16
PARALLEL_MIN_WORK = 1 << 15     # rows + edges below which one call on the caller's thread wins
# every row costs the same (dense, stencil), or its edges are found by the walk itself
ROW_BALANCED_TRAVERSALS = ("dense-row", "stencil-row", "cell-directory-row", "knn-shell-row",
                           "knn-tile-row", "transposed-dense-row", "transposed-stencil-row")
# knn-tiled-scan: a query tile's top-k states stay live while it scans source chunks of
# KNN_CHUNK_BYTES (kept in L2); the product block is group_rows queries x group_vectors
# vectors of KNN_VECTOR_BYTES. 512-bit registers (32 of them) hold 8 x 2 accumulators plus
# the operands; with 256-bit registers a 64-byte vector is two, so groups are 4 x 1.
KNN_ROWS_PER_TILE = 256
KNN_CHUNK_BYTES = 256 << 10
KNN_VECTOR_BYTES = 64


def _nbytes(t) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n * as_dtype(t.dtype).itemsize


def edge_unroll(reducer_name: str, builtin: bool, state_types: list, reduce_by: str,
                traversal: str) -> int:
    """Accumulators per row; `state_types` is the accumulator type of each output."""
    if (reduce_by not in ("dst", "src") or (traversal in NON_CONTIGUOUS_TRAVERSALS
                                            and traversal not in LANE_FOLD_TRAVERSALS)
            or EDGE_UNROLL <= 1 or not builtin or reducer_name not in ("sum", "mean")
            or not state_types
            or any(as_dtype(t.dtype).name in ("float16", "bool") for t in state_types)):
        return 1
    state_bytes = sum(_nbytes(t) for t in state_types)
    lanes = EDGE_UNROLL
    while lanes > 1 and lanes * state_bytes > UNROLL_STATE_BYTES:
        lanes //= 2
    return lanes


def stencil_window(traversal: str, reduce_by: str, window_evals: int, edges: int) -> bool:
    """Whether a stencil sum whose messages depend on their source only runs the
    sliding-window loop (lower/llvm/stencil_window.py): `window_evals` messages a row
    there against `edges` in the row walk."""
    return (traversal in WINDOW_TRAVERSALS and reduce_by == "dst" and
        0 < window_evals < edges)


def prefetch_distance(traversal: str) -> int:
    return PREFETCH_DISTANCE if traversal in GATHERING_TRAVERSALS else 0


def parallel_mode(reduce_by: str, reducer_name: str, builtin: bool, has_update: bool) -> str:
    if reduce_by != "all":
        return "rows"
    return ("partial_sums" if builtin and reducer_name == "sum" and not has_update
        else "single")


def traversal_of_walk(relation: tuple, walk: str) -> str:
    """The Kernel IR traversal a renderer walk implements (walks.relation_descriptor)."""
    if walk == "src":
        return {"dense_t": "transposed-dense-row", "triangular_t": "transposed-triangular-row",
                "cu_seqlens_t": "transposed-segment-row",
                "stencil_t": "transposed-stencil-row"}.get(relation[0], "transposed-csr-row")
    return {"csr": "csr-row", "dense": "dense-row", "triangular": "triangular-row",
            "cu_seqlens": "segment-row", "stencil": "stencil-row"}.get(relation[0], "csr-row")


# triton: a row of more than SPLIT_TILES neighbour tiles is cut into chunks of that many
# edges, each folded by its own program, then merged (kernel.py's split path): one program
# walking a hub row serially would be the tail of the whole launch.
SPLIT_TILES = 8
SPLIT_TRAVERSALS = ("csr-row", "transposed-csr-row")


def triton_split_tiles(block_neighbors: int, traversal: str, reduce_by: str,
                       max_degree=None) -> tuple:
    """The split path's tile as (name, value) pairs (Schedule.tiles of a triton launch):
    none where the walk has no stored edge ranges, no reducer state, or a static degree
    bound no row exceeds."""
    split = SPLIT_TILES * block_neighbors
    if (traversal not in SPLIT_TRAVERSALS or reduce_by not in ("dst", "src") or
            (type(max_degree) is int and max_degree <= split)):
        return ()
    return (("split_degree", split),)


# triton: a stored CSR walk gathers a [rows, block_neighbors] tile of column ids per program
# and the [rows, block_neighbors, width] tile of neighbour rows at once (row_tiles.py), so a
# program keeps rows x block_neighbors independent gathers in flight where the row loop
# keeps block_neighbors. Rows per program: the tile stays within ROW_TILE_ELEMENTS
# elements (about 32 registers per thread at ROW_TILE_WARPS warps), at least 2 rows (one
# row is the row loop's tile). Long rows keep the split path (split_degree). A radius cell
# walk tiles the same way (cell_tiles.py): a program's rows are consecutive in cell order
# and walk their neighbour cells as [rows, block_neighbors] candidate tiles.
ROW_TILE_ELEMENTS = 4096
ROW_TILE_MAX_ROWS = 64
ROW_TILE_WARPS = 4
ROW_TILE_TRAVERSALS = ("csr-row", "transposed-csr-row", "cell-directory-row")


def triton_row_tile(traversal: str, reduce_by: str, block_neighbors: int,
                    edge_width: int) -> int:
    """Rows of one row-tiled program (0: the row loop). `edge_width`: padded elements of
    the widest per-edge value of the edge function (a row of its widest tile)."""
    if traversal not in ROW_TILE_TRAVERSALS or reduce_by not in ("dst", "src"):
        return 0
    rows = ROW_TILE_ELEMENTS // (block_neighbors * max(1, edge_width))
    if rows < 2:
        return 0
    return min(ROW_TILE_MAX_ROWS, 1 << (rows.bit_length() - 1))


# A relation walked by source keeps a transposed row_ptr of num_src + 1 entries only while
# that is about its edges; past it (2**31 sources, 3 edges) the transpose is stored over the
# sources with edges only and each row finds its edges by a cursor or a binary search.
SPARSE_ROWS_RATIO = 2
SPARSE_ROWS_MIN = 1 << 16


def sparse_sources(num_src, num_edges) -> bool:
    """Whether a walk by source stores its transpose over the sources with edges only."""
    return (type(num_src) is int and type(num_edges) is int and
        num_src > SPARSE_ROWS_RATIO * num_edges + SPARSE_ROWS_MIN)


def row_partition(traversal: str) -> str:
    return "row-balanced" if traversal in ROW_BALANCED_TRAVERSALS else "edge-balanced"


def cpu_threads(threads: int, rows, edges) -> int:
    """Threads a cpu-llvm launch runs on: the pool size, 1 when the (static) work is below
    PARALLEL_MIN_WORK, at most one per row. Symbolic sizes leave the pool size."""
    if isinstance(rows, int):
        if isinstance(edges, int) and rows + edges < PARALLEL_MIN_WORK:
            return 1
        return max(1, min(threads, rows))
    return threads


def host_wide_vectors() -> bool:
    """Whether the host has 512-bit vectors (AVX-512: 32 vector registers)."""
    global _WIDE
    if _WIDE is None:
        try:
            import llvmlite.binding as llvm

            _WIDE = "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")
        except (ImportError, RuntimeError):
            _WIDE = False
    return _WIDE


_WIDE = None


def knn_tiles(wide: bool) -> tuple:
    """The knn-tiled-scan tiles as (name, value) pairs (Schedule.tiles)."""
    rows, vectors = (8, 2) if wide else (4, 1)
    return (("vector_bytes", KNN_VECTOR_BYTES), ("group_rows", rows),
            ("group_vectors", vectors), ("rows_per_tile", KNN_ROWS_PER_TILE),
            ("chunk_bytes", KNN_CHUNK_BYTES))


# The attention-tiles walk (lower/llvm/attention.py, attention_backward.py; names: their
# TILES). Forward: group_rows query rows x step_vectors <16 x float> score vectors per
# register tile (6 x 4: 24 accumulators, 4 K^T loads and 6 q broadcasts per 24 FMAs;
# measured with benchmarks/attention.py: 6 x 64 keys beat 4 x 16, 4 x 32, 4 x 64 and 8 x 64,
# which spills), row_groups groups per job pass over one key block of key_block keys while
# its K^T and V tiles stay in cache, pv_unroll keys per trip of the P @ V loop. Backward:
# group_rows rows per register group, tile_rows rows per tile (their q, dO rows and P, dS
# tiles on the stack), key_block keys per packed key block, group_keys keys per register
# group of the dk / dv products.
ATTENTION_FORWARD_TILES = (("group_rows", 6), ("row_groups", 8), ("key_block", 256),
                           ("step_vectors", 4), ("pv_unroll", 4))
ATTENTION_BACKWARD_TILES = (("group_rows", 6), ("tile_rows", 48), ("key_block", 64),
                            ("group_keys", 4))


def attention_tiles(kernel: str) -> tuple:
    """The tiles of the "forward" or "backward" attention kernel as (name, value) pairs
    (Schedule.tiles)."""
    return ATTENTION_FORWARD_TILES if kernel == "forward" else ATTENTION_BACKWARD_TILES


# triton: tl.dot's input precision for float32 operands. "ieee" keeps float32 products exact
# (the reference interpreter's within rounding); "tf32" rounds the operands to 10 mantissa
# bits for tensor cores, only where the caller asks (TIGA_TF32=1). float16 / bfloat16
# operands take tensor cores whatever it says, with float32 accumulation; float64 is ieee.
def triton_dot_precision(operand_dtype: str, allow_tf32: bool) -> str:
    return "tf32" if allow_tf32 and operand_dtype == "float32" else "ieee"


# triton attention (lower/triton/attention.py): queries x keys per program. The interpreter
# runs 16 x 16 tiles (tl.dot's minimum: fast on CPU). On a GPU a larger query block reuses
# each K/V tile for more rows (flash attention's shape: 128 x 64 at 16-bit operands, half
# that at float32, whose tiles take twice the registers and shared memory); a wide head
# halves the query block until its [BLOCK_M, head width] float32 accumulator holds at most
# ATTENTION_ACC_ELEMENTS (64 registers a thread at 4 warps). float64 (no tensor cores)
# keeps 32 x 32. Two stages: compiled for sm_90 (benchmarks/triton_compile_check.py) the
# 16-bit forward at head width 64 takes 221 KB of shared memory with two, 238 KB with
# three, over the H100's 227 KB (its non-finite tile products are dots too).
ATTENTION_GPU_BLOCKS = {2: (128, 64, 8, 2), 4: (64, 32, 4, 2), 8: (32, 32, 4, 1)}
ATTENTION_ACC_ELEMENTS = 8192


def triton_attention_blocks(itemsize: int, head_width: int, interpreter: bool) -> tuple:
    """(block_m, block_n, num_warps, num_stages) of the attention kernels; `itemsize`: the
    bytes of an operand element, `head_width`: the padded (power of two) key/value width."""
    if interpreter:
        return 16, 16, 4, 1
    block_m, block_n, warps, stages = ATTENTION_GPU_BLOCKS[itemsize]
    while block_m > 32 and block_m * head_width > ATTENTION_ACC_ELEMENTS:
        block_m //= 2
    return block_m, block_n, warps, stages


# triton entity-level linear layers (lower/triton/linear.py): C tiles of BLOCK_M x BLOCK_N,
# the contracted axis in BLOCK_K steps; each block a power of two >= 16 (tl.dot's minimum)
# and no wider than the padded extent it covers. 64 x 64 tiles with 32-deep steps (one
# step for the 32-wide inputs of an edge MLP), as the smaller configurations of Triton's
# matmul tutorial; float64 (no tensor cores) 32 x 32. The interpreter takes 128-row tiles:
# it runs each program's tile as numpy arrays, so fewer, larger programs are faster (a
# 2000 x 64 x 64 product: 0.49 s at 16 rows, 0.08 s at 128).
MATMUL_GPU_BLOCKS = {2: (64, 64, 32, 4, 3), 4: (64, 64, 32, 4, 2), 8: (32, 32, 16, 4, 1)}


def triton_matmul_blocks(m: int, n: int, k: int, itemsize: int, interpreter: bool) -> tuple:
    """(block_m, block_n, block_k, num_warps, num_stages) of tile_matmul for an (m, k) x
    (k, n) product of `itemsize`-byte operands."""
    bm, bn, bk, warps, stages = ((128, 64, 64, 4, 1) if interpreter else
        MATMUL_GPU_BLOCKS[itemsize])

    def fit(block: int, extent: int) -> int:
        return max(16, min(block, 1 << max(0, int(extent) - 1).bit_length()))
    return fit(bm, m), fit(bn, n), fit(bk, k), warps, stages
