"""autodiff: dot-product attention recognised in an online_softmax edge function, and its VJP.

An online_softmax propagate whose edge function is `score = (dst.q * src.k).sum(-1) * scale`
(scale: a parameter, a literal or absent) with `src.v` as the value is attention. Its VJP is
written FlashAttention-2 style as four canonical propagates over the same relation:

- row max and row mass of the scores (together the per-row log-sum-exp; read from the
  forward's own residual outputs when it returns them, `online_softmax(stats)`),
- dq grouped by destination and (dk, dv) grouped by source, each recomputing the
  probabilities from the log-sum-exp: p = exp(s - lse), ds = p * (dO . v - delta),
  delta = dO . y. No per-edge array exists in any of them.

The canonical edge programs are built here so that the runtime recognises them by structure
(`canonical_key`), and every other route (generic kernel, reference interpreter) still runs
them with the same semantics.
"""
from __future__ import annotations

import functools

from ...core.prims.graph import propagate_p
from ...core.program import ClosedProgram, Lit
from ...core.records import record
from ...core.reducers import max as max_reducer
from ...core.reducers import sum as sum_reducer
from ...trace import math as m
from ...trace.math import _typeof
from .rows import row_types

# relations whose every destination row reads one contiguous source range [lo, hi), lo and hi
# nondecreasing: what the streaming route (xla_free_runtime.backends.cpu.attention) walks
STREAMING_KINDS = ("dense", "triangular", "cu_seqlens")
TAG = "attn."   # prefix of the operand names of the canonical VJP propagates


@record
class AttentionPattern:
    """Operand indices of q (dst), k (src), v (src); scale: ('param', i) | ('lit', x) | None."""

    q: int
    k: int
    v: int
    scale: tuple | None
    heads: bool           # q rows are (H, D) (score per head) rather than (D,)


def _producer(program):
    return {id(o): e for e in program.eqns for o in e.outputs}


FULL_FLOATS = ("float32", "float64")
HALF_FLOATS = ("float16", "bfloat16", "float32", "float64")
_HALF_ROUTES: list = []   # predicates of runtime routes whose VJP kernels take 16-bit fields


def register_half_vjp(selected) -> None:
    """A runtime route whose attention VJP kernels take float16 / bfloat16 fields (the
    Triton kernels: tensor cores) registers `selected()`: whether a VJP traced now runs on
    it (the selected backend). autodiff sits below the runtime, so the runtime says so."""
    _HALF_ROUTES.append(selected)


def vjp_dtypes() -> tuple:
    """Field dtypes whose attention VJP is traced as the canonical propagates now: float32
    and float64 on every route; float16 and bfloat16 only where a registered route runs
    them. Elsewhere (cpu-llvm, whose attention kernels are 32/64-bit) a 16-bit attention
    keeps the generic VJP it always had."""
    for selected in _HALF_ROUTES:
        if selected():
            return HALF_FLOATS
    return FULL_FLOATS


def match_attention(edge_fn: ClosedProgram, roles, reducer,
                    dtypes: tuple = ("float32", "float64")) -> AttentionPattern | None:
    """The attention pattern of an online_softmax edge function whose fields are of one of
    `dtypes`, else None (the Triton kernels also take float16 / bfloat16)."""
    if reducer.name != "online_softmax" or not reducer.builtin or edge_fn.consts:
        return None
    prog = edge_fn.program
    if len(prog.outs) != 2:
        return None
    binders = {id(b): i for i, b in enumerate(prog.in_binders)}
    prod = _producer(prog)
    score, value = prog.outs
    vi = binders.get(id(value))
    if vi is None or roles[vi] != "src":
        return None
    scale = None
    e = prod.get(id(score))
    if e is not None and e.primitive.name == "mul":
        a, b = e.inputs
        for s, other in ((b, a), (a, b)):
            found = _scalar(s, prod, binders, roles)
            pe = prod.get(id(other))
            if found is not None and pe is not None and pe.primitive.name == "reduce_sum":
                scale, e = found, pe
                break
        else:
            return None
    if e is None or e.primitive.name != "reduce_sum":
        return None
    x = e.inputs[0]
    nd = len(x.type.shape)
    if nd not in (1, 2) or tuple(e.params.get("axes", ())) != (nd - 1,):
        return None
    me = prod.get(id(x))
    if me is None or me.primitive.name != "mul":
        return None
    idx = [binders.get(id(a)) for a in me.inputs]
    if None in idx:
        return None
    r = [roles[i] for i in idx]
    if sorted(r) != ["dst", "src"]:
        return None
    qi, ki = (idx[0], idx[1]) if r[0] == "dst" else (idx[1], idx[0])
    qt, kt, vt = (prog.in_binders[i].type for i in (qi, ki, vi))
    if qt.shape != kt.shape or tuple(x.type.shape) != tuple(qt.shape):
        return None
    if len(vt.shape) != nd or (nd == 2 and vt.shape[0] != qt.shape[0]):
        return None
    if not (qt.dtype == kt.dtype == vt.dtype) or qt.dtype.name not in dtypes:
        return None
    return AttentionPattern(qi, ki, vi, scale, nd == 2)


