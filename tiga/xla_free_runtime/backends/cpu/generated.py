"""runtime: the cpu-llvm route of a propagate over a generated relation (radius, knn).

The cpu-llvm backend's planner (CpuLLVM.plan) claims propagates grouped by destination
over a radius/knn relation without edge fields. Per call it builds the cell directory of the
source coordinates (O(N): sorted indices, sorted coordinates, cell starts, row visiting
order) and runs the fused kernel of lower/llvm/generated.py on row chunks: no edge list,
no distance array, no message array.

The compiled kernel depends only on the program's structure, field row shapes/dtypes and the
relation's static description (kind, traversal, dims, k, self-loop rule), never on the
number of points or the coordinates, so new coordinates of the same dims and dtype rebind
the cached executable (explain() reports the cache hit).

A propagate grouped by source over a symmetric relation (radius over one point set without
max_neighbors: j in N(i) iff i in N(j)) takes the same fused walk with the roles swapped
(rows are the sources), so the VJP's source and coordinate cotangents build no transposed
CSR. kNN, truncated radius and radius with a query set are asymmetric: their source-grouped
propagates, and propagates with edge fields or unsupported edge functions, resolve the
relation to CSR (transposed where needed) and take the generic kernel, which explain()
reports as the materialised CSR.

The walk's scheduled Kernel op is the one the executor hands down (`held`), kept in the
plan (GeneratedPlan.launch); this module never lowers.

Relations generated inside a traced program are planned before the call from their static
parameters (GeneratedType), so strict mode and explain() see the route that will run.

A concrete relation whose CSR is already materialised (resolve_csr ran: the torch bridge
resolves every radius/knn relation it is called on, to key the call on its edge count) is
left to the stored-CSR kernel: its rows read their neighbours from the edge list instead of
walking cells and testing every candidate's distance (several candidates per edge), and
its degrees are the row lengths.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ....core import graph_generated as geo
from ....core.dtypes import int64
from ....core.errors import CompilationError
from ....core.reducers import sum as sum_reducer
from ....lower import CPU_LLVM_AVAILABLE
from ....lower.binding import RelationBinding, swapped_params
from ....lower.ir.iter import KNN_TILED, hierarchy_for
from ....trace import math as tm
from ....trace.message_passing import propagate
from ...caches.equations import kept
from ...caches.executables import CACHE, full_key, llvm_key
from ...caches.relations import memo
from ...calls.threads import num_threads, row_chunks
from ...reports.explain import launch_facts, schedule_line
from .. import FixedKernel, KernelArgs, launch
from .propagate import (
    Fallback,
    Unbound,
    _address,
    _check_field,
    _np_dtype,
    kernel_text,
    unbound,
)

if CPU_LLVM_AVAILABLE:
    from ....lower.backends import BACKENDS
    from ....lower.llvm import CodegenUnsupported
    from ....lower.llvm.generated import DIRECTORY_SLOTS, GeoSpec
    from ....lower.llvm.knn_tiled import block_shape
    from ....lower.llvm.render import CallData, render_directory
    from . import knn_tiled

GENERATED_KINDS = ("radius", "knn")
KNN_POINTS_PER_CELL = 0.25      # cells hold about k/4 points: shells 0-1 usually hold k
RADIUS_REACH = 1
KNN_ESTIMATE_FACTOR = 1.5       # prefilter radius: about 1.5 k sources at mean density
_LOCK = threading.Lock()


def _spec(graph, tiles: dict) -> GeoSpec:
    """The walk's compile-time description; the knn-tiled-scan block comes from the
    launch's schedule tiles."""
    p = graph.params
    d = int(p["dims"])
    same = p["query"] is None
    k = p["k"] if graph.kind == "knn" else (p["max_neighbors"] or 0)
    dtype = np.dtype(p["positions"].dtype).name
    mode, block = ("cells" if d <= geo.FAST_DIMS else "scan"), ()
    if graph.kind == "radius" and p.get("cutoff") == float("inf"):
        mode = "scan"   # cutoff=inf: every pair is a neighbour, no cell can bound them
    if hierarchy_for(_gtype(graph)) == KNN_TILED:
        mode, block = "tiled", block_shape(dtype, tiles)
        if not isinstance(graph, GeneratedType) and not knn_tiled.expanded_form_fits(graph):
            mode, block = "scan", ()    # |p|^2 near the dtype's range: the exact plain scan
    return GeoSpec(kind=graph.kind, mode=mode, dims=d, k=int(k),
                   exclude_self=bool(same and not p["loop"]), pos_dtype=dtype, block=block)


