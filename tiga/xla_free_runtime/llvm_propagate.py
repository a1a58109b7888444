"""runtime: the cpu-llvm route of one `propagate` equation: plan, compile (cached), run.

`plan_propagate` decides the route of an equation for a concrete relation: a compiled
Executable, or a Fallback carrying the reason the reference interpreter runs it instead.
`run_propagate` binds the relation's CSR (or its cached transpose for reduce_by='src'), the
field arrays and fresh outputs to the kernel's pointer slots and runs row chunks on the
thread pool.
"""
from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..core.dtypes import as_dtype
from ..core.errors import CompilationError, ShapeError, UnsupportedError
from ..lower import CPU_LLVM_AVAILABLE
from .cache import CACHE, Executable, full_key
from .threads import num_threads, row_chunks, run_chunks

if CPU_LLVM_AVAILABLE:
    from ..lower.llvm import CodegenUnsupported, KernelSchedule, codegen_propagate


@dataclass(frozen=True)
class Fallback:
    """The reference interpreter runs this propagate; `reason` is what explain() says."""

    reason: str


_UNSUPPORTED: dict[str, str] = {}       # key -> reason (deterministic, so memoised)
_UNSUPPORTED_LOCK = threading.Lock()
_CHUNKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHUNK_LOCK = threading.Lock()


def _walk(params) -> str:
    return "src" if params["reduce_by"] == "src" else "dst"


def _structure(eqn, graph) -> tuple:
    """Everything the generated code depends on (never object identity or array values)."""
    p = eqn.params
    fields = tuple((tuple(a.type.shape) if r == "param" else tuple(a.type.shape[1:]),
                    a.type.dtype.name) for a, r in zip(eqn.inputs[1:], p["roles"]))
    has_perm = graph.edge_perm is not None if _walk(p) == "dst" else True
    update = p["update"].structure_key() if p["update"] is not None else None
    return ("propagate", p["edge_fn"].structure_key(), repr(p["reducer"]._key()), p["roles"],
            p["reduce_by"], update, fields, graph.index_dtype.name, has_perm)


def plan_propagate(eqn, graph, *, compile: bool = True):
    """Executable (compile=True) or key (compile=False) for cpu-llvm, else a Fallback."""
    if not CPU_LLVM_AVAILABLE:
        return Fallback("llvmlite is not installed, so the cpu-llvm backend is unavailable")
    if graph is None:
        return Fallback("the relation is not known until the call (explain it with "
                        "concrete arguments to see the compiled route)")
    key = full_key(_structure(eqn, graph))
    reason = _UNSUPPORTED.get(key)
    if reason is not None:
        return Fallback(reason)
    has_perm = graph.edge_perm is not None
    in_types = [a.type for a in eqn.inputs]

    def build(symbol):
        return codegen_propagate(eqn.params, in_types, graph.index_dtype,
                                 KernelSchedule(has_edge_perm=has_perm), symbol=symbol)

    try:
        if not compile:
            if CACHE.status(key) == "miss":
                build("probe")  # raises when unsupported; compiling waits for the call
            return key
        return CACHE.get(key, build)
    except CodegenUnsupported as exc:
        with _UNSUPPORTED_LOCK:
            _UNSUPPORTED[key] = str(exc)
        return Fallback(str(exc))
    except CompilationError as exc:
        return Fallback(f"LLVM compilation failed ({exc}); this is a Tiga bug, please report")


def walked_csr(graph, walk: str) -> tuple:
    """(row_ptr, col_idx, edge_perm or None) of the CSR the kernel walks."""
    graph.ensure_valid()
    if walk == "src":
        graph_t, perm = graph.transpose()   # built once per relation and cached on it
        rp, ci = graph_t.resolve_csr()
    else:
        (rp, ci), perm = graph.resolve_csr(), graph.edge_perm
    perm = None if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
    return (np.ascontiguousarray(rp, dtype=np.int64),
            np.ascontiguousarray(ci, dtype=graph.index_dtype.np), perm)


def _chunks(graph, walk: str, row_ptr, threads: int) -> list:
    with _CHUNK_LOCK:
        per_graph = _CHUNKS.setdefault(graph, {})
        key = (walk, threads, len(row_ptr))
        if key not in per_graph:
            per_graph[key] = row_chunks(row_ptr, threads)
        return per_graph[key]


def _check_field(x, i: int, sig, lead, name: str) -> np.ndarray:
    dtype = as_dtype(sig.field_dtypes[i]).np
    arr = np.asarray(x, dtype=dtype)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        arr = np.ascontiguousarray(arr)
    want = tuple(sig.field_shapes[i]) if lead is None else (lead,) + tuple(sig.field_shapes[i])
    if arr.shape != want:
        raise ShapeError(f"{sig.roles[i]}.{name}: expected shape {want} for the compiled "
                         f"propagate, found {arr.shape}")
    return arr


def run_propagate(exe: Executable, eqn, graph, values: list) -> list:
    """Run a compiled propagate on concrete field values; returns the output arrays."""
    sig = exe.signature
    rp, ci, perm = walked_csr(graph, sig.walk)
    sizes = {"src": graph.num_src, "dst": graph.num_dst, "edge": graph.num_edges,
             "param": None}
    names = eqn.params["names"]
    fields = [_check_field(x, i, sig, sizes[r], names[i])
              for i, (x, r) in enumerate(zip(values, sig.roles))]
    lead = {"dst": (graph.num_dst,), "src": (graph.num_src,), "edge": (graph.num_edges,),
            "all": ()}[sig.reduce_by]
    outs = [np.empty(lead + tuple(s), as_dtype(d).np)
            for s, d in zip(sig.out_shapes, sig.out_dtypes)]
    arrays = {"row_ptr": rp, "col_idx": ci, "edge_perm": perm}
    for i, f in enumerate(fields):
        arrays[f"field:{i}"] = f
    for k, o in enumerate(outs):
        arrays[f"out:{k}"] = o
    for slot in sig.slots:
        if arrays[slot] is None:
            raise UnsupportedError(f"compiled propagate needs {slot} but the relation has none")
    argv = (ctypes.c_void_p * len(sig.slots))(*[arrays[s].ctypes.data for s in sig.slots])
    rows = len(rp) - 1
    if not sig.parallel:
        exe.native(0, rows, argv)
        return outs
    threads = num_threads()
    run_chunks(exe.native, _chunks(graph, sig.walk, rp, threads), argv, threads)
    return outs