def _scalar(a, prod, binders, roles):
    """A scalar scale operand: a literal, a scalar parameter, or a convert of one."""
    if tuple(a.type.shape) != ():
        return None
    if isinstance(a, Lit):
        return ("lit", float(a.value))
    i = binders.get(id(a))
    if i is None:
        e = prod.get(id(a))
        if e is None or e.primitive.name != "convert" or tuple(e.inputs[0].type.shape) != ():
            return None
        src = e.inputs[0]
        if isinstance(src, Lit):
            return ("lit", float(src.value))
        i = binders.get(id(src))
    if i is None or roles[i] != "param":
        return None
    return ("param", i)


# ---- canonical VJP propagates ----------------------------------------------------------

def _score(q, k, scale, heads):
    s = m.sum(m.multiply(q, k), axis=-1)
    return m.multiply(s, m.convert(scale, _typeof(s).dtype))


def _dot_last(a, b):
    return m.sum(m.multiply(a, b), axis=-1)


def _lift(x, like):
    t, tl = _typeof(x), _typeof(like)
    return m.broadcast_to(m.reshape(x, t.shape + (1,) * (tl.ndim - t.ndim)), tl.shape)


def edge_rowmax(q, k, scale, y):
    return _score(q, k, scale, True)


def edge_mass(q, k, scale, y, top):
    return m.exp(m.subtract(_score(q, k, scale, True), top))


def _ds(q, k, v, scale, do, lse, delta):
    p = m.exp(m.subtract(_score(q, k, scale, True), lse))
    return p, m.multiply(p, m.subtract(_dot_last(do, v), delta))


def edge_dq(q, k, v, scale, do, lse, delta):
    _, ds = _ds(q, k, v, scale, do, lse, delta)
    return m.multiply(_lift(m.multiply(ds, m.convert(scale, _typeof(ds).dtype)), k), k)


def edge_dkdv(q, k, v, scale, do, lse, delta):
    p, ds = _ds(q, k, v, scale, do, lse, delta)
    dk = m.multiply(_lift(m.multiply(ds, m.convert(scale, _typeof(ds).dtype)), q), q)
    return dk, m.multiply(_lift(p, do), do)


def edge_dkdvq(q, k, v, scale, do, lse, delta):
    p, ds = _ds(q, k, v, scale, do, lse, delta)
    sds = m.multiply(ds, m.convert(scale, _typeof(ds).dtype))
    return (m.multiply(_lift(sds, q), q), m.multiply(_lift(p, do), do),
            m.multiply(_lift(sds, k), k))


def edge_dscale(q, k, v, scale, do, lse, delta):
    _, ds = _ds(q, k, v, scale, do, lse, delta)
    return m.sum(m.multiply(ds, _dot_last(q, k)))


