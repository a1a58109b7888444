"""runtime: the tiled streaming route of dot-product attention (forward and fused VJP).

A planner in `launch.PLANNERS` claims

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

import threading
import weakref

import numpy as np

from ....autodiff.rules.attention import STREAMING_KINDS
from ....core.blas_threads import thread_local_setter
from ....core.errors import TigaError
from ....lower.attention_walk import claim_attention
from ....lower.llvm import attention as kernel
from ....lower.schedule import CHUNKS_PER_THREAD, attention_tiles
from ...explain import launch_facts, schedule_line
from ...run_report import NOT_RUN, measured, record
from ...threads import num_threads, run_jobs
from .. import KernelArgs
from .. import launch as launch_kernel
from . import attention_tiles as tiles

KINDS = STREAMING_KINDS
# per relation, its (lo, hi) row ranges: derived from the relation alone (a memo)
_RANGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# diagnostics: how often each route ran (process counters; a pruned call's block counts
# go to its run report, run_report.record)
STATS = {"native_calls": 0, "stats_walks": 0, "dq_walks": 0, "native_backward_calls": 0}


def row_ranges(graph) -> tuple:
    """(lo, hi) int64 arrays: destination row i reads sources lo[i] <= j < hi[i]."""
    found = _RANGES.get(graph)
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
    _RANGES[graph] = found = (lo, hi)
    return found


def plan_attention(eqn, graph, compile: bool, lower, held=None):
    """The tiled attention route (a backend_table.PLANNERS entry), or None: not attention;
    `held`: the launch the call's bound Task module holds for it (else asked of `lower`, the
    executor's Lowering: explain() before a call)."""
    # the Iter stage's predicate (lower/attention_walk.py): what it claims lowers to an
    # attention-tiles launch (attention_launch), and that is what runs here
    found = claim_attention(getattr(graph, "kind", None), eqn.params,
                            [a.type for a in eqn.inputs[1:]])
    if found is None:
        return None
    if held is not None and held.coordinate_hierarchy == "attention-tiles":
        return AttentionPlan(*found, held)
    return AttentionPlan(*found, attention_launch(eqn, lower))


# The scheduled `gf_kernel.launch` of each claimed equation (TIGA_DUMP writes it when it is
# lowered): a memo per equation over one per kernel structure and pool size. Lowering is
# the cold path only; what these hold is derived from types, never from a call's values.
_EQN_LAUNCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAUNCHES: dict = {}    # (types, threads) -> launch op: a memo derived from types


def attention_launch(eqn, lower):
    """The attention-tiles launch this equation runs by (lowered by `lower`, the executor's
    Lowering, when no equation of its structure has been at this pool size): its schedule's
    tiles are the kernels' tile sizes, and explain() prints its attributes."""
    threads = num_threads()
    per_eqn = _EQN_LAUNCH.get(eqn)
    found = per_eqn.get(threads) if per_eqn is not None else None
    if found is not None:
        return found
    p = eqn.params
    key = (p["edge_fn"].structure_key(), repr(p["reducer"]._key()), p["roles"], p["names"],
           p["reduce_by"], tuple(a.type for a in eqn.inputs),
           tuple(v.type for v in eqn.outputs), threads)
    found = _LAUNCHES.get(key)
    if found is None:
        found = lower.kernel(eqn, name=f"attention_{len(_LAUNCHES)}")
        if len(_LAUNCHES) >= 256:
            _LAUNCHES.pop(next(iter(_LAUNCHES)))
        _LAUNCHES[key] = found
    _EQN_LAUNCH.setdefault(eqn, {})[threads] = found
    return found


def _launch_tiles(launch, which: str) -> dict:
    """The `which` ("forward", "backward") kernel's tiles from the launch's schedule."""
    from ....lower.llvm import attention_backward as bwd
    tiles = dict(launch.schedule.tiles)
    want = kernel.TILES if which == "forward" else bwd.TILES
    if set(tiles) != set(want):
        raise TigaError(f"attention launch: schedule tiles {sorted(tiles)} are not the "
                        f"{which} kernel's ({', '.join(want)}); this is a Tiga bug")
    return tiles


