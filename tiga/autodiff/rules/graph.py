"""autodiff: VJP rules of propagate and map_rows.

For a fixed relation, cotangents of source fields are a propagate grouped by source (the
transposed relation) of the edge function's VJP; destination-field cotangents group by
destination, edge-field cotangents stay per edge, parameter cotangents sum over all edges.
Each reducer contributes a per-edge message cotangent from per-segment auxiliary values.
"""
from __future__ import annotations

from ...core.errors import UnsupportedError
from ...core.passes import cse, dce
from ...core.prims.generated import knn_p, radius_p
from ...core.prims.graph import degrees_p, edge_ids_p, map_rows_p, propagate_p
from ...core.program import ClosedProgram
from ...core.reducers import max as max_reducer
from ...core.reducers import min as min_reducer
from ...core.reducers import prod as prod_reducer
from ...core.reducers import sum as sum_reducer
from ...trace import math as m
from ...trace.math import _typeof
from ...trace.staging import inline_program, trace_flat
from ...trace.tracer import bind
from ..registry import NONDIFF, vjp_rules
from ..vjp import backward_pass, differentiable, vjp_program
from .attention import attention_vjp, match_attention, vjp_dtypes
from .edge_order import edge_key
from .rows import row_types as _row_types

SEG_ROLE = {"dst": "dst", "src": "src", "all": "param", "edge": "edge"}


def _edge_program(fn, values, roles) -> ClosedProgram:
    prog, caps, _ = trace_flat(fn, _row_types(values, roles))
    assert not caps, "derived edge programs are closed"
    return ClosedProgram(cse(prog))


def _messages(edge_fn, rows):
    return inline_program(edge_fn.program, *edge_fn.consts, *rows)


def _run(graph, values, roles, fn, reducer, reduce_by):
    prog = _edge_program(fn, values, roles)
    names = tuple(f"v{i}" for i in range(len(values)))
    return bind(propagate_p, graph, *values, edge_fn=prog, reducer=reducer, roles=tuple(roles),
                names=names, reduce_by=reduce_by, update=None)


def _lift(value, like, dtype=None):
    """Broadcast a per-segment scalar-per-row array to the shape of `like`, in `like`'s
    dtype (or `dtype`)."""
    tv, tl = _typeof(value), _typeof(like)
    value = m.reshape(value, tv.shape + (1,) * (tl.ndim - tv.ndim))
    return m.broadcast_to(m.convert(value, dtype or tl.dtype), tl.shape)


class _Ctx:
    """The forward call being differentiated; `key` orders the edges when a plan needs it
    (edge_order.EdgeKey: its operands follow the fields)."""

    def __init__(self, graph, fields, roles, edge_fn, reduce_by):
        self.graph, self.fields, self.roles = graph, list(fields), list(roles)
        self.edge_fn, self.reduce_by = edge_fn, reduce_by
        self.seg = SEG_ROLE[reduce_by]
        self.key = None

    def operands(self, aux):
        extra, extra_roles = ([], []) if self.key is None else (self.key.values,
                                                                 self.key.roles)
        values = self.fields + list(extra) + list(aux)
        roles = self.roles + list(extra_roles) + [self.seg] * len(aux)
        return values, roles

    def split(self, rows):
        """rows -> (messages, the edge's order key or None, aux rows)."""
        n = len(self.fields)
        msgs = _messages(self.edge_fn, rows[:n])
        if self.key is None:
            return msgs, None, rows[n:]
        k = len(self.key.values)
        return msgs, self.key.key(rows[n:n + k]), rows[n + k:]

    def aux_propagate(self, fn, reducer, aux=()):
        """Reduce `fn(messages, aux rows, edge key)` per segment with the forward's grouping."""
        def edge(*rows):
            msgs, eid, aux_rows = self.split(rows)
            return fn(msgs, aux_rows, eid)

        values, roles = self.operands(aux)
        return _run(self.graph, values, roles, edge, reducer, self.reduce_by)[0]


def _plan(name, ctx, outs, ct_outs):
    """(aux values read per segment, f(msgs, aux_rows, eid) -> message cotangents)."""
    if ctx.reduce_by == "edge" or name == "sum":
        return list(ct_outs), lambda msgs, aux, eid: list(aux)
    if name == "mean":
        return _mean_plan(ctx, ct_outs)
    if name in ("max", "min"):
        return _extremum_plan(ctx, outs, ct_outs)
    if name == "prod":
        return _prod_plan(ctx, ct_outs)
    if name == "online_softmax":
        return _softmax_plan(ctx, outs, ct_outs)
    raise UnsupportedError(f"gradients through the user reducer {name!r}",
                           hint="use a built-in reducer (sum, mean, max, min, prod, "
                                "online_softmax) for differentiated programs")


def _mean_plan(ctx, ct_outs):
    if ctx.reduce_by == "all":
        deg = m.sum(bind(degrees_p, ctx.graph, by="dst"))
    else:
        deg = bind(degrees_p, ctx.graph, by=ctx.reduce_by)
    scaled = [m.divide(ct, _lift(m.maximum(deg, 1), ct)) for ct in ct_outs]
    return scaled, lambda msgs, aux, eid: list(aux)


