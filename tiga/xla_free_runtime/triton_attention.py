"""runtime: launch the Triton attention kernels (lower/triton/attention.py) on torch tensors,
forward (O, lse) and backward (dQ, dK, dV, no atomics), over dense, triangular and
cu_seqlens relations. The walk is O(N) range bounds per query and per key (computed here
from the relation's parameters), never its CSR. Tensors are [N, D] (one head), D a power
of two >= 16; CPU tensors under the interpreter, CUDA tensors on the GPU.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np

from ..core.errors import UnsupportedError
from ..lower.backends import BACKENDS
from ..lower.triton.attention import attention_source
from . import triton_cache
from .triton_launch import _interpret, _triton_version, ensure_interpreter, tensors

_MODULES: dict = {}
BLOCK_M = BLOCK_N = 16


def row_ranges(graph) -> tuple:
    """(lo, hi, qlo, qhi) int64: query i reads keys [lo_i, hi_i); key j is read by queries
    [qlo_j, qhi_j)."""
    n, i64 = graph.num_dst, np.int64
    idx = np.arange(n, dtype=i64)
    if graph.num_src != n:
        raise UnsupportedError(f"graph: Triton attention needs num_src == num_dst, found "
                               f"{graph.num_src} and {n}")
    if graph.kind == "dense":
        zero, full = np.zeros(n, i64), np.full(n, n, i64)
        return zero, full, zero, full
    if graph.kind == "triangular":
        return np.zeros(n, i64), idx + 1, idx, np.full(n, n, i64)
    if graph.kind == "cu_seqlens":
        cu = np.asarray(graph.params["cu_seqlens"], i64)
        seq = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
        s0, s1 = cu[seq], cu[seq + 1]
        if graph.params["causal"]:
            return s0, idx + 1, idx, s1
        return s0, s1, s0, s1
    raise UnsupportedError(f"graph: Triton attention walks dense, triangular and cu_seqlens "
                           f"relations, found kind {graph.kind!r}")


def _kernels(backend: str):
    found = _MODULES.get(backend)
    if found is None:
        if BACKENDS[backend].interpreter:
            ensure_interpreter()
        text = attention_source()
        key = triton_cache.module_key(text, ("attention",), backend, _triton_version())
        if triton_cache.load(key) is None:
            triton_cache.store(key, text, "{}")
        name = f"tiga_triton_attention_{backend.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(name, triton_cache.path_of(key))
        module = importlib.util.module_from_spec(spec)
        with _interpret(backend):
            spec.loader.exec_module(module)
        sys.modules[name] = module
        found = _MODULES[backend] = module
    return found


def _setup(q, graph, backend):
    n, d = q.shape
    if d < 16 or d & (d - 1):
        raise UnsupportedError(f"q: head dimension must be a power of two >= 16, found {d}")
    device = "cpu" if BACKENDS[backend].interpreter else "cuda"
    buf = tensors()
    ranges = [buf.from_array(a, "int64", device) for a in row_ranges(graph)]
    return n, d, ranges, _kernels(backend)


def attention_forward(q, k, v, graph, scale: float, backend: str = "triton-interpreter"):
    """(O, lse) of softmax(scale * q k^T over the relation) v; empty rows give 0."""
    n, d, (lo, hi, _, _), mod = _setup(q, graph, backend)
    o = q.new_zeros((n, d))
    lse = q.new_zeros((n,)).float()
    with _interpret(backend):
        mod.attn_fwd[(-(-n // BLOCK_M),)](q, k, v, lo, hi, o, lse, n, float(scale), D=d,
                                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return o, lse


def attention_backward(q, k, v, o, lse, do, graph, scale: float,
                       backend: str = "triton-interpreter"):
    """(dQ, dK, dV) from the saved lse: dK/dV per key block, dQ per query block."""
    n, d, (lo, hi, qlo, qhi), mod = _setup(q, graph, backend)
    dq, dk, dv = (q.new_zeros((n, d)) for _ in range(3))
    with _interpret(backend):
        mod.attn_bwd_kv[(-(-n // BLOCK_N),)](q, k, v, o, do, lse, lo, hi, qlo, qhi, dk, dv, n,
                                            float(scale), D=d, BLOCK_M=BLOCK_M,
                                            BLOCK_N=BLOCK_N)
        mod.attn_bwd_q[(-(-n // BLOCK_M),)](q, k, v, o, do, lse, lo, hi, dq, n, float(scale),
                                           D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return dq, dk, dv