def _tiles_or_default(tiles, which: str) -> dict:
    return dict(attention_tiles(which)) if tiles is None else tiles


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
            STATS["stats_walks"] += 1
            out = top if self.kind == "rowmax" else mass
            return [np.asarray(out, dtype=eqn.outputs[0].type.dtype.np).copy()]
        q, k, v, scale, do, lse, delta = values
        heads = np.asarray(q).ndim == 3
        if self.kind == "dq":
            STATS["dq_walks"] += 1
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
                                mass, lo, hi, scale, self.launch)):
            STATS["native_calls"] += 1
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
    from ...cache import CACHE
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

# The LLVM kernels' arithmetic (lazy row max, polynomial exp, nnan max, masked keys as
# p = 0 times their value row) is exact in its non-finite behaviour only when no score, sum
# or product can be NaN or overflow. Operands with a NaN or inf, or large enough that a score
# or a sum could overflow float32, run the numpy tiles, which select rather than multiply
# by 0 and give the reference interpreter's NaN and inf wherever it has them.
_FAST_LIMIT = 1e30        # float32 max is 3.4e38: room for the bounds' slack
_FALLBACK = ("a call whose operands hold a NaN or inf (or values large enough for a score "
             "to overflow float32) runs the NaN-safe numpy tiles instead (checked per call; "
             "forward: from sums of squares the kernel takes on its own reads)")


def _norm(x) -> float:
    """An upper bound of the Frobenius norm of x: NaN or inf when x holds a NaN or inf."""
    x = np.asarray(x)
    if x.size == 0:
        return 0.0
    if not x.flags.c_contiguous:
        # a transposed view of a dense array (heads-major q, k, v viewed as (N, H, D)):
        # its axes in memory order are C-contiguous, the same elements in one BLAS dot
        order = np.argsort([-abs(st) for st in x.strides], kind="stable")
        x = x.transpose(order)
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
        return float(np.sqrt(np.float64(np.dot(flat, flat))))
    big = float(np.maximum(x.max(), -x.min()))       # max and min propagate NaN
    return big * float(np.sqrt(x.size))


def _exact_bounds(scale: float, keys: int, nq: float, nk: float, nv: float) -> bool:
    """Whether the forward kernel's result is the reference's, from the Frobenius norms of
    q, k and v (the kernel sums their squares on its own reads: NaN or inf when an operand
    holds one): every operand finite and every score (|q_i . k_j| <= |Q| |K|) and value sum
    (<= keys e^LAZY |V|) far from overflow."""
    bound_v = nv * max(keys, 1) * float(np.exp(kernel.LAZY))
    return nq * nk * max(scale, 1.0) < _FAST_LIMIT and bound_v < _FAST_LIMIT


def _bwd_fast_math_exact(scale: float, q, k, v, do, lse, delta) -> bool:
    """As _exact_bounds, for the backward kernel: every operand finite and every score,
    dP - delta and cotangent sum (over at most N rows or keys) far from overflow."""
    nq, nk, nv, ndo, nl, nd = (_norm(x) for x in (q, k, v, do, lse, delta))
    rows = max(np.shape(q)[0], np.shape(k)[0], 1)
    ds = (ndo * nv + nd) * max(scale, 1.0)
    return (nq * nk * max(scale, 1.0) < _FAST_LIMIT and nl < _FAST_LIMIT
            and ds * max(nq, nk) * rows < _FAST_LIMIT and ndo * rows < _FAST_LIMIT)


def _native_key(width: int, tiles: dict | None = None) -> str:
    from ...cache import full_key
    tiles = _tiles_or_default(tiles, "forward")
    return full_key(("attention-forward-f32", width) + tuple(tiles[t] for t in kernel.TILES))


