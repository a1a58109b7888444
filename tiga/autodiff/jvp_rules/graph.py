"""autodiff: JVP rules of propagate, map_rows and the relation primitives.

A propagate's tangent is again a propagate over the same relation whose edge function is
the edge function's JVP (primal and tangent messages from one evaluation of the edge):

- sum, mean and per-edge results are linear: one propagate returns the primal and the
  tangent aggregates together (the doubled edge function, one walk);
- max / min: the tangent of the first extremal edge in edge order (the edge the VJP sends
  the cotangent to), found by an argmax / argmin propagate over the edges' order keys;
- prod: sum_i t_i prod_{j != i} m_j, exact with zeros (zero count and nonzero product);
- online_softmax: y = sum p_i v_i gives dy = sum p_i (dv_i + ds_i (v_i - y)), itself an
  online_softmax of the same scores over the value dv + ds (v - y);
- argmin / argmax results are integers: no tangent.
An update function's tangent runs per row through map_rows of its JVP program.
"""
from __future__ import annotations

from ...core.errors import UnsupportedError
from ...core.primitive import abstract_eval_rules
from ...core.prims.generated import knn_p, radius_p
from ...core.prims.graph import degrees_p, edge_ids_p, map_rows_p, propagate_p
from ...core.program import ClosedProgram
from ...core.reducers import argmax as argmax_reducer
from ...core.reducers import argmin as argmin_reducer
from ...core.reducers import min as min_reducer
from ...core.reducers import online_softmax as softmax_reducer
from ...core.reducers import prod as prod_reducer
from ...core.reducers import sum as sum_reducer
from ...core.types import TensorType
from ...trace import math as m
from ...trace.math import _typeof
from ...trace.tracer import aval_of, bind
from ..jvp import differentiable, forward_pass, instantiate, jvp_program, jvp_rules
from ..registry import NONDIFF
from ..rules.edge_order import edge_key
from ..rules.graph import SEG_ROLE, _edge_program, _lift


class _Tangents:
    """The propagate being differentiated: its fields, their present tangents (extra
    operands of the same roles), and the edge function's JVP on their rows."""

    def __init__(self, graph, fields, tfields, params):
        self.graph, self.params = graph, params
        self.fields, self.n = list(fields), len(fields)
        self.tidx = [i for i, t in enumerate(tfields) if t is not None]
        roles, names = params["roles"], params["names"]
        self.values = self.fields + [tfields[i] for i in self.tidx]
        self.roles = list(roles) + [roles[i] for i in self.tidx]
        self.names = list(names) + [f"d.{names[i]}" for i in self.tidx]
        rb = params["reduce_by"]
        self.seg = SEG_ROLE[rb] if isinstance(rb, str) else None

    def edge_jvp(self, rows):
        """(messages, tangent messages: zeros for float messages without one, None for
        integer messages) of one edge."""
        fn = self.params["edge_fn"]
        trows = [None] * self.n
        for k, i in enumerate(self.tidx):
            trows[i] = rows[self.n + k]
        nc = len(fn.consts)
        msgs, tmsgs = forward_pass(fn.program, list(fn.consts) + list(rows[:self.n]),
                                   [None] * nc + trows)
        tmsgs = [instantiate(t, msg) if differentiable(_typeof(msg)) else None
                 for t, msg in zip(tmsgs, msgs)]
        return msgs, tmsgs

    def propagate(self, fn, reducer, aux=(), reduce_by=None, key=None):
        """Reduce `fn(msgs, tmsgs, aux rows, edge key) -> messages` over the relation, by
        the forward's grouping (or `reduce_by`); `aux` are per-segment operands."""
        extra = [] if key is None else list(key.values)
        extra_roles = [] if key is None else list(key.roles)
        values = self.values + extra + list(aux)
        roles = self.roles + extra_roles + [self.seg] * len(aux)
        names = (self.names + [f"key{i}" for i in range(len(extra))]
                 + [f"aux{i}" for i in range(len(aux))])
        first = len(self.values)

        def edge(*rows):
            msgs, tmsgs = self.edge_jvp(rows[:first])
            eid = None if key is None else key.key(rows[first:first + len(extra)])
            return fn(msgs, tmsgs, rows[first + len(extra):], eid)

        prog = _edge_program(edge, values, roles)
        rb = self.params["reduce_by"] if reduce_by is None else reduce_by
        return bind(propagate_p, self.graph, *values, edge_fn=prog, reducer=reducer,
                    roles=tuple(roles), names=tuple(names), reduce_by=rb, update=None)

    def out_types(self) -> list:
        return abstract_eval_rules[propagate_p](aval_of(self.graph), *map(aval_of, self.fields),
                                                **{**self.params, "update": None})

    def primal(self):
        return bind(propagate_p, self.graph, *self.fields, **{**self.params, "update": None})


