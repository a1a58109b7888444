"""runtime: the Triton attention kernels (lower/triton/attention.py) on torch tensors, and the
program route that runs them under the triton / triton-interpreter backends.

`attention_plan` claims what the LLVM route's planner (attention.py) claims: the
online_softmax attention forward (plain, or `online_softmax(stats)` returning the per-row
max and mass; opt.attention_pairing) and the canonical VJP propagates dq, (dk, dv) and the
fused (dk, dv, dq), over dense (also non-square), triangular and cu_seqlens relations,
float32 or float64, one head (N, D) or several (N, H, D) on grid axis 1, any head width
(padded to a power of two >= 16 inside the kernel, masked). The row max / mass / dscale
propagates, when not paired, take the generic Triton kernel.

The walk is O(N) range bounds per query and per key (computed here from the relation's
parameters), never its CSR. CPU tensors under the interpreter, CUDA tensors on the GPU.
"""
from __future__ import annotations

import os

import numpy as np

from ....autodiff.rules.attention import (
    CANONICAL,
    STREAMING_KINDS,
    canonical_program,
    kind_of,
    match_attention,
    register_half_vjp,
)
from ....core.errors import UnsupportedError
from ....core.eval import on_device
from ....core.prims.graph import row_type
from ....lower.backends import BACKENDS, selected_backend, targets_triton
from ....lower.schedule import triton_attention_blocks, triton_dot_precision
from ....lower.triton.attention import attention_source
from ....lower.triton.emitter import pow2
from .compile import fixed_held, launch_fixed, launch_result, tensors

CLAIMED = ("dq", "dkdv", "dkdvq")      # canonical VJP propagates run by the attention kernels
FLOATS = ("float16", "bfloat16", "float32", "float64")
HALF = ("float16", "bfloat16")


# a float16 / bfloat16 attention traced for the Triton backends differentiates into the
# canonical VJP propagates these kernels run (CLAIMED), as float32 does everywhere
def _triton_selected() -> bool:
    try:
        return targets_triton(selected_backend())
    except UnsupportedError:     # a bad backend name: the call itself reports it
        return False


register_half_vjp(_triton_selected)


def tf32_allowed() -> bool:
    """TIGA_TF32=1: float32 tile products on the Triton route may round their operands to
    TF32 (tensor cores); unset, they are exact float32 (read per launch)."""
    return os.environ.get("TIGA_TF32", "").strip().lower() in ("1", "true", "yes", "on")


def operand_types(dtypes: set, interpreter: bool) -> tuple:
    """(compute type, tile operand type) names of fields of `dtypes`: float16 or bfloat16
    fields (all of one of them) multiply as themselves on tensor cores and accumulate in
    float32; float64 anywhere computes in float64; else float32. (Triton's interpreter
    multiplies bfloat16 tiles as their raw 16-bit patterns: there they multiply in float32.)"""
    ct = "float64" if "float64" in dtypes else "float32"
    it = next(iter(dtypes)) if len(dtypes) == 1 and next(iter(dtypes)) in HALF else ct
    return ct, ct if interpreter and it == "bfloat16" else it


def row_ranges(graph) -> tuple:
    """(lo, hi, qlo, qhi) int64: query i reads keys [lo_i, hi_i); key j is read by queries
    [qlo_j, qhi_j)."""
    nq, nk, i64 = graph.num_dst, graph.num_src, np.int64
    idx = np.arange(nq, dtype=i64)
    if graph.kind == "dense":
        return np.zeros(nq, i64), np.full(nq, nk, i64), np.zeros(nk, i64), np.full(nk, nq, i64)
    if graph.kind == "triangular":
        return np.zeros(nq, i64), idx + 1, idx, np.full(nq, nq, i64)
    if graph.kind == "cu_seqlens":
        cu = np.asarray(graph.params["cu_seqlens"], i64)
        seq = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
        s0, s1 = cu[seq], cu[seq + 1]
        if graph.params["causal"]:
            return s0, idx + 1, idx, s1
        return s0, s1, s0, s1
    raise UnsupportedError(f"graph: Triton attention walks dense, triangular and cu_seqlens "
                           f"relations, found kind {graph.kind!r}")