def _rendered(launch, width: int, key: str):
    """The compiled kernel of an attention launch for heads of `width` (rendered on a miss
    by the cpu-llvm backend from the launch's tiles)."""
    from ....lower.backends import BACKENDS
    from ....lower.llvm.render import CallData
    from ...cache import CACHE

    def build(symbol):
        source = BACKENDS["cpu-llvm"].render(launch, symbol, CallData(head_width=width))
        return source.text, source.signature

    exe = CACHE.get(key, build)
    if exe.kernel is None:
        exe.kernel = launch
    return exe


def _native_forward(q, k, v, out, top, mass, lo, hi, scale, launch) -> bool:
    """Run the LLVM kernel of the forward `launch` (its schedule's tiles: kernel.TILES): its
    phase 0 packs K^T (any K strides), phase 1 writes the normalised output (any strides)
    and the per-row top and mass. scale > 0. Returns whether that result is exact
    (_exact_bounds on the norms the kernel summed); when not, the caller recomputes."""
    import ctypes
    nh, n, width = q.shape
    s = k.shape[1]
    tiles = _launch_tiles(launch, "forward")
    exe = _rendered(launch, width, _native_key(width, tiles))
    threads = num_threads()
    rb, gb = tiles["group_rows"], tiles["row_groups"]
    ks = tiles["step_vectors"] * kernel.W
    rows = rb * gb
    npad = -(-max(n, 1) // rows) * rows
    kpad = -(-max(s, 1) // ks) * ks
    f32 = np.float32
    # q, K and the output go through their strides (q: a few scalars per row and trip). V is
    # read in place when each head's rows are contiguous (head-major storage); head-
    # interleaved (N, H, D) storage is packed: its rows lie H * D apart, and walking V rows
    # 4 KiB apart measured slower than the copy
    qp, kp = (x if _unit_stride(x) else np.ascontiguousarray(x, f32) for x in (q, k))
    vp = v if _in_place(v) else np.empty(v.shape, f32)
    op = out if _unit_stride(out) else np.empty(out.shape, f32)
    assert (top.shape == mass.shape == (nh, n) and top.flags.c_contiguous and
        mass.flags.c_contiguous and top.dtype == mass.dtype == f32)
    if vp is not v:
        def pack(h0, h1, _argv):
            # numpy copies release the GIL: heads pack on the pool
            vp[h0:h1] = v[h0:h1]

        run_jobs(pack, _head_jobs(nh), threads)
    scratch = _take_scratch((nh, kpad // ks, width, ks))
    (kt,) = scratch
    lop, hip, glo, ghi, blo, bhi = _group_ranges(lo, hi, n, npad, rb, gb, ks)
    qblocks = npad // rows
    scbits = int(np.array(scale, f32).view(np.uint32))
    prm = {"npad": npad, "kpad": kpad, "nks": kpad // ks, "qblocks": qblocks,
           "nq": n, "nk": s, "qhs": qp.strides[0] // 4, "qrs": qp.strides[1] // 4,
           "vhs": vp.strides[0] // 4, "vrs": vp.strides[1] // 4, "scbits": scbits,
           "khs": kp.strides[0] // 4, "krs": kp.strides[1] // 4,
           "ohs": op.strides[0] // 4, "ors": op.strides[1] // 4}
    prms = [np.array([prm.get(nm, phase) for nm in kernel.PRM], np.int64) for phase in (0, 1)]
    # (no keys: no row reads kt, and phase 0 would read key -1)
    jobs = nh * (kpad // kernel.W) if s else 0
    chk, chkq = np.zeros(2 * jobs, f32), np.zeros(nh * qblocks, f32)
    argvs = []
    for p in prms:
        arrays = [qp, kp, kt, vp, op, top, mass, lop, hip, p, glo, ghi, blo, bhi, chk, chkq]
        argvs.append((ctypes.c_void_p * len(arrays))(*[a.__array_interface__["data"][0]
                                                       for a in arrays]))
    step = max(1, -(-jobs // (4 * threads)))
    launch_kernel(exe, launch, KernelArgs(threads=threads, jobs=[
        (a, min(a + step, jobs), argvs[0]) for a in range(0, jobs, step)]))
    launch_kernel(exe, launch, KernelArgs(threads=threads, jobs=[
        (a, b, argvs[1]) for a, b in _cost_chunks(blo, bhi, nh, threads, ks)]))
    if op is not out:
        out[...] = op
    _give_scratch(scratch)
    nq, nk, nv = (float(np.sqrt(np.sum(x, dtype=np.float64)))
                  for x in (chkq, chk[0::2], chk[1::2]))
    return _exact_bounds(scale, s, nq, nk, nv)


def _cost_chunks(blo, bhi, nh: int, threads: int, ks: int) -> list:
    """Contiguous ranges of (head, row block) jobs of about equal work (a block's keys, plus
    a fixed share): threads pull them in turn, so the last one bounds the idle tail (under
    causal masking, equal job counts are unequal work)."""
    cost = np.tile(np.maximum(bhi - blo, 0) + ks, nh)
    cum = np.cumsum(cost)
    parts = min(len(cost), CHUNKS_PER_THREAD * threads)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, side="left") + 1
    bounds = [0] + sorted(set(int(c) for c in cuts if 0 < c < len(cost))) + [len(cost)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


# (id(lo), id(hi), n, npad, tiles) -> (weakrefs to lo and hi, arrays)
_GROUPS: dict = {}      # row-group tables of a relation's ranges (memo; weakly checked)


def _group_ranges(lo, hi, n, npad, rb: int, gb: int, ks: int):
    """Padded per-row ranges, per group of rb rows ks-aligned key ranges (glo, ghi) and per
    row block (gb groups) key ranges (blo, bhi); kept per relation (row_ranges returns the
    same arrays)."""
    key = (id(lo), id(hi), n, npad, rb, gb, ks)
    found = _GROUPS.get(key)
    if found is not None and found[0]() is lo and found[1]() is hi:
        return found[2]
    lop = np.zeros(npad, np.int64)
    hip = np.zeros(npad, np.int64)
    lop[:n], hip[:n] = lo, hi
    empty = hip <= lop
    glo = np.where(empty, np.iinfo(np.int64).max, lop).reshape(-1, rb).min(1)
    ghi = np.where(empty, 0, hip).reshape(-1, rb).max(1)
    glo = np.where(ghi > 0, glo, 0) // ks * ks
    blo = glo.reshape(-1, gb).min(1)
    bhi = ghi.reshape(-1, gb).max(1)
    arrays = (lop, hip, glo, ghi, blo, bhi)
    try:
        refs = (weakref.ref(lo), weakref.ref(hi))
    except TypeError:
        return arrays
    with _SCRATCH_LOCK:
        if len(_GROUPS) >= 8:
            _GROUPS.pop(next(iter(_GROUPS)))
        _GROUPS[key] = refs + (arrays,)
    return arrays


# Work arrays (packed K^T) are kept between calls: fresh multi-MiB allocations come back
# from the OS as untouched pages, and their first-touch faults (thousands per call)
# measured doubling the kernel's time at N = 1024.
_SCRATCH: dict = {}     # reusable scratch buffers (a pool; contents never read across calls)
_SCRATCH_LOCK = threading.Lock()


def _take_scratch(*shapes) -> list:
    with _SCRATCH_LOCK:
        free = _SCRATCH.get(shapes)
        if free:
            return free.pop()
    return [np.empty(sh, np.float32) for sh in shapes]


def _give_scratch(arrays) -> None:
    key = tuple(a.shape for a in arrays)
    with _SCRATCH_LOCK:
        if key not in _SCRATCH and len(_SCRATCH) >= 4:
            _SCRATCH.pop(next(iter(_SCRATCH)))      # keep the most recent few shapes
        _SCRATCH.setdefault(key, [])
        if len(_SCRATCH[key]) < 2:
            _SCRATCH[key].append(arrays)


def _in_place(x: np.ndarray) -> bool:
    """Whether the kernel reads x (H, N, D) in place: float32, each head's rows contiguous,
    a nonnegative head stride of whole elements."""
    st = x.strides
    return (x.dtype == np.float32 and st[2] == 4 and st[1] == 4 * x.shape[2] and
        st[0] >= 0 and st[0] % 4 == 0)


def _unit_stride(x: np.ndarray) -> bool:
    """Whether the kernel addresses x (H, N, D) float32 through its head and row strides."""
    st = x.strides
    return x.dtype == np.float32 and st[2] == 4 and all(a >= 0 and a % 4 == 0 for a in st[:2])


def _head_jobs(nh: int) -> list:
    parts = min(nh, 2 * num_threads())
    cuts = [nh * i // parts for i in range(parts + 1)]
    return [(a, b, None) for a, b in zip(cuts, cuts[1:]) if b > a]


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


def _bwd_native_key(width: int, tiles: dict | None = None) -> str:
    from ....lower.llvm import attention_backward as bwd
    from ...cache import full_key
    tiles = _tiles_or_default(tiles, "backward")
    return full_key(("attention-backward-f32", width) + tuple(tiles[t] for t in bwd.TILES))


def _strided_ok(x: np.ndarray) -> bool:
    """Whether the backward kernel reads or writes x in place: float32, unit last stride, the
    other strides nonnegative whole elements."""
    st = x.strides
    return (x.dtype == np.float32 and (x.ndim < 3 or st[-1] == 4) and
        all(s >= 0 and s % 4 == 0 for s in st))


# The backward's work arrays (packed q and dO, dq sums) are kept between calls: fresh
# multi-MiB allocations come back from the OS untouched, and their first-touch page faults
# measured a fifth of the backward at N = 1024 (as for the forward's scratch).
_BWD_LOCAL = threading.local()


def _bwd_scratch(role, shape) -> np.ndarray:
    """A float32 work array of `shape` for this thread (the latest shape per role)."""
    have = getattr(_BWD_LOCAL, "arrays", None)
    if have is None:
        have = _BWD_LOCAL.arrays = {}
    found = have.get(role)
    if found is None or found.shape != tuple(shape):
        found = have[role] = np.empty(shape, np.float32)
    return found


def _native_backward(q, k, v, do, lse, delta, dq, dk, dv, lo, hi, scale, launch) -> None:
    """dq, dk, dv ((H, N, D) views, any None when not wanted) from the `launch`'s kernel.

    q, k, v, do: (H, N, D) float32 views; lse, delta: (H, N). A job is a head, or with few
    heads a part of a head's key blocks; the kernel reads and writes every operand through
    its strides, so nothing is packed or copied here."""
    import ctypes

    from ....lower.llvm import attention_backward as bwd
    (nh, n, width), nk = q.shape, k.shape[1]
    f32, i64 = np.float32, np.int64
    tiles = _launch_tiles(launch, "backward")
    kb = tiles["key_block"]
    exe = _rendered(launch, width, _bwd_native_key(width, tiles))
    ins = [x if _strided_ok(x) else np.ascontiguousarray(x, f32)
           for x in (q, k, v, do, lse, delta)]
    # q and dO rows are read once per key block that sees them: rows lying H * D apart
    # (a (N, H, D) field) measured ~10% slower than a head-major copy (TLB and L1 sets)
    spread = [i for i in (0, 3) if ins[i].strides[1] != 4 * width and n > kb]
    heads = _head_jobs(nh)
    if spread:
        packed = {i: _bwd_scratch(("pack", i), (nh, n, width)) for i in spread}

        def pack(h0, h1, _argv):
            for i in spread:
                packed[i][h0:h1] = ins[i][h0:h1]

        run_jobs(pack, heads, num_threads())
        for i in spread:
            ins[i] = packed[i]
    kblocks = -(-nk // kb) if n else 0
    j0 = np.arange(kblocks, dtype=i64) * kb
    # the rows that see key block [j0, j0 + kb): hi > j0 and lo < j0 + kb (lo, hi nondecreasing)
    rbeg = np.searchsorted(np.asarray(hi, i64), j0, side="right").astype(i64)
    rend = np.searchsorted(np.asarray(lo, i64), j0 + kb, side="left").astype(i64)
    threads = num_threads()
    # fewer heads than a few per thread: each head's key blocks are split in parts of equal
    # work (rows seen), each part adding into its own dq partial sum, summed afterwards
    splits = 1 if nh >= 4 * threads else max(1, min(kblocks, -(-4 * threads // nh)))

    # dq is added into once per key block: rows H * D apart alias in the store buffer (4 KiB
    # apart), so a head-major buffer takes the sums and is copied out; the kernel writes each
    # dk, dv row once, from a stack accumulator
    if splits == 1 and dq is not None and _strided_ok(dq) and dq.strides[1] == 4 * width:
        dq[...] = 0
        dqb = dq
    else:
        dqb = _bwd_scratch(("dq",), (splits, nh, n, width))
        if dq is not None:
            dqb.fill(0)
        dqb = dqb[0]                                          # .base: every part
    outs = [dqb] + [x if x is not None and _strided_ok(x) else np.empty((nh, nk, width), f32)
                    for x in (dk, dv)]
    work = np.maximum(rend - rbeg, 0) + 1
    cuts = np.searchsorted(np.cumsum(work), np.arange(1, splits) * work.sum() / splits,
                           side="right") if splits > 1 else np.zeros(0, i64)
    bounds = [0] + [int(c) for c in cuts] + [kblocks]
    parts = [(s, bounds[s], max(bounds[s], bounds[s + 1])) for s in range(splits)]
    parts.sort(key=lambda p: -int(work[p[1]:p[2]].sum()))    # the heaviest first
    dq_split = outs[0].base.strides[0] // 4 if splits > 1 else 0
    jobs = np.array([(h, a, b, s * dq_split) for s, a, b in parts for h in range(nh)], i64)
    lo, hi = (np.ascontiguousarray(x, i64) for x in (lo, hi))
    scbits = int(np.array(scale, f32).view(np.uint32))
    st = [s // 4 for x in ins[:4] for s in x.strides[:2]]
    st2 = [s // 4 for x in ins[4:] + outs for s in x.strides[:2]]
    wanted = (dq is not None) + 2 * (dk is not None or dv is not None)
    prm = np.array([n, nk, kblocks] + st + [scbits] + st2 + [wanted], i64)
    assert len(prm) == len(bwd.PARAMS)
    arrays = ins + outs + [lo, hi, prm, rbeg, rend, jobs]
    argv = (ctypes.c_void_p * len(arrays))(*[a.__array_interface__["data"][0]
                                              for a in arrays])
    if kblocks:
        launch_kernel(exe, launch, KernelArgs(threads=threads, jobs=[
            (j, j + 1, argv) for j in range(len(jobs))]))
    else:       # no query rows or no keys: the kernel, which writes dk and dv, does not run
        outs[1][...] = 0
        outs[2][...] = 0
    STATS["native_backward_calls"] += 1
    if splits > 1 and dq is not None:
        outs[0] = outs[0].base.sum(axis=0)
    copies = [(want, got) for want, got in zip((dq, dk, dv), outs)
              if want is not None and want is not got]
    if copies:
        def copy(h0, h1, _argv):
            for want, got in copies:
                want[h0:h1] = got[h0:h1]

        run_jobs(copy, heads, num_threads())
