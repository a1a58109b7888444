"""runtime: the tiled streaming route of dot-product attention (forward and fused VJP).

The cpu-llvm backend's planner (CpuLLVM.plan) claims

- the forward: an online_softmax propagate whose edge function is attention
  (`autodiff.rules.attention.match_attention`) over a dense, triangular or cu_seqlens
  relation;
- the canonical propagates of its VJP (row max, row mass, dq, (dk, dv), and (dk, dv, dq) from
  one walk), recognised by the structure of their edge programs.

Every relation it claims selects, for destination row i, the contiguous source range
[lo_i, hi_i), with lo and hi nondecreasing in i; that O(N) pair of arrays is all the walk
needs. The work runs in tiles: a block of destination rows against a block of source rows
for all heads at once, with running (max, mass, accumulator) per row and head; no N x N
score or probability array exists, only one tile. `lower.llvm.attention` generates the LLVM
micro-kernel of the float32 forward; `attention_tiles` holds the numpy/BLAS tiles for the rest
(float64, other head widths, pruning); threads take whole row blocks. The float32 backward
(dq, dk, dv in one pass per head) is `lower.llvm.attention_backward`.

A forward whose reducer is `online_softmax(stats)` also returns its per-row (max, mass), and
a `dkdvq` propagate returns dq with dk and dv: opt.attention_pairing writes the program that
way, so what one kernel hands the next is a program value, never state kept here.
"""
from __future__ import annotations

import numpy as np

from ....autodiff.rules.attention import STREAMING_KINDS
from ....core.blas_threads import thread_local_setter
from ....lower.attention_walk import claim_attention
from ....lower.llvm import attention as kernel
from ...caches.relations import memo
from ...calls.threads import num_threads, run_jobs
from ...reports.explain import launch_facts, schedule_line
from ...reports.runs import COUNTERS, NOT_RUN, measured, record
from . import attention_tiles as tiles
from .attention_native import (
    _FALLBACK,
    _bwd_fast_math_exact,
    _bwd_native_key,
    _native_backward,
    _native_forward,
    _native_key,
)
from .propagate import unbound

KINDS = STREAMING_KINDS


def row_ranges(graph) -> tuple:
    """(lo, hi) int64 arrays: destination row i reads sources lo[i] <= j < hi[i] (derived
    from the relation alone: kept in its weak cache)."""
    per_graph = memo(graph)
    found = per_graph.get("attention_row_ranges")
    if found is not None:
        return found
    graph.ensure_valid()
    n, p, i64 = graph.num_dst, graph.params, np.int64
    if graph.kind == "dense":
        lo, hi = np.zeros(n, i64), np.full(n, graph.num_src, i64)
    elif graph.kind == "triangular":
        lo, hi = np.zeros(n, i64), np.arange(1, n + 1, dtype=i64)
    else:
        cu = np.asarray(p["cu_seqlens"], dtype=i64)
        lens = np.diff(cu)
        lo = np.repeat(cu[:-1], lens)
        hi = np.arange(1, n + 1, dtype=i64) if p["causal"] else np.repeat(cu[1:], lens)
    per_graph["attention_row_ranges"] = found = (lo, hi)
    return found


def plan_attention(eqn, graph, compile: bool, held=None):
    """The tiled attention route (tried by CpuLLVM.plan), or None: not attention;
    `held`: the attention-tiles launch handed down for it (the call's bound Task module's),
    else an Unbound."""
    # the Iter stage's predicate (lower/attention_walk.py): what it claims lowers to an
    # attention-tiles launch, and that is what runs here
    found = claim_attention(getattr(graph, "kind", None), eqn.params,
                            [a.type for a in eqn.inputs[1:]])
    if found is None:
        return None
    if held is not None and held.coordinate_hierarchy == "attention-tiles":
        return AttentionPlan(*found, held)
    return unbound("attention-tiles")


def _heads(x: np.ndarray, heads: bool = True) -> np.ndarray:
    """A field (N, H, D) -> (H, N, D) view; a single-head field (N, D) -> (1, N, D)."""
    x = np.asarray(x)
    return x.transpose(1, 0, 2) if heads else x[None]


def _rows_heads(x: np.ndarray, heads: bool) -> np.ndarray:
    """A per-(row, head) array in (H, N) layout for both head conventions."""
    x = np.asarray(x)
    return x.T if heads else x[None]