def _floats(outs):
    """Positions of the floating results (`outs`: values or their types)."""
    return [k for k, o in enumerate(outs)
            if differentiable(o if isinstance(o, TensorType) else aval_of(o))]


def _linear(ctx, reducer):
    """sum / mean / per-edge: primal and tangent aggregates from one doubled propagate."""
    probe = ctx.out_types()
    wanted = _floats(probe)
    rb = ctx.params["reduce_by"]
    if isinstance(rb, tuple):
        rb = rb + tuple(rb[k] for k in wanted)
    res = ctx.propagate(lambda msgs, tmsgs, aux, eid: list(msgs) + [tmsgs[k] for k in wanted],
                        reducer, reduce_by=rb)
    n = len(probe)
    touts = [None] * n
    for j, k in enumerate(wanted):
        touts[k] = res[n + j]
    return list(res[:n]), touts


def _first_extremal(ctx, outs, pick, name):
    """Tangents through the first extremal edge (smallest edge id, the edge the VJP picks)
    of each segment. `pick(msgs, tmsgs) -> (messages, tangent messages)`, one per output in
    `outs`; `name`: "max" or "min"."""
    wanted = _floats(outs)
    if not wanted:
        return [None] * len(outs)
    key, firsts = _winners(ctx, outs, pick, name, wanted)

    def through(msgs, tmsgs, aux, eid):
        _, tsel = pick(msgs, tmsgs)
        return [m.where(m.equal(_lift(eid, aux[j]), aux[j]), tsel[k], m.zeros_like(tsel[k]))
                for j, k in enumerate(wanted)]

    res = ctx.propagate(through, sum_reducer(), firsts, key=key)
    touts = [None] * len(outs)
    for j, k in enumerate(wanted):
        touts[k] = res[j]
    return touts


def _winners(ctx, outs, pick, name, wanted):
    """(edge key, per segment the key of the first extremal edge). The key increases with
    the edge id in every segment (edge_order: from the endpoints on implicit relations, no
    per-edge array). By destination, an arg-reducer over the keys finds it in one walk,
    comparing messages within that walk only; other groupings take the smallest key among
    the edges whose message equals the result (as the VJP does)."""
    key = edge_key(ctx.graph)
    if ctx.params["reduce_by"] == "dst":
        arg = argmax_reducer(of="edge") if name == "max" else argmin_reducer(of="edge")

        def parts(msgs, tmsgs, aux, eid):
            sel, _ = pick(msgs, tmsgs)
            return [p for k in wanted for p in (sel[k], m.convert(eid, "int64"))]
        return key, ctx.propagate(parts, arg, key=key)

    def first_hit(msgs, tmsgs, aux, eid):
        sel, _ = pick(msgs, tmsgs)
        return [m.where(m.equal(sel[k], aux[j]), _lift(eid, sel[k], key.dtype),
                        m.full(_typeof(sel[k]).shape, key.none, key.dtype))
                for j, k in enumerate(wanted)]

    return key, ctx.propagate(first_hit, min_reducer(), [outs[k] for k in wanted], key=key)


def _prod(ctx, outs):
    wanted = _floats(outs)
    if not wanted:
        return [None] * len(outs)
    zeros = ctx.propagate(lambda msgs, tm, aux, eid: [
        m.convert(m.equal(msgs[k], 0), _typeof(msgs[k]).dtype) for k in wanted], sum_reducer())
    rests = ctx.propagate(lambda msgs, tm, aux, eid: [
        m.where(m.equal(msgs[k], 0), m.ones_like(msgs[k]), msgs[k]) for k in wanted],
        prod_reducer())
    w = len(wanted)

    def tangent(msgs, tmsgs, aux, eid):
        out = []
        for j, k in enumerate(wanted):
            z, rest, mk = aux[j], aux[w + j], msgs[k]
            is_zero = m.equal(mk, 0)
            safe = m.where(is_zero, m.ones_like(mk), mk)
            d = m.where(is_zero, m.where(m.equal(z, 1), rest, m.zeros_like(mk)),
                        m.where(m.equal(z, 0), m.divide(rest, safe), m.zeros_like(mk)))
            out.append(m.multiply(tmsgs[k], d))
        return out

    res = ctx.propagate(tangent, sum_reducer(), list(zeros) + list(rests))
    touts = [None] * len(outs)
    for j, k in enumerate(wanted):
        touts[k] = res[j]
    return touts