# name -> (edge function, roles, reducer, reduce_by)
CANONICAL = {
    "rowmax": (edge_rowmax, ("dst", "src", "param", "dst"), max_reducer, "dst"),
    "mass": (edge_mass, ("dst", "src", "param", "dst", "dst"), sum_reducer, "dst"),
    "dq": (edge_dq, ("dst", "src", "src", "param", "dst", "dst", "dst"), sum_reducer, "dst"),
    "dkdv": (edge_dkdv, ("dst", "src", "src", "param", "dst", "dst", "dst"), sum_reducer,
             "src"),
    # dk, dv (by source) and dq (by destination) from one walk: a multi-output propagate
    # that opt.attention_pairing makes of a dkdv and a dq propagate over the same operands
    "dkdvq": (edge_dkdvq, ("dst", "src", "src", "param", "dst", "dst", "dst"), sum_reducer,
              ("src", "src", "dst")),
    "dscale": (edge_dscale, ("dst", "src", "src", "param", "dst", "dst", "dst"), sum_reducer,
               "all"),
}
_ARGS = {"rowmax": ("q", "k", "scale", "y"), "mass": ("q", "k", "scale", "y", "top")}
_GRAD_ARGS = ("q", "k", "v", "scale", "do", "lse", "delta")


def names_of(kind: str) -> tuple:
    return tuple(f"{TAG}{kind}.{a}" for a in _ARGS.get(kind, _GRAD_ARGS))


def kind_of(names) -> str | None:
    """Which canonical propagate an operand-name tuple announces (a cheap first filter)."""
    if not names or not str(names[0]).startswith(TAG):
        return None
    kind = str(names[0])[len(TAG):].split(".")[0]
    return kind if kind in CANONICAL and tuple(names) == names_of(kind) else None


def canonical_program(kind: str, row_types) -> ClosedProgram:
    """The edge program of canonical propagate `kind` over these row types (traced once per
    kind and types: a pure function of them, so a bounded memo)."""
    return _canonical_program(kind, tuple(row_types))


@functools.lru_cache(maxsize=128)
def _canonical_program(kind: str, row_types: tuple) -> ClosedProgram:
    from ...core.passes import cse
    from ...trace.staging import trace_flat
    p, caps, _ = trace_flat(CANONICAL[kind][0], list(row_types))
    assert not caps
    return ClosedProgram(cse(p))


def _bind(kind, graph, values):
    from ...trace.tracer import bind
    _, roles, reducer, reduce_by = CANONICAL[kind]
    prog = canonical_program(kind, row_types(values, roles))
    return bind(propagate_p, graph, *values, edge_fn=prog, reducer=reducer(), roles=roles,
                names=names_of(kind), reduce_by=reduce_by, update=None)


def attention_vjp(pat: AttentionPattern, graph, fields, y, ct, stats=None):
    """Cotangents of every field of the forward propagate (None where not differentiable).

    `stats`: the forward's own per-row (max, mass) outputs when it returns them (a propagate
    with `online_softmax(stats)`, opt.attention_pairing): read, not recomputed. Without
    them, two canonical propagates compute them (and that pass pairs them with the forward
    when both run in one program)."""
    from ..vjp import differentiable
    q, k, v = fields[pat.q], fields[pat.k], fields[pat.v]
    dtype = _typeof(q).dtype
    if pat.scale is None:
        scale = m.full((), 1.0, dtype)
    elif pat.scale[0] == "lit":
        scale = m.full((), pat.scale[1], dtype)
    else:
        scale = fields[pat.scale[1]]
    if stats is not None:
        top, mass = stats
    else:
        top = _bind("rowmax", graph, [q, k, scale, y])[0]
        mass = _bind("mass", graph, [q, k, scale, y, top])[0]
    lse = m.add(top, m.log(m.where(m.greater(mass, 0), mass, m.ones_like(mass))))
    delta = _dot_last(ct, y)
    grads = [q, k, v, scale, ct, lse, delta]
    out = [None] * len(fields)
    want = [differentiable(_typeof(f)) for f in fields]
    if want[pat.k] or want[pat.v]:
        dk, dv = _bind("dkdv", graph, grads)
        out[pat.k] = dk if want[pat.k] else None
        out[pat.v] = dv if want[pat.v] else None
    if want[pat.q]:
        out[pat.q] = _bind("dq", graph, grads)[0]
    if pat.scale is not None and pat.scale[0] == "param" and want[pat.scale[1]]:
        ds = _bind("dscale", graph, grads)[0]
        out[pat.scale[1]] = m.convert(ds, _typeof(fields[pat.scale[1]]).dtype)
    return out