def _gtype(graph):
    return graph.type if isinstance(graph, GeneratedType) else graph.type()


def _launch(eqn, swap: bool, held=None):
    """The scheduled `gf_kernel.launch` of the walk this planner runs (a source-grouped
    propagate over a symmetric relation is lowered as the destination-grouped one with the
    roles swapped, which is what runs): `held`, the op handed down for it (the call's bound
    Task module's), else an Unbound."""
    gtype = eqn.inputs[0].type
    if (held is not None and held.comp.relation.type.kind == gtype.kind
            and held.ordering != "source-major"):
        return held
    return unbound(f"{gtype.kind} cell" + (" (roles swapped)" if swap else ""))


def symmetric(graph) -> bool:
    """j in N(i) iff i in N(j): radius over one point set without max_neighbors (the test
    (p_j - p_i)^2 rounds like (p_i - p_j)^2, and loop=False drops both diagonals alike).
    kNN and truncated radius are not, nor is a query set different from the sources."""
    p = graph.params
    return graph.kind == "radius" and p["query"] is None and not p["max_neighbors"]


swapped = swapped_params     # (the binding's rewrite: what the swapped walk runs)


class GeneratedType:
    """A radius/knn relation generated inside a traced program, before the call: its kind
    and generating parameters are static (the producing equation's params), its
    coordinates are not. Enough to plan (and compile) the fused kernel, for strict mode
    and explain(); the call re-plans on the concrete relation (same cache key)."""

    edge_perm = None
    index_dtype = int64

    def __init__(self, gtype, gen_eqn):
        ep = gen_eqn.params
        pos_t = gen_eqn.inputs[0].type
        self.kind, self.type = gtype.kind, gtype
        self.num_src, self.num_dst = gtype.num_src, gtype.num_dst
        self.params = {"dims": int(pos_t.shape[1]), "loop": bool(ep["loop"]),
                       "query": None if len(gen_eqn.inputs) == 1 else "traced",
                       "k": ep.get("k"), "max_neighbors": ep.get("max_neighbors"),
                       "cutoff": ep.get("cutoff"),
                       "positions": np.empty((0, int(pos_t.shape[1])), pos_t.dtype.np)}


def generated_relations(program) -> dict:
    """{id(graph var): GeneratedType} for the radius/knn relations `program` generates."""
    from ....core.prims.generated import knn_p, radius_p

    return {id(e.outputs[0]): GeneratedType(e.outputs[0].type, e) for e in program.eqns
            if e.primitive in (radius_p, knn_p)}


def _key(eqn, spec: GeoSpec, launch, swap: bool) -> str:
    """The kernel's cache key: its printed launch op (the walk that runs: roles swapped for
    a symmetric source-grouped propagate) and the walk's spec, which the op does not print."""
    per_eqn = kept(eqn, "generated")
    variant = (spec, swap, num_threads())
    key = per_eqn.get(variant)
    if key is None:
        lowered = per_eqn.get("swapped", eqn) if swap else eqn
        key = per_eqn[variant] = llvm_key(kernel_text(launch, lowered),
                                          ("generated-propagate", spec.descriptor()))
    return key


def _materialise(graph) -> None:
    if not isinstance(graph, GeneratedType):
        if CPU_LLVM_AVAILABLE:
            knn_tiled.adopt_csr(graph)  # a knn-tiled-scan call already selected every row
        graph.resolve_csr()     # the generic kernel walks the materialised relation