def _softmax(ctx, outs, reducer):
    """dy = online_softmax(s, dv + ds (v - y)) per (score, value) pair; with row
    statistics, the row max's tangent goes through its first maximal score and the
    mass's is sum exp(s - max) (ds - dmax)."""
    pairs = len(outs) - (2 if reducer.stats else 0)
    ys = list(outs[:pairs])

    def value(msgs, tmsgs, aux, eid):
        parts = []
        for k in range(pairs):
            s, v, ds, dv = msgs[2 * k], msgs[2 * k + 1], tmsgs[2 * k], tmsgs[2 * k + 1]
            parts += [s, m.add(dv, m.multiply(_lift(ds, v), m.subtract(v, aux[k])))]
        return parts

    tys = ctx.propagate(value, softmax_reducer(reducer.prune_threshold), ys)
    if not reducer.stats:
        return list(tys)
    top = outs[pairs]
    (dtop,) = _first_extremal(ctx, [top], lambda msgs, tmsgs: ([msgs[0]], [tmsgs[0]]), "max")
    dmass = ctx.propagate(lambda msgs, tmsgs, aux, eid: [m.multiply(
        m.exp(m.subtract(msgs[0], aux[0])), m.subtract(tmsgs[0], aux[1]))], sum_reducer(),
        [top, dtop])[0]
    return list(tys) + [dtop, dmass]


def _aggregate_jvp(ctx, reducer):
    """(outs, tangents) of the propagate without its update function."""
    rb = ctx.params["reduce_by"]
    if rb == "edge" or (reducer.builtin and reducer.name in ("sum", "mean")):
        return _linear(ctx, reducer)
    if isinstance(rb, tuple):
        raise UnsupportedError(f"forward-mode derivatives of a per-output reduce_by with "
                               f"{reducer.pp_param()}", hint="use sum or mean")
    outs = list(ctx.primal())
    if reducer.is_arg:
        return outs, [None] * len(outs)
    if reducer.builtin and reducer.name in ("max", "min"):
        return outs, _first_extremal(ctx, outs, lambda msgs, tmsgs: (msgs, tmsgs),
                                     reducer.name)
    if reducer.builtin and reducer.name == "prod":
        return outs, _prod(ctx, outs)
    if reducer.builtin and reducer.name == "online_softmax":
        return outs, _softmax(ctx, outs, reducer)
    raise UnsupportedError(f"forward-mode derivatives through the user reducer "
                           f"{reducer.name!r}", hint="use a built-in reducer (sum, mean, max, "
                           "min, prod, online_softmax) for differentiated programs")


def propagate_jvp_rule(primals, tangents, **params):
    graph, fields, tfields = primals[0], primals[1:], tangents[1:]
    ctx = _Tangents(graph, fields, tfields, params)
    update = params["update"]
    if update is not None and params["reducer"].is_arg:
        outs = bind(propagate_p, graph, *fields, **params)
        return list(outs), [None] * len(outs)
    outs, touts = _aggregate_jvp(ctx, params["reducer"])
    if update is None:
        return outs, touts
    return _update_jvp(update, fields, tfields, params["roles"], outs, touts)


def _update_jvp(update, fields, tfields, roles, aggs, taggs):
    """The update function per row, with its JVP, through map_rows."""
    dst = [i for i, r in enumerate(roles) if r == "dst"]
    params = [i for i, r in enumerate(roles) if r == "param"]
    ins = [fields[i] for i in dst] + list(aggs) + [fields[i] for i in params]
    tins = [tfields[i] for i in dst] + list(taggs) + [tfields[i] for i in params]
    batched = [True] * (len(dst) + len(aggs)) + [False] * len(params)
    return map_rows_jvp_rule(ins, tins, fn=update, batched=tuple(batched))


def map_rows_jvp_rule(primals, tangents, *, fn, batched):
    nc = len(fn.consts)
    live = [t is not None and differentiable(_typeof(x)) for x, t in zip(primals, tangents)]
    prog = jvp_program(fn.program, [False] * nc + live)
    present = [(t, b) for t, b, w in zip(tangents, batched, live) if w]
    res = bind(map_rows_p, *fn.consts, *primals, *[t for t, _ in present],
               fn=ClosedProgram(prog), batched=(False,) * nc + tuple(batched)
               + tuple(b for _, b in present))
    n = len(fn.program.outs)
    return list(res[:n]), list(res[n:])


jvp_rules[propagate_p] = propagate_jvp_rule
jvp_rules[map_rows_p] = map_rows_jvp_rule
for _p in (edge_ids_p, degrees_p, radius_p, knn_p):
    jvp_rules[_p] = NONDIFF