def _extremum_plan(ctx, outs, ct_outs):
    """The cotangent goes to the first extremal edge (smallest edge id) of each segment:
    the smallest order key (edge_order: computed from the endpoints on implicit relations,
    the edge ids elsewhere)."""
    key = ctx.key = edge_key(ctx.graph)
    n = len(outs)

    # keys stay integers: in a float32 message's dtype keys past 2**24 round together, and
    # the cotangent of one extremal edge would leak to its neighbours
    def first_hit(msgs, aux, eid, k):
        hit = m.equal(msgs[k], aux[0])
        return m.where(hit, _lift(eid, msgs[k], key.dtype),
                       m.full(_typeof(msgs[k]).shape, key.none, key.dtype))

    firsts = [ctx.aux_propagate(lambda msgs, aux, eid, k=k: first_hit(msgs, aux, eid, k),
                                min_reducer(), [y]) for k, y in enumerate(outs)]

    def ct_fn(msgs, aux, eid):
        return [m.where(m.equal(_lift(eid, aux[n + k]), aux[n + k]), aux[k],
                        m.zeros_like(aux[k])) for k in range(n)]

    return list(ct_outs) + firsts, ct_fn


def _prod_plan(ctx, ct_outs):
    n = len(ct_outs)
    zeros = [ctx.aux_propagate(lambda msgs, aux, eid, k=k: m.convert(
        m.equal(msgs[k], 0), _typeof(msgs[k]).dtype), sum_reducer()) for k in range(n)]
    rests = [ctx.aux_propagate(lambda msgs, aux, eid, k=k: m.where(
        m.equal(msgs[k], 0), m.ones_like(msgs[k]), msgs[k]), prod_reducer()) for k in range(n)]

    def ct_fn(msgs, aux, eid):
        cts = []
        for k in range(n):
            ct, z, rest, mk = aux[k], aux[n + k], aux[2 * n + k], msgs[k]
            is_zero = m.equal(mk, 0)
            safe = m.where(is_zero, m.ones_like(mk), mk)
            d = m.where(is_zero, m.where(m.equal(z, 1), rest, m.zeros_like(mk)),
                        m.where(m.equal(z, 0), m.divide(rest, safe), m.zeros_like(mk)))
            cts.append(m.multiply(ct, d))
        return cts

    return list(ct_outs) + zeros + rests, ct_fn


def _softmax_plan(ctx, outs, ct_outs):
    n = len(outs)
    tops = [ctx.aux_propagate(lambda msgs, aux, eid, k=k: msgs[2 * k], max_reducer())
            for k in range(n)]
    masses = [ctx.aux_propagate(lambda msgs, aux, eid, k=k: m.exp(
        m.subtract(msgs[2 * k], aux[0])), sum_reducer(), [tops[k]]) for k in range(n)]
    lses = [m.add(top, m.log(m.where(m.greater(mass, 0), mass, m.ones_like(mass))))
            for top, mass in zip(tops, masses)]

    def ct_fn(msgs, aux, eid):
        cts = []
        for k in range(n):
            ct, y, lse = aux[k], aux[n + k], aux[2 * n + k]
            s, v = msgs[2 * k], msgs[2 * k + 1]
            p = m.exp(m.subtract(s, lse))
            tail = tuple(range(_typeof(s).ndim, _typeof(v).ndim))
            dot = m.multiply(ct, m.subtract(v, y))
            if tail:
                dot = m.sum(dot, axis=tail)
            cts += [m.multiply(p, dot), m.multiply(_lift(p, v), ct)]
        return cts

    return list(ct_outs) + list(outs) + lses, ct_fn


def propagate_vjp_rule(ct_outs, outs, graph, *fields, edge_fn, reducer, roles, names,
                       reduce_by, update):
    fields = list(fields)
    extra = [None] * len(fields)
    if reducer.builtin and reducer.name in ("argmin", "argmax") and reduce_by != "edge":
        # ids are piecewise constant in the messages: no cotangent reaches any field
        if update is not None:
            raise UnsupportedError(f"gradients through {reducer.pp_param()} with an update "
                                   "function: the ids are integers (not differentiable)",
                                   hint="differentiate tg.min()/tg.max() for the value and "
                                        "apply the update outside the propagate")
        return (None,) * (1 + len(fields))
    if update is not None:
        outs = bind(propagate_p, graph, *fields, edge_fn=edge_fn, reducer=reducer, roles=roles,
                    names=names, reduce_by=reduce_by, update=None)
        ct_outs, extra = _update_vjp(update, fields, roles, outs, ct_outs)
    # (16-bit fields: the canonical propagates only where the selected route's kernels take
    # them, attention.vjp_dtypes; the trace is cached per function and input types)
    pattern = (match_attention(edge_fn, roles, reducer, vjp_dtypes())
        if reduce_by == "dst" else None)
    if pattern is not None:
        # dot-product attention: the FlashAttention-2-style canonical propagates (lse saved
        # by the streaming forward, probabilities recomputed blockwise, no per-edge array)
        # (a propagate returning its row statistics too: its VJP reads them; their own
        # cotangents are zero, nothing but this VJP reads these residual outputs)
        cts = attention_vjp(pattern, graph, fields, outs[0], ct_outs[0],
                            tuple(outs[1:3]) if reducer.stats else None)
        return (None,) + tuple(_add(a, b) for a, b in zip(cts, extra))
    ctx = _Ctx(graph, fields, roles, edge_fn, reduce_by)
    aux, ct_fn = _plan(reducer.name if reduce_by != "edge" else "sum", ctx, outs, ct_outs)
    cts = _field_cotangents(ctx, aux, ct_fn)
    return (None,) + tuple(_add(a, b) for a, b in zip(cts, extra))