def resolved(graph) -> bool:
    """Whether this concrete relation already holds its materialised CSR (resolve_csr ran:
    the torch bridge resolves a relation to key its calls on the edge count, an asymmetric
    VJP for its transpose). Its propagates then walk that CSR with the stored-CSR kernel:
    the edge list exists anyway, and reading a row's neighbours from it skips the cell
    walk and the distance test of every candidate (several per accepted edge)."""
    return not isinstance(graph, GeneratedType) and getattr(graph, "_csr", None) is not None


def generated_binding(eqn, graph):
    """How a propagate over this radius/knn relation is bound: its cell walk (by source over a
    symmetric relation, the destination-grouped walk with the roles swapped) and the
    directory builds it runs, or None where it walks the materialised CSR (plan_generated
    declines it: resolved already, kNN or truncated radius by source, edge fields)."""
    if not CPU_LLVM_AVAILABLE or resolved(graph):
        return None
    p = eqn.params
    swap = p["reduce_by"] == "src" and symmetric(graph)
    if (p["reduce_by"] != "dst" and not swap) or "edge" in p["roles"]:
        return None
    return RelationBinding(eqn.inputs[0].type, swapped=swap, kernels=directory_kernels(graph))


def directory_kernels(graph) -> tuple:
    """The fixed kernels a walk of this relation runs: the cell directory build (points
    sorted by cell) where it walks cells (not a plain or tiled scan)."""
    p = graph.params
    d = int(p["dims"])
    scan = d > geo.FAST_DIMS or (graph.kind == "radius" and p.get("cutoff") == float("inf"))
    if scan or hierarchy_for(_gtype(graph)) == KNN_TILED:
        return ()
    return (directory_kernel(d, np.dtype(p["positions"].dtype).name),)


def plan_generated(eqn, graph, compile: bool, held=None):
    if getattr(graph, "kind", None) not in GENERATED_KINDS or not CPU_LLVM_AVAILABLE:
        return None
    if resolved(graph):
        return None     # the generic stored-CSR kernel (transposed where grouped by src)
    p = eqn.params
    swap = p["reduce_by"] == "src" and symmetric(graph)
    if (p["reduce_by"] != "dst" and not swap) or "edge" in p["roles"]:
        _materialise(graph)     # kNN / truncated radius / query: transposed where needed
        return None
    launch = _launch(eqn, swap, held)
    if isinstance(launch, Unbound):
        return launch
    spec = _spec(graph, dict(launch.schedule.tiles))
    key = _key(eqn, spec, launch, swap)

    def build(symbol):
        # (the launch's computation has the roles swapped where the walk runs swapped)
        source = BACKENDS["cpu-llvm"].render(launch, symbol, CallData(walk_spec=spec))
        return source.text, source.signature

    try:
        if not compile:
            if CACHE.status(key) == "miss":
                build("probe")
            return GeneratedPlan(None, spec, key, swap, launch)
        return GeneratedPlan(CACHE.get(key, build), spec, key, swap, launch)
    except CodegenUnsupported:
        _materialise(graph)
        return None
    except CompilationError as exc:
        return Fallback(f"LLVM compilation of the generated-relation kernel failed ({exc}); "
                        "this is a Tiga bug, please report")