class AttentionPlan:
    """One claimed propagate: the forward or one canonical VJP propagate."""

    def __init__(self, kind: str, pattern, launch):
        self.kind, self.pattern = kind, pattern
        self.launch = launch      # the scheduled attention-tiles launch (resolved at plan)

    # ---- run --------------------------------------------------------------------------
    def run(self, eqn, graph, values):
        lo, hi = row_ranges(graph)
        if self.kind == "forward":
            return self._forward(eqn, graph, values, lo, hi)
        if self.kind in ("rowmax", "mass"):
            # not paired with its forward (opt.attention_pairing): a walk of its own
            q, k, scale = values[:3]
            heads = np.asarray(q).ndim == 3
            top, mass = self._stats(eqn, graph, q, k, float(scale), heads, lo, hi)
            COUNTERS["stats_walks"] += 1
            out = top if self.kind == "rowmax" else mass
            return [np.asarray(out, dtype=eqn.outputs[0].type.dtype.np).copy()]
        q, k, v, scale, do, lse, delta = values
        heads = np.asarray(q).ndim == 3
        if self.kind == "dq":
            COUNTERS["dq_walks"] += 1
            dq = self._dq(eqn, graph, q, k, v, float(scale), do, lse, delta, heads, lo, hi)
            return [np.asarray(dq, eqn.outputs[0].type.dtype.np)]
        return self._dkdv(eqn, graph, values, heads, lo, hi)

    def _forward(self, eqn, graph, values, lo, hi):
        pat = self.pattern
        q, k, v = (np.asarray(values[i]) for i in (pat.q, pat.k, pat.v))
        scale = 1.0 if pat.scale is None else (
            pat.scale[1] if pat.scale[0] == "lit" else float(values[pat.scale[1]]))
        dtype = eqn.outputs[0].type.dtype.np
        n = graph.num_dst
        out = np.empty((n,) + v.shape[1:], dtype)
        nh = q.shape[1] if pat.heads else 1
        top = np.empty((nh, n), dtype)
        mass = np.empty((nh, n), dtype)
        prune = eqn.params["reducer"].prune_threshold
        h = pat.heads
        # the kernel takes the row max of the raw scores (scale > 0)
        # the kernel runs first and reports whether its fast-math result is exact; when it
        # may not be (a NaN, inf or overflow-prone operand), the NaN-safe tiles redo the call
        if (prune is None and n > 0 and _native_ok(q, k, v, dtype) and 0 < scale < np.inf and
                _native_forward(_heads(q, h), _heads(k, h), _heads(v, h), _heads(out, h), top,
                                mass, lo, hi, scale, self.launch, memo(graph))):
            COUNTERS["native_calls"] += 1
        else:
            skipped = tiles.forward(_heads(q, h), _heads(k, h), _heads(v, h), _heads(out, h),
                                    top, mass, lo, hi, scale, prune, _jobs)
            record("pruned_blocks", graph, (int(skipped[0]), int(skipped[1])))
        if len(eqn.outputs) == 1:
            return [out]
        # online_softmax(stats): the row statistics are outputs too, (N, H) or (N,) per row
        return [out] + [np.ascontiguousarray(x.T if pat.heads else x[0]) for x in (top, mass)]

    def _stats(self, eqn, graph, q, k, scale, heads, lo, hi):
        q, k = np.asarray(q), np.asarray(k)
        n = graph.num_dst
        nh = q.shape[1] if heads else 1
        dtype = q.dtype
        top = np.empty((nh, n), dtype)
        mass = np.empty((nh, n), dtype)
        kh = _heads(k, heads)
        # values are not needed for the statistics: a zero-width value array
        v0 = np.zeros((kh.shape[0], kh.shape[1], 0), dtype)
        o0 = np.zeros((nh, n, 0), dtype)
        tiles.forward(_heads(q, heads), kh, v0, o0, top, mass, lo, hi, scale, None, _jobs)
        return (top.T, mass.T) if heads else (top[0], mass[0])

    def _dq(self, eqn, graph, q, k, v, scale, do, lse, delta, heads, lo, hi):
        q = np.asarray(q)
        dq = np.empty(q.shape, eqn.outputs[0].type.dtype.np)
        ops = [np.asarray(x) for x in (q, k, v, do)]
        if _bwd_native_ok(*ops, dq.dtype) and _bwd_fast_math_exact(scale, *ops, lse, delta):
            # dq alone (no dk, dv wanted): the fused kernel skips its dk and dv products
            _native_backward(*(_heads(x, heads) for x in ops), _rows_heads(lse, heads),
                             _rows_heads(delta, heads), _heads(dq, heads), None, None,
                             lo, hi, scale, self.launch)
            return dq
        tiles.backward_dq(_heads(q, heads), _heads(k, heads), _heads(v, heads), _heads(do, heads),
                          _rows_heads(lse, heads), _rows_heads(delta, heads), _heads(dq, heads),
                          lo, hi, scale, _jobs)
        return dq

    def _dkdv(self, eqn, graph, values, heads, lo, hi):
        q, k, v, scale, do, lse, delta = (np.asarray(x) for x in values)
        dk = np.empty(k.shape, eqn.outputs[0].type.dtype.np)
        dv = np.empty(v.shape, eqn.outputs[1].type.dtype.np)
        # dkdvq: dq is the third output of the same pass (per-thread partial sums, added once)
        native = (_bwd_native_ok(q, k, v, do, dk.dtype) and dv.dtype == dk.dtype and
            _bwd_fast_math_exact(float(scale), q, k, v, do, lse, delta))
        # (the native kernel sets every entry of dq: no zeros to write first)
        dq = ((np.empty if native else np.zeros)(q.shape, eqn.outputs[2].type.dtype.np)
            if self.kind == "dkdvq" else None)
        if native:
            _native_backward(_heads(q, heads), _heads(k, heads), _heads(v, heads),
                             _heads(do, heads), _rows_heads(lse, heads),
                             _rows_heads(delta, heads), None if dq is None else
                             _heads(dq, heads), _heads(dk, heads), _heads(dv, heads),
                             lo, hi, float(scale), self.launch)
            return [dk, dv] if dq is None else [dk, dv, dq]
        tiles.backward_dkdv(_heads(q, heads), _heads(k, heads), _heads(v, heads),
                            _heads(do, heads), _rows_heads(lse, heads),
                            _rows_heads(delta, heads), _heads(dk, heads), _heads(dv, heads),
                            lo, hi, float(scale), _jobs,
                            dq=None if dq is None else _heads(dq, heads))
        return [dk, dv] if dq is None else [dk, dv, dq]

    # ---- explain ----------------------------------------------------------------------
    def describe(self, ex, eqn, graph, where):
        p = eqn.params
        what = {"forward": f"propagate[{p['reducer'].pp_param()}] by dst",
                "rowmax": "attention VJP row max", "mass": "attention VJP row mass",
                "dq": "attention VJP dq (by dst)", "dkdv": "attention VJP dk, dv (by src)",
                "dkdvq": "attention VJP dk, dv (by src) and dq (by dst) in one pass"}
        ex.routes.append(("cpu-tiled", f"{where}{what[self.kind]}",
                          "tiled streaming attention"))
        native = (self.kind == "forward" and p["reducer"].prune_threshold is None and
            _native_ok(*(_avals(eqn, i) for i in (self.pattern.q, self.pattern.k,
                                                 self.pattern.v)), _avals(eqn, None)) and
            not (self.pattern.scale is not None and self.pattern.scale[0] == "lit"
                 and not 0 < self.pattern.scale[1] < np.inf))   # (see _forward)
        # dq, (dk, dv) and dq alone: the LLVM backward kernel (skipping the products not wanted)
        bnative = self.kind in ("dq", "dkdv", "dkdvq") and _bwd_native_ok(
            *(_avals(eqn, i) for i in (0, 1, 2, 4)), _avals(eqn, None))
        op = self.launch      # the scheduled Kernel IR the kernels run by
        t = dict(op.schedule.tiles)
        ks = t.get("step_vectors", 0) * kernel.W
        if native:
            blocks = (f"per head, blocks of {t['group_rows'] * t['row_groups']} destination "
                      f"rows x {ks} source rows per step (K^T packed by the kernel into "
                      "contiguous per-step tiles)")
        elif bnative:
            blocks = (f"per head, {t['key_block']}-key blocks (K^T, V^T packed on the stack) "
                      f"x {t['tile_rows']} query rows")
        else:
            blocks = (f"blocks of {tiles.BLOCK_M} destination rows x {tiles.BLOCK_N} source "
                      "rows, all heads per tile")
        ex.traversal.append(
            f"{what[self.kind]} over {graph.kind} relation: {launch_facts(op)}: dot-product "
            "attention recognised; "
            f"{blocks}, running (max, mass, accumulator) per row and head; each row reads "
            "one contiguous source range (lo, hi), no N x N score or probability array")
        # every attention route takes any strides (torch's head-major views included): the
        # native kernels read through them, the numpy tiles copy one tile at a time
        ex.strided_reads.update(id(a) for a in eqn.inputs)
        if native:
            kt = eqn.inputs[1 + self.pattern.k].type
            heads = kt.shape[1] if len(kt.shape) == 3 else 1
            keys = -(-graph.num_src // ks) * ks
            ex.materialized.append((
                "K^T packed by the kernel into per-step tiles", 4 * heads * keys * kt.shape[-1],
                "scratch reused between calls; V is packed head-major too when its rows are "
                "head-interleaved"))
        detail = _bwd_schedule(t) + "; " + _FALLBACK if bnative else (
            f"tiled streaming attention: {num_threads()} thread(s) claim row-block jobs "
            "of equal (causal) work; " + (
                           f"LLVM micro-kernel (float32): {t.get('group_rows')} query rows x "
                           f"{ks} keys per register tile, <16 x float> accumulators, polynomial "
                           "exp, output normalised and written by the kernel; " + _FALLBACK
                           if native else
                           "each tile's two products are batched BLAS matrix products over "
                           "the heads (numpy), the softmax update vectorised numpy on the tile"))
        ex.schedule = f"{schedule_line(op)}; {detail}"
        nh = eqn.inputs[1].type.shape[1] if len(eqn.inputs[1].type.shape) == 3 else 1
        isz = eqn.inputs[1].type.dtype.np.itemsize
        ex.materialized.append(("per-row source ranges (lo, hi)", 16 * graph.num_dst,
                                "computed once per relation"))
        if self.kind == "forward":
            if len(eqn.outputs) == 3:
                ex.materialized.append(("per-row max and mass (log-sum-exp), outputs the VJP "
                                        "reads", 2 * isz * nh * graph.num_dst,
                                        "FlashAttention-2 style"))
            prune = p["reducer"].prune_threshold
            if prune is not None:
                last = measured("pruned_blocks", graph)
                ex.routes.append(("cpu-tiled", f"{where}prune_threshold={prune}",
                                  "APPROXIMATE result: key blocks whose scores fall more "
                                  f"than {prune} below the running max skip their value "
                                  "loads; " + (f"blocks skipped {NOT_RUN}" if last is None
                                               else f"last call skipped {last[0]} of "
                                               f"{last[1]} blocks")))
        width = eqn.inputs[1 + (self.pattern.q if native else 0)].type.shape[-1]   # queries
        ex.cache_lines.append(f"{what[self.kind]}: " + _cache_line(width, native, bnative, t))


def _cache_line(width: int, native: bool, bnative: bool, tiles: dict) -> str:
    """explain()'s cache status of the kernel an attention propagate compiles."""
    from ...caches.executables import CACHE
    if bnative:
        return (f"LLVM backward kernel (width {width}) " +
            CACHE.status(_bwd_native_key(width, tiles)))
    if native:
        return f"LLVM forward kernel (width {width}) {CACHE.status(_native_key(width, tiles))}"
    return "numpy tiles (nothing to compile)"


class _Aval:
    """Shape and dtype of an equation operand (what _native_ok reads), without its value."""

    def __init__(self, t):
        self.shape, self.dtype = tuple(t.shape), t.dtype.np


def _avals(eqn, i):
    if i is None:
        return eqn.outputs[0].type.dtype.np
    return _Aval(eqn.inputs[1 + i].type)


def _native_ok(q, k, v, dtype) -> bool:
    """The LLVM forward kernel: float32, head width a multiple of 16, values as wide."""
    from ....lower import CPU_LLVM_AVAILABLE
    return (CPU_LLVM_AVAILABLE and NATIVE_FORWARD and dtype == np.float32
            and q.dtype == k.dtype == v.dtype == np.float32 and q.shape[-1] % kernel.W == 0
            and v.shape[-1] == q.shape[-1] and q.shape[-1] <= 256)


NATIVE_FORWARD = True     # tests switch it off to compare with the numpy tiles


def _jobs(fn, jobs):
    local = thread_local_setter()

    def one(a, b, argv):
        if local is None:
            fn(a, b)
            return
        before = local(1)
        try:
            fn(a, b)
        finally:
            local(before)

    run_jobs(one, [(a, b, None) for a, b in jobs], num_threads())


# ---- native float32 backward (lower.llvm.attention_backward) ------------------------------
NATIVE_BACKWARD = True    # tests switch it off to compare with the numpy tiles


def _bwd_native_ok(q, k, v, do, dtype) -> bool:
    """The LLVM backward kernel: float32 throughout, head width a multiple of 16 (<= 256),
    values as wide as queries."""
    from ....lower import CPU_LLVM_AVAILABLE
    from ....lower.llvm import attention_backward as bwd
    return (CPU_LLVM_AVAILABLE and NATIVE_BACKWARD and dtype == np.float32
            and all(x.dtype == np.float32 for x in (q, k, v, do))
            and q.shape[-1] % bwd.W == 0 and q.shape[-1] <= 256
            and v.shape[-1] == q.shape[-1] == k.shape[-1] == do.shape[-1])


def _bwd_schedule(t: dict) -> str:
    kb = t["key_block"]
    return (f"attention backward: LLVM micro-kernel (float32), one job per head on "
            f"{num_threads()} thread(s) (a head's dq, dk, dv belong to one thread); per key "
            f"block of {kb} keys, the query rows that see it in tiles of {t['tile_rows']}: S "
            f"and P = exp(S * scale - lse) recomputed in registers ({t['group_rows']} rows x "
            f"{kb} keys "
            "of <16 x float>), dS = P (dP - delta); dq += dS K, dv += P^T dO, dk += dS^T Q "
            "as register-blocked FMA tiles, written in place through the operands' strides")