def _add(a, b):
    if a is None:
        return b
    return a if b is None else m.add(a, b)


def _field_cotangents(ctx, aux, ct_fn):
    """One propagate per role that has differentiable fields, each a DCE'd edge VJP."""
    n = len(ctx.fields)
    wanted = [differentiable(_typeof(v)) for v in ctx.fields]
    values, roles = ctx.operands(aux)
    prog_in = _row_types(values, roles)

    def edge_vjp(*rows):
        msgs, eid, aux_rows = ctx.split(rows)
        ct_msgs = ct_fn(msgs, aux_rows, eid)
        _, ct_rows = backward_pass(ctx.edge_fn.program, list(ctx.edge_fn.consts) + list(rows[:n]),
                                   ct_msgs)
        ct_rows = ct_rows[len(ctx.edge_fn.consts):]
        return [ct if ct is not None else m.zeros_like(r) for ct, r in zip(ct_rows, rows[:n])]

    full, caps, _ = trace_flat(edge_vjp, prog_in)
    full = cse(full)
    cts = [None] * n
    group = {"src": "src", "dst": "dst", "edge": "edge", "param": "all"}
    for role in ("src", "dst", "edge", "param"):
        idx = [i for i in range(n) if ctx.roles[i] == role and wanted[i]]
        if not idx:
            continue
        prog = ClosedProgram(dce(full, keep_outputs=idx))
        res = bind(propagate_p, ctx.graph, *values, edge_fn=prog, reducer=sum_reducer(),
                   roles=tuple(roles), names=tuple(f"v{i}" for i in range(len(values))),
                   reduce_by=group[role], update=None)
        for i, r in zip(idx, res):
            cts[i] = m.convert(r, _typeof(ctx.fields[i]).dtype)
    return cts


def _update_vjp(update, fields, roles, aggs, ct_outs):
    """Per-row VJP of the update function through map_rows; returns (ct aggs, field cts)."""
    dst = [i for i, r in enumerate(roles) if r == "dst"]
    params = [i for i, r in enumerate(roles) if r == "param"]
    uv = vjp_program(update.program, [True] * len(update.program.in_binders))
    n_out = len(update.program.outs)
    ins = [fields[i] for i in dst] + list(aggs) + [fields[i] for i in params] + list(ct_outs)
    batched = tuple([True] * (len(dst) + len(aggs)) + [False] * len(params) + [True] * n_out)
    res = bind(map_rows_p, *ins, fn=ClosedProgram(uv), batched=batched)
    cts = res[n_out:]
    ct_dst, ct_aggs = cts[:len(dst)], cts[len(dst):len(dst) + len(aggs)]
    ct_params = cts[len(dst) + len(aggs):]
    extra = [None] * len(fields)
    for i, c in zip(dst, ct_dst):
        extra[i] = c
    for i, c in zip(params, ct_params):
        extra[i] = m.sum(c, axis=0)
    return ct_aggs, extra


def map_rows_vjp_rule(ct_outs, outs, *xs, fn, batched):
    wrt = [True] * len(fn.program.in_binders)
    fv = vjp_program(fn.program, wrt)
    n_out = len(fn.program.outs)
    consts = list(fn.consts)
    res = bind(map_rows_p, *consts, *xs, *ct_outs, fn=ClosedProgram(fv),
               batched=(False,) * len(consts) + tuple(batched) + (True,) * n_out)
    cts = res[n_out + len(consts):]
    out = []
    for x, b, c in zip(xs, batched, cts):
        if not differentiable(_typeof(x)):
            out.append(None)
        else:
            out.append(c if b else m.sum(c, axis=0))
    return tuple(out)


vjp_rules[propagate_p] = propagate_vjp_rule
vjp_rules[map_rows_p] = map_rows_vjp_rule
vjp_rules[edge_ids_p] = NONDIFF
vjp_rules[degrees_p] = NONDIFF
# topology selection is discrete; coordinates get gradients through the hidden position
# fields of the propagates that read the relation
vjp_rules[radius_p] = NONDIFF
vjp_rules[knn_p] = NONDIFF