def directory_arrays(graph, spec: GeoSpec, tiles: dict) -> dict:
    """The per-call walk arrays (cached on the relation: its coordinates are frozen)."""
    cached = memo(graph).get("directory")
    if cached is not None and cached[0] == (spec, tuple(tiles.items())):
        return cached[1]
    p = graph.params
    pos = p["positions"]
    q = graph.query_positions
    d, n = spec.dims, len(pos)
    cutoff = float(p.get("cutoff", 0.0))
    sq = geo.squared_cutoff(cutoff, pos.dtype) if spec.kind == "radius" else 0.0
    if spec.mode == "tiled":
        arrays = knn_tiled.tiled_arrays(pos, q, spec, tiles)
        memo(graph)["directory"] = ((spec, tuple(tiles.items())), arrays)
        return arrays
    if spec.mode == "scan" or n == 0:
        width, reach, lo = 1.0, 1, np.zeros(d)
        dims = np.ones(d, np.int64)
        cells = {"cell_start": np.array([0, n], np.int64),
                 "sorted_idx": np.arange(n, dtype=np.int64), "sorted_pos": pos}
        row_order = np.arange(len(q), dtype=np.int64)
    else:
        lo, hi = geo.bounds(pos)
        extents = hi - lo
        if spec.kind == "radius":
            width = _width(extents, n, cutoff / RADIUS_REACH, 0.5)
            reach = int(np.ceil(cutoff * geo.WIDTH_MARGIN / width))
        else:
            with np.errstate(over="ignore"):    # extents near the dtype's range: volume inf
                cutoff = _knn_estimate(extents, n, spec.k, d)
            sq = geo.squared_cutoff(cutoff, pos.dtype) if cutoff > 0 else 0.0
            width = _width(extents, n, max(cutoff, (float(extents.max()) or 1.0) * 1e-9),
                           max(1.0, spec.k * KNN_POINTS_PER_CELL))
            reach = 1
        dims = (np.floor(extents / width) + 1).astype(np.int64)
        geo_f = _geo_f(cutoff, width, sq, lo)
        geo_i = np.concatenate([[n], dims, [int(np.prod(dims)), reach]]).astype(np.int64)
        cells = build_directory(pos, geo_f, geo_i)
        if p["query"] is None:
            row_order = cells["sorted_idx"]
        else:
            row_order = build_directory(np.ascontiguousarray(q), geo_f, geo_i)["sorted_idx"]
    arrays = {
        "geo_f": _geo_f(cutoff, width, sq, lo),
        "geo_i": np.concatenate([[n], dims, [int(np.prod(dims)), reach]]).astype(np.int64),
        "cell_start": cells["cell_start"], "sorted_idx": cells["sorted_idx"],
        "sorted_pos": cells["sorted_pos"], "row_order": row_order,
        "qpos": np.ascontiguousarray(q),
    }
    memo(graph)["directory"] = ((spec, tuple(tiles.items())), arrays)
    return arrays


def _knn_estimate(extents: np.ndarray, n: int, k: int, d: int) -> float:
    """A distance that holds about KNN_ESTIMATE_FACTOR * k sources at the mean density of
    the bounding box (0 when the box is flat): the prefilter radius of the knn kernel."""
    volume = float(np.prod(extents))
    if volume <= 0 or n == 0:
        return 0.0
    ball = {1: 2.0, 2: np.pi, 3: 4.0 * np.pi / 3.0}[d]
    return float((KNN_ESTIMATE_FACTOR * k * volume / (n * ball)) ** (1.0 / d))


def _geo_f(cutoff, width, sq, lo) -> np.ndarray:
    return np.concatenate([[cutoff, 1.0 / width, width, sq], lo]).astype(np.float64)


def _width(extents: np.ndarray, n: int, minimum: float, per_cell: float) -> float:
    """Cell width: at least `minimum`, about `per_cell` points per cell, and at most
    geo.MAX_CELLS_PER_POINT cells per point."""
    d = len(extents)
    w = minimum * geo.WIDTH_MARGIN
    extent = float(extents.max())
    if extent > 0:
        w = max(w, extent * (per_cell / n) ** (1.0 / d) * geo.WIDTH_MARGIN)
        while np.prod(np.floor(extents / w) + 1.0) > geo.MAX_CELLS_PER_POINT * n + 8:
            w *= 1.25
    return float(w) if w > 0 else 1.0


