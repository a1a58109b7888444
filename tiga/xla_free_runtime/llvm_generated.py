"""runtime: the cpu-llvm route of a propagate over a generated relation (radius, knn).

A planner in llvm_propagate.SPECIALISED_PLANNERS claims propagates grouped by destination
over a radius/knn relation without edge fields. Per call it builds the cell directory of the
source coordinates (O(N): sorted indices, sorted coordinates, cell starts, row visiting
order) and runs the fused kernel of lower/llvm/generated.py on row chunks: no edge list,
no distance array, no message array.

The compiled kernel depends only on the program's structure, field row shapes/dtypes and the
relation's static description (kind, traversal, dims, k, self-loop rule), never on the
number of points or the coordinates, so new coordinates of the same dims and dtype rebind
the cached executable (explain() reports the cache hit).

Anything else over a generated relation (grouped by source, as in the VJP's source
cotangents; edge fields; unsupported edge functions) resolves the relation to CSR and takes
the generic kernel, which explain() reports as the materialised CSR.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from ..core import graph_geometry as geo
from ..core.errors import CompilationError
from ..lower import CPU_LLVM_AVAILABLE
from .cache import CACHE, full_key
from .llvm_propagate import (
    SPECIALISED_PLANNERS,
    Fallback,
    _address,
    _check_field,
    _np_dtype,
)
from .threads import num_threads, row_chunks, run_chunks

if CPU_LLVM_AVAILABLE:
    from ..lower.llvm import CodegenUnsupported
    from ..lower.llvm.generated import (
        DIRECTORY_SLOTS,
        GeoSpec,
        codegen_directory,
        codegen_generated,
    )

GEOMETRIC = ("radius", "knn")
KNN_POINTS_PER_CELL = 0.25      # cells hold about k/4 points: shells 0-1 usually hold k
RADIUS_REACH = 1
KNN_ESTIMATE_FACTOR = 1.5       # prefilter radius: about 1.5 k sources at mean density
_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _spec(eqn, graph) -> GeoSpec | None:
    p = graph.params
    d = int(p["dims"])
    pos = p["positions"]
    same = p["query"] is None
    k = p["k"] if graph.kind == "knn" else (p["max_neighbors"] or 0)
    return GeoSpec(kind=graph.kind, mode="cells" if d <= geo.FAST_DIMS else "scan", dims=d,
                   k=int(k), exclude_self=bool(same and not p["loop"]),
                   pos_dtype=pos.dtype.name)


def _hidden(eqn) -> tuple | None:
    roles, names = eqn.params["roles"], eqn.params["names"]
    try:
        return (list(zip(roles, names)).index(("src", "_tg_pos")),
                list(zip(roles, names)).index(("dst", "_tg_qpos")))
    except ValueError:
        return None


def _key(eqn, spec: GeoSpec) -> str:
    per_eqn = _KEYS.get(eqn)
    if per_eqn is None:
        per_eqn = _KEYS.setdefault(eqn, {})
    key = per_eqn.get(spec)
    if key is None:
        p = eqn.params
        fields = tuple((tuple(a.type.shape) if r == "param" else tuple(a.type.shape[1:]),
                        a.type.dtype.name) for a, r in zip(eqn.inputs[1:], p["roles"]))
        update = p["update"].structure_key() if p["update"] is not None else None
        key = per_eqn[spec] = full_key((
            "generated-propagate", p["edge_fn"].structure_key(), repr(p["reducer"]._key()),
            p["roles"], update, fields, spec.descriptor()))
    return key


def plan_generated(eqn, graph, compile: bool):
    if getattr(graph, "kind", None) not in GEOMETRIC or not CPU_LLVM_AVAILABLE:
        return None
    p = eqn.params
    if p["reduce_by"] != "dst" or "edge" in p["roles"] or _hidden(eqn) is None:
        graph.resolve_csr()     # the generic kernel walks the materialised relation
        return None
    spec = _spec(eqn, graph)
    key = _key(eqn, spec)
    in_types = [a.type for a in eqn.inputs]

    def build(symbol):
        return codegen_generated(p, in_types, spec, symbol=symbol)

    try:
        if not compile:
            if CACHE.status(key) == "miss":
                build("probe")
            return GeneratedPlan(None, spec, key)
        return GeneratedPlan(CACHE.get(key, build), spec, key)
    except CodegenUnsupported:
        graph.resolve_csr()
        return None
    except CompilationError as exc:
        return Fallback(f"LLVM compilation of the generated-relation kernel failed ({exc}); "
                        "this is a Tiga bug, please report")


def directory_arrays(graph, spec: GeoSpec) -> dict:
    """The per-call walk arrays (cached on the relation: its coordinates are frozen)."""
    cached = graph.params.get("_directory")
    if cached is not None and cached[0] == spec:
        return cached[1]
    p = graph.params
    pos = p["positions"]
    q = graph.query_positions
    d, n = spec.dims, len(pos)
    cutoff = float(p.get("cutoff", 0.0))
    sq = geo.squared_cutoff(cutoff, pos.dtype) if spec.kind == "radius" else 0.0
    if spec.mode == "scan" or n == 0:
        width, reach, lo = 1.0, 1, np.zeros(d)
        dims = np.ones(d, np.int64)
        cells = {"cell_start": np.array([0, n], np.int64),
                 "sorted_idx": np.arange(n, dtype=np.int64), "sorted_pos": pos}
        row_order = np.arange(len(q), dtype=np.int64)
    else:
        lo = pos.min(axis=0).astype(np.float64)
        extents = pos.max(axis=0).astype(np.float64) - lo
        if spec.kind == "radius":
            width = _width(extents, n, cutoff / RADIUS_REACH, 0.5)
            reach = int(np.ceil(cutoff * geo.WIDTH_MARGIN / width))
        else:
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
    p["_directory"] = (spec, arrays)
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
    exe = CACHE.get(key, lambda symbol: codegen_directory(d, points.dtype.name, symbol=symbol))
    arrays = {"points": points, "geo_f": geo_f, "geo_i": geo_i,
              "cell_of": np.empty(n, np.int64), "cell_start": np.zeros(cells + 1, np.int64),
              "cursor": np.empty(cells, np.int64), "sorted_idx": np.empty(n, np.int64),
              "sorted_pos": np.empty_like(points)}
    argv = (ctypes.c_void_p * len(DIRECTORY_SLOTS))(*[_address(arrays[s])
                                                      for s in DIRECTORY_SLOTS])
    exe.native(n, 0, argv)
    return arrays


class GeneratedPlan:
    def __init__(self, exe, spec: GeoSpec, key: str):
        self.exe, self.spec, self.key = exe, spec, key

    def run(self, eqn, graph, values: list) -> list:
        sig = self.exe.signature
        arrays = dict(directory_arrays(graph, self.spec))
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
        argv = (ctypes.c_void_p * len(sig.slots))(*[_address(arrays[s]) for s in sig.slots])
        n = graph.num_dst
        if n:
            threads = num_threads()
            chunks = row_chunks(np.arange(n + 1, dtype=np.int64) * 8, threads)
            run_chunks(self.exe.native, chunks, argv, threads)
        if self.spec.kind == "radius" and self.spec.k:
            graph.params["_truncated"] = int(stats[0])
        return outs

    def describe(self, ex, eqn, graph, where: str) -> None:
        p, spec = eqn.params, self.spec
        red = p["reducer"].pp_param()
        ex.routes.append(("cpu-llvm", f"{where}propagate[{red}] by dst",
                          f"compiles (fused {spec.kind} traversal, no edge list)"))
        if spec.mode == "scan":
            walk = (f"tiled scan over all sources ({spec.dims}-D coordinates: above "
                    f"{geo.FAST_DIMS} dims the cell directory does not pay; exact, O(N*M))")
        elif spec.kind == "radius":
            walk = (f"cell-directory ({spec.dims}-D uniform cells >= cutoff wide, counting "
                    f"sort by cell; each row walks its 3^{spec.dims} neighbour cells and "
                    "applies the exact test distance <= cutoff)")
        else:
            walk = ("knn-shells (cell directory; each row keeps a sorted top-k state, ties "
                    "by smaller source index, and visits cells in growing shells until the "
                    "k-th distance bounds the next shell)")
        fold = "folds accepted sources straight into the reducer state"
        if spec.k:
            fold = f"keeps the nearest {spec.k} in a bounded sorted state, then folds them"
        ex.traversal.append(f"propagate[{red}] over {graph.kind} relation, grouped by dst: "
                            f"{walk}; {fold}")
        ex.traversal.append("vjp over this relation: destination-grouped cotangent "
                            "propagates take this fused walk; source-grouped ones (source "
                            "and coordinate cotangents) walk the materialised transposed CSR")
        if spec.kind == "radius" and spec.k:
            t = graph.params.get("_truncated")
            ex.traversal.append(f"max_neighbors={spec.k}: " + (
                "not run yet" if t is None else f"{t} row(s) truncated in the last call"))
        ex.schedule = ("cpu-llvm fused generated-relation kernel: rows visited in cell order, "
                       f"row chunks on {num_threads()} thread(s); reducer state in stack "
                       "buffers")
        n, m = graph.num_dst, graph.num_src
        itemsize = graph.params["positions"].dtype.itemsize
        nbytes = 8 * (m + n) + m * spec.dims * itemsize
        if spec.mode == "cells":
            nbytes += 8 * (int(np.prod(directory_arrays(graph, spec)["geo_i"][1:])) + 1)
        ex.materialized.append(("cell directory (sorted source ids and coordinates, cell "
                                "starts, row order)", nbytes,
                                "rebuilt per call from the coordinates; O(N), no edge list"))
        status = CACHE.status(self.key)
        ex.cache_lines.append({"memory": "hit (memory; executable rebound to this call's "
                                         "coordinates)",
                               "disk": "hit (disk cache, no LLVM run)",
                               "miss": "miss (compiled on the first call)"}[status])


SPECIALISED_PLANNERS.append(plan_generated)

__all__ = ["plan_generated", "GeneratedPlan", "directory_arrays"]