class _Launch:
    """What every attention launch shares: sizes, constexprs, ranges, kernels, buffers."""

    def __init__(self, q, k, v, graph, scale, backend: str):
        import triton.language as tl

        self.backend, self.buf = backend, tensors()
        self.device = "cpu" if BACKENDS[backend].interpreter else "cuda"
        self.ct, it = operand_types({_dtype_name(x) for x in (q, k, v)},
                                     BACKENDS[backend].interpreter)
        self.nq, self.nk = graph.num_dst, graph.num_src
        self.heads = q.ndim == 3
        self.h = q.shape[1] if self.heads else 1
        self.d, self.dv = q.shape[-1], v.shape[-1]
        bd, bdv = max(16, pow2(self.d)), max(16, pow2(self.dv))
        bm, bn, warps, stages = triton_attention_blocks(
            2 if it in HALF else np.dtype(it).itemsize, max(bd, bdv),
            BACKENDS[backend].interpreter)
        self.blocks = {"forward": (bm, bn), "backward": (min(bm, 64), bn)}
        self.launch = dict(num_warps=warps, num_stages=stages)
        self.const = dict(D=self.d, DV=self.dv, BD=bd, BDV=bdv, CT=getattr(tl, self.ct),
                          IT=getattr(tl, it), PREC=triton_dot_precision(it, tf32_allowed()))
        self.scale = self.buf.from_array(np.array([scale], self.ct), self.ct, self.device)
        self.ranges = [self.buf.from_array(a, "int64", self.device) for a in row_ranges(graph)]

    def run(self, kernel: str, rows: int, block: str, argv: tuple, kw: dict) -> None:
        """One attention kernel over `rows` in blocks of kw[`block`], per head, through the
        backend table."""
        launch_fixed(attention_source(), "attention", self.backend, kernel,
                     self.grid(rows, kw[block]), argv, kw)

    def t(self, x, dtype: str | None = None):
        """A field as a contiguous tensor on the launch device (in its own dtype)."""
        return self.buf.from_array(x, dtype or _dtype_name(x), self.device)

    def zeros(self, rows: int, width: int | None, dtype: str):
        shape = (rows,) + ((self.h,) if self.heads else ()) + ((width,) if width else ())
        return self.buf.zeros(shape, dtype, self.device)

    def grid(self, rows: int, block: int) -> tuple:
        return (-(-rows // block), self.h)

    def kw(self, kernel: str) -> dict:
        """The constexprs and launch options of the forward or backward kernels."""
        bm, bn = self.blocks[kernel]
        return dict(self.const, BLOCK_M=bm, BLOCK_N=bn, **self.launch)

    def forward(self, q, k, v, out_dtype: str):
        o = self.zeros(self.nq, self.dv, out_dtype)
        top, mass = self.zeros(self.nq, None, self.ct), self.zeros(self.nq, None, self.ct)
        lo, hi = self.ranges[:2]
        if self.nq and self.nk:
            self.run("attn_fwd", self.nq, "BLOCK_M", (q, k, v, self.scale, lo, hi, o, top,
                                                      mass, self.nq, self.nk, self.h),
                     self.kw("forward"))
        return o, top, mass

    def backward(self, q, k, v, do, lse, delta, want_kv: bool, want_q: bool, dtypes):
        lo, hi, qlo, qhi = self.ranges
        dk = self.zeros(self.nk, self.d, dtypes[0]) if want_kv else None
        dv = self.zeros(self.nk, self.dv, dtypes[1]) if want_kv else None
        dq = self.zeros(self.nq, self.d, dtypes[2]) if want_q else None
        if not (self.nq and self.nk):
            return dk, dv, dq
        args, kw = (self.nq, self.nk, self.h), self.kw("backward")
        if want_kv:
            self.run("attn_bwd_kv", self.nk, "BLOCK_N", (q, k, v, do, lse, delta, self.scale,
                                                          lo, hi, qlo, qhi, dk, dv, *args), kw)
        if want_q:
            self.run("attn_bwd_q", self.nq, "BLOCK_M", (q, k, v, do, lse, delta, self.scale,
                                                         lo, hi, dq, *args), kw)
        return dk, dv, dq


def _shaped(x):
    """A field as _Launch reads it (shape and dtype): a device tensor as it is, else numpy."""
    return x if on_device(x) else np.asarray(x)


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


# ---- standalone (torch tensors in, torch tensors out) -------------------------------------

def attention_forward(q, k, v, graph, scale: float, backend: str = "triton-interpreter"):
    """(O, lse) of softmax(scale * q k^T over the relation) v; empty rows give 0."""
    run = _Launch(q, k, v, graph, scale, backend)
    o, top, mass = run.forward(q.contiguous(), k.contiguous(), v.contiguous(), _dtype_name(q))
    return o, top + mass.where(mass > 0, mass.new_ones(())).log()


def attention_backward(q, k, v, o, lse, do, graph, scale: float,
                       backend: str = "triton-interpreter"):
    """(dQ, dK, dV) from the saved lse: dK/dV per key block, dQ per query block."""
    run = _Launch(q, k, v, graph, scale, backend)
    delta = (do * o).sum(dim=-1).to(lse.dtype)
    dk, dv, dq = run.backward(*(x.contiguous() for x in (q, k, v, do, lse, delta)), True, True,
                              [_dtype_name(q)] * 3)
    return dq, dk, dv


# ---- the program route -------------------------------------------------------------------

def attention_plan(eqn, graph, backend: str):
    """A TritonAttentionPlan when this propagate is attention the kernels run, else None."""
    kind_of_graph = (getattr(graph, "kind", None) if graph is not None else
                     getattr(eqn.inputs[0].type, "kind", None))
    p = eqn.params
    if kind_of_graph not in STREAMING_KINDS or p["update"] is not None:
        return None
    kind = kind_of(p["names"])
    if kind is not None:
        if kind not in CLAIMED or p["reduce_by"] != CANONICAL[kind][3]:
            return None
        types = [row_type(a.type) if r != "param" else a.type.strong()
                 for a, r in zip(eqn.inputs[1:], CANONICAL[kind][1])]
        if canonical_program(kind, types).structure_key() != p["edge_fn"].structure_key():
            return None
        if eqn.inputs[1].type.dtype.name not in FLOATS:
            return None
        return TritonAttentionPlan(backend, kind, None)
    red = p["reducer"]
    if (p["reduce_by"] != "dst" or red.name != "online_softmax"
            or getattr(red, "prune_threshold", None) is not None):
        return None
    pat = match_attention(p["edge_fn"], p["roles"], red, FLOATS)
    return None if pat is None else TritonAttentionPlan(backend, "forward", pat)


class TritonAttentionPlan:
    """One claimed propagate: the attention forward or a fused VJP propagate."""

    def __init__(self, backend: str, kind: str, pattern):
        self.backend, self.kind, self.pattern = backend, kind, pattern

    def run(self, eqn, graph, values: list) -> list:
        outs = [o.type.dtype.name for o in eqn.outputs]
        if self.kind == "forward":
            pat = self.pattern
            scale = 1.0 if pat.scale is None else (
                pat.scale[1] if pat.scale[0] == "lit" else float(values[pat.scale[1]]))
            q, k, v = (values[i] for i in (pat.q, pat.k, pat.v))
            run = _Launch(*(_shaped(x) for x in (q, k, v)), graph, scale, self.backend)
            o, top, mass = run.forward(run.t(q), run.t(k), run.t(v), outs[0])
            res = [o] if len(outs) == 1 else [o, top, mass]
            return [launch_result(run.buf, x, d, run.device) for x, d in zip(res, outs)]
        q, k, v, scale, do, lse, delta = values
        run = _Launch(*(_shaped(x) for x in (q, k, v)), graph, float(scale), self.backend)
        ops = [run.t(x) for x in (q, k, v, do)] + [run.t(x, run.ct) for x in (lse, delta)]
        if self.kind == "dq":
            _, _, dq = run.backward(*ops, False, True, [None, None, outs[0]])
            return [launch_result(run.buf, dq, outs[0], run.device)]
        dk, dv, dq = run.backward(*ops, True, self.kind == "dkdvq",
                                  outs + [None] * (3 - len(outs)))
        res = [dk, dv] + ([dq] if self.kind == "dkdvq" else [])
        return [launch_result(run.buf, x, d, run.device) for x, d in zip(res, outs)]

    def _blocks(self, eqn) -> tuple:
        """(operand type, block_m, block_n, num_warps, num_stages) a launch would take, from
        the equation's field types."""
        fields = [a.type for a in eqn.inputs[1:] if getattr(a.type, "ndim", 0) >= 1 and
                  a.type.dtype.name in FLOATS]
        if self.kind != "forward":
            fields = fields[:3]     # (q, k, v; the VJP's lse and delta are CT)
        _, it = operand_types({t.dtype.name for t in fields},
                              BACKENDS[self.backend].interpreter)
        width = max([max(16, pow2(int(t.shape[-1]))) for t in fields] or [16])
        bm, bn, warps, stages = triton_attention_blocks(
            2 if it in HALF else np.dtype(it).itemsize, width, BACKENDS[self.backend].interpreter)
        return it, bm, bn, warps, stages

    def describe(self, ex, eqn, graph, where: str) -> None:
        p = eqn.params
        what = {"forward": f"propagate[{p['reducer'].pp_param()}] by dst",
                "dq": "attention VJP dq (by dst)", "dkdv": "attention VJP dk, dv (by src)",
                "dkdvq": "attention VJP dk, dv (by src) and dq (by dst), two launches"}
        ex.routes.append((self.backend, f"{where}{what[self.kind]}",
                          "tiled Triton attention kernels"))
        kind = graph.kind if graph is not None else eqn.inputs[0].type.kind
        it, bm, bn, warps, stages = self._blocks(eqn)
        ex.traversal.append(
            f"{what[self.kind]} over {kind} relation: dot-product attention recognised; one "
            f"Triton program per {bm} rows and head (grid axis 1), tiles of {bn} keys "
            "with a running (max, mass, accumulator); each row reads one contiguous key range "
            "(lo, hi), no N x N score array; backward without atomics (dk, dv per key block, "
            f"dq per query block); tile products tl.dot on {it} operands ("
            + ("tensor cores, " if it in HALF else "") + "float32 accumulation" +
            (", TF32 (TIGA_TF32=1)" if it == "float32" and tf32_allowed() else "") + ")")
        ex.schedule = (f"{self.backend}: block_rows={bm}, block_neighbors={bn}, "
                       f"num_warps={warps}, num_stages={stages} (attention: head width padded "
                       "to a power of two >= 16, masked)")
        ex.cache_lines.append("triton attention kernels: " + (
            "hit (memory)" if fixed_held(attention_source(), "attention", self.backend)
            else "miss (compiled on the first call)"))