def build_directory(points: np.ndarray, geo_f: np.ndarray, geo_i: np.ndarray) -> dict:
    """Counting sort of the points by cell with the compiled directory kernel (O(N))."""
    n, d = points.shape
    cells = int(geo_i[1 + d])
    key = full_key(("generated-directory", d, points.dtype.name))
    exe = CACHE.get(key, lambda symbol: _source(render_directory(d, points.dtype.name,
                                                                 symbol=symbol)))
    if exe.kernel is None:
        exe.kernel = FixedKernel(directory_kernel(d, points.dtype.name))
    arrays = {"points": points, "geo_f": geo_f, "geo_i": geo_i,
              "cell_of": np.empty(n, np.int64), "cell_start": np.zeros(cells + 1, np.int64),
              "cursor": np.empty(cells, np.int64), "sorted_idx": np.empty(n, np.int64),
              "sorted_pos": np.empty_like(points)}
    argv = (ctypes.c_void_p * len(DIRECTORY_SLOTS))(*[_address(arrays[s])
                                                      for s in DIRECTORY_SLOTS])
    launch(exe, exe.kernel, KernelArgs(argv, rows=(n, 0)))
    return arrays


def directory_kernel(dims: int, dtype: str) -> str:
    """The name of the cell-directory build kernel (a counting sort of points by cell) for
    `dims`-D points of `dtype`; a generated relation's task lists it."""
    return f"cell_directory_{dims}d_{dtype}"


def _source(source) -> tuple:
    return source.text, source.signature


class GeneratedPlan:
    def __init__(self, exe, spec: GeoSpec, key: str, swap: bool, launch):
        self.exe, self.spec, self.key = exe, spec, key
        self.swap = swap    # a reduce_by='src' propagate over a symmetric relation
        self.launch = launch    # the scheduled gf_kernel.launch (None: not in the IR)
        self.schedule = launch.schedule     # (the walk's row chunks run by its Kernel op's)
        self.tiles = dict(self.schedule.tiles)

    def run(self, eqn, graph, values: list) -> list:
        sig = self.exe.signature
        arrays = dict(directory_arrays(graph, self.spec, self.tiles))
        stats = np.zeros(1, np.int64)
        arrays["stats"] = stats
        sizes = {"src": graph.num_src, "dst": graph.num_dst, "param": None}
        names = eqn.params["names"]
        permuted = self.spec.mode == "cells"
        for i, (x, r) in enumerate(zip(values, sig.roles)):
            f = _check_field(x, i, sig, sizes[r], names[i])
            if r == "src" and permuted:   # the kernel reads source rows in directory order
                if names[i] == "_tg_pos" and f.dtype == arrays["sorted_pos"].dtype:
                    f = arrays["sorted_pos"]
                else:
                    f = np.take(f, arrays["sorted_idx"], axis=0)
            arrays[f"field:{i}"] = f
        outs = [np.empty((graph.num_dst,) + tuple(s), _np_dtype(dt))
                for s, dt in zip(sig.out_shapes, sig.out_dtypes)]
        for k, o in enumerate(outs):
            arrays[f"out:{k}"] = o
        n = graph.num_dst
        cost = 8
        if self.spec.mode == "tiled":
            arrays.update(knn_tiled.scratch(n, self.spec))
            cost = max(cost, graph.num_src)     # every row scans every source
        argv = (ctypes.c_void_p * len(sig.slots))(*[_address(arrays[s]) for s in sig.slots])
        if n:
            s = self.schedule
            chunks = row_chunks(np.arange(n + 1, dtype=np.int64) * cost, s.threads,
                                s.row_partition, s.chunks_per_thread)
            launch(self.exe, self.launch, KernelArgs(argv, chunks, s.threads))
        if self.spec.kind == "radius" and self.spec.k:
            memo(graph)["truncated"] = int(stats[0])     # (explain's "last call")
        if self.spec.mode == "tiled" and not isinstance(graph, GeneratedType):
            knn_tiled.keep_csr(graph, arrays, self.spec)
        return outs

    def describe(self, ex, eqn, graph, where: str) -> None:
        p, spec = eqn.params, self.spec
        red = p["reducer"].pp_param()
        by = p["reduce_by"]
        ex.routes.append((self.schedule.target, f"{where}propagate[{red}] by {by}",
                          f"compiles (fused {spec.kind} traversal, no edge list)"))
        if spec.mode == "tiled":
            walk = knn_tiled.describe_walk(spec, self.tiles)
        elif spec.mode == "scan":
            walk = (f"tiled scan over all sources ({spec.dims}-D coordinates: above "
                    f"{geo.FAST_DIMS} dims the cell directory does not pay; exact, O(N*M))")
            if spec.kind == "knn":
                walk = ("knn-tiled-scan as a plain exact scan (squared norms near the "
                        "dtype's range would overflow the expanded-form filter): " + walk)
        elif spec.kind == "radius":
            walk = (f"cell-directory ({spec.dims}-D uniform cells >= cutoff wide, counting "
                    f"sort by cell; each row walks its 3^{spec.dims} neighbour cells and "
                    "applies the exact test distance <= cutoff)")
        else:
            walk = ("knn-shells (cell directory; each row keeps a sorted top-k state, ties "
                    "by smaller source index, and visits cells in growing shells until the "
                    "k-th distance bounds the next shell)")
        if self.swap:
            walk = ("the relation is symmetric (radius, query=None, no max_neighbors), so "
                    "source rows take the same fused walk with the roles swapped (no "
                    "transposed CSR): " + walk)
        fold = "folds accepted sources straight into the reducer state"
        if spec.k:
            fold = f"keeps the nearest {spec.k} in a bounded sorted state, then folds them"
        facts = f"{launch_facts(self.launch)}: " if self.launch is not None else ""
        ex.traversal.append(f"propagate[{red}] over {graph.kind} relation, grouped by {by}: "
                            f"{facts}{walk}; {fold}")
        vjp = _vjp_line(graph, spec)
        if vjp not in ex.traversal:
            ex.traversal.append(vjp)
        typed = isinstance(graph, GeneratedType)
        if spec.kind == "radius" and spec.k:
            t = None if typed else memo(graph).get("truncated", graph.params.get("_truncated"))
            ex.traversal.append(f"max_neighbors={spec.k}: " + (
                "not run yet" if t is None else f"{t} row(s) truncated in the last call"))
        order = ("rows in tiles of queries (each tile scans every source chunk, then folds "
                 "its rows)" if spec.mode == "tiled" else "rows visited in cell order")
        ex.schedule = (schedule_line(self.launch) if self.launch is not None else
                       "cpu-llvm fused generated-relation kernel (not lowered through the "
                       "Kernel IR)") + f"; {order}; reducer state in stack buffers"
        if typed:
            entry = (
                f"cell directory of the {graph.kind} relation generated in the program "
                "(sorted source ids and coordinates, cell starts, row order)", 0,
                "built per call from the traced coordinates; O(N), no edge list (size "
                "known at the call)")
            if entry not in ex.materialized:    # one directory per relation and call
                ex.materialized.append(entry)
        else:
            n, m = graph.num_dst, graph.num_src
            itemsize = graph.params["positions"].dtype.itemsize
            nbytes = 8 * (m + n) + m * spec.dims * itemsize
            if spec.mode == "tiled":
                nbytes = knn_tiled.panel_bytes(m, n, spec)
            if spec.mode == "cells":
                cells = directory_arrays(graph, spec, self.tiles)["geo_i"][1 + spec.dims]
                nbytes += 8 * (int(cells) + 1)
            what = ("cell directory (sorted source ids and coordinates, cell starts, row "
                    "order)", "rebuilt per call from the coordinates; O(N), no edge list")
            if spec.mode == "tiled":
                what = knn_tiled.MATERIALIZED
            ex.materialized.append((what[0], nbytes, what[1]))
        status = CACHE.status(self.key)
        ex.cache_lines.append({"memory": "hit (memory; executable rebound to this call's "
                                         "coordinates)",
                               "disk": "hit (disk cache, no LLVM run)",
                               "miss": "miss (compiled on the first call)"}[status])


def _vjp_line(graph, spec: GeoSpec) -> str:
    if symmetric(graph):
        return ("vjp over this relation: cotangent propagates grouped by destination and by "
                "source (source-field and coordinate cotangents) all take this fused walk "
                "(symmetric relation: roles swapped), no CSR; mean's degrees are counted by "
                "the same walk")
    why = ("knn is not symmetric" if spec.kind == "knn" else
           "max_neighbors truncation makes it asymmetric" if spec.k else
           "a query set makes it asymmetric")
    return ("vjp over this relation: destination-grouped cotangent propagates take this "
            "fused walk; source-grouped ones (source and coordinate cotangents) walk the CSR "
            f"transposed where needed ({why})")


def _count_edge(src, dst, edge):
    return tm.ones_like(edge.distance)


def count_signature(graph) -> tuple | None:
    """(coordinate dims, dtype) of a radius relation (a concrete one or a GeneratedType):
    what its degree count's kernel depends on; None for any other relation."""
    if getattr(graph, "kind", None) != "radius":
        return None
    pos = graph.params["positions"]
    return int(pos.shape[1]), np.dtype(pos.dtype).str


def count_eqn_of(dims: int, dtype: str):
    """The degree-count equation of radius relations of `dims` coordinates of `dtype`."""
    return _staged_count(int(dims), np.dtype(dtype).str)


# (dims, dtype) -> the degree-count equation: a memo of structure, so the equation's own
# weak cache (its kernels) serves every radius relation of those coordinates
@functools.cache
def _staged_count(dims: int, dtype: str):
    from ....core.graph import Graph
    from ....core.prims.graph import propagate_p
    from ....trace.staging import make_program

    prog = make_program(lambda p: propagate(Graph.radius(p, 1.0), _count_edge,
                                            sum_reducer()))(np.zeros((2, dims), dtype))
    return next(e for e in prog.eqns if e.primitive is propagate_p)


def fused_degrees(graph, by: str, launch) -> np.ndarray | None:
    """Degrees of a radius/knn relation without materialising it: every knn row has
    exactly k sources; a radius row's count is a fused sum of ones (out-degrees of a
    symmetric relation are the in-degrees). None where only the CSR knows them (out-degrees
    of an asymmetric relation; no count kernel was lowered). `launch`: the Kernel op of the
    count (count_eqn_of), lowered with the call; None: the CSR counts them."""
    if getattr(graph, "kind", None) not in GENERATED_KINDS or not CPU_LLVM_AVAILABLE:
        return None
    if by == "src" and not symmetric(graph):
        return None
    n = graph.num_dst if by == "dst" else graph.num_src
    if graph.kind == "knn":
        return np.full(n, int(graph.params["k"]), np.int64)
    # the relation's coordinates are frozen (like its directory): count once per relation;
    # a forward and its VJP (and every step on the same positions) ask for the same counts
    cached = memo(graph).get("degrees")
    if cached is not None:
        return cached.copy()
    if resolved(graph):   # symmetric when by='src': out-degrees are the in-degrees
        return np.diff(graph.resolve_csr()[0]).astype(np.int64)
    if launch is None:
        return None
    pos = graph.params["positions"]
    eqn = count_eqn_of(*count_signature(graph))
    plan = plan_generated(eqn, graph, True, launch)
    if not isinstance(plan, GeneratedPlan):
        return None
    counts = plan.run(eqn, graph, [pos, np.ascontiguousarray(graph.query_positions)])[0]
    degrees = np.rint(counts).astype(np.int64)
    memo(graph)["degrees"] = degrees
    return degrees.copy()


__all__ = ["plan_generated", "GeneratedPlan", "GeneratedType", "directory_arrays",
           "generated_relations", "symmetric", "fused_degrees", "count_eqn_of", "count_signature",
           "resolved"]
