"""core: graph primitives: propagate (message passing), map_rows, edge_ids, degrees."""
from __future__ import annotations

import numpy as np

from ..dtypes import int64
from ..errors import DTypeError, ShapeError, UnsupportedError
from ..eval import eval_closed, eval_rows
from ..primitive import abstract_eval_rules, impl_rules, primitive
from ..program import ClosedProgram
from ..segment import segment_reduce, wide
from ..types import GraphType, TensorType

propagate_p = primitive("propagate", "graph", multiple_results=True)
map_rows_p = primitive("map_rows", "graph", multiple_results=True)
edge_ids_p = primitive("edge_ids", "graph")
degrees_p = primitive("degrees", "graph")

ROLES = ("src", "dst", "edge", "param")
REDUCE_BY = ("dst", "src", "edge", "all")


def role_size(g: GraphType, role: str):
    return {"src": g.num_src, "dst": g.num_dst, "edge": g.num_edges}[role]


def row_type(t: TensorType) -> TensorType:
    return TensorType(t.shape[1:], t.dtype, t.weak)


def _check_fields(g: GraphType, fields, roles, names) -> list:
    rows = []
    for t, role, name in zip(fields, roles, names):
        if role == "param":
            rows.append(t)
            continue
        want = role_size(g, role)
        if t.ndim == 0 or t.shape[0] != want:
            raise ShapeError(f"{role}.{name}: {role} fields need a leading axis of "
                             f"{role}-entities ({want}), found shape {t}")
        rows.append(row_type(t))
    return rows


def _reduced_type(reducer, parts: list, name: str) -> TensorType:
    if reducer.builtin and reducer.name == "online_softmax":
        score, value = parts
        if value.shape[:score.ndim] != score.shape:
            raise ShapeError(f"online_softmax: value {value} must start with the score shape "
                             f"{score} (one score per head)")
        if not score.dtype.is_float or not value.dtype.is_float:
            raise DTypeError(f"online_softmax: score and value must be floating, found "
                             f"{score} and {value}")
        return value.strong()
    if reducer.builtin and reducer.name in ("argmin", "argmax"):
        m, ids = parts   # the message and the id the tracer appends (a source or edge id)
        if ids.shape != () or ids.dtype != int64:
            raise DTypeError(f"{name}: {reducer.name} takes (message, id) with a scalar int64 "
                             f"id per edge, found {m} and {ids}")
        return TensorType(m.shape, int64)
    (m,) = parts
    _check_empty(reducer, m, name)
    if reducer.builtin and reducer.name == "mean" and not m.dtype.is_float:
        raise DTypeError(f"{name}: mean needs floating messages, found {m}")
    if not reducer.builtin and reducer.regions is not None:
        return reducer.regions[2].out_types[0].strong() if reducer.regions[2] else m.strong()
    return m.strong()


def propagate_abstract_eval_rule(g, *fields, edge_fn, reducer, roles, names, reduce_by,
                                 update):
    if not isinstance(g, GraphType):
        raise ShapeError(f"propagate: first operand must be a relation, found {g}")
    if isinstance(reduce_by, tuple):
        return _per_output_types(g, fields, edge_fn, reducer, roles, names, reduce_by, update)
    if reduce_by not in REDUCE_BY:
        raise ShapeError(f"propagate: reduce_by must be one of {REDUCE_BY}, found {reduce_by!r}")
    rows = _check_fields(g, fields, roles, names)
    if [t.strong() for t in edge_fn.in_types] != [t.strong() for t in rows]:
        raise ShapeError("propagate: edge function binders "
                         f"({', '.join(map(str, edge_fn.in_types))}) do not match the field "
                         f"rows ({', '.join(map(str, rows))})")
    msgs = edge_fn.out_types
    if reduce_by == "edge":
        return [TensorType((g.num_edges,) + m.shape, m.dtype) for m in msgs]
    k = reducer.arity
    if len(msgs) % k:
        raise ShapeError(f"propagate: {reducer.name} takes {k} message parts per output")
    outs = [_reduced_type(reducer, msgs[i:i + k], "propagate") for i in range(0, len(msgs), k)]
    if reducer.stats:   # online_softmax's per-row (max, mass): one per score, after the value
        if update is not None or len(outs) != 1:
            raise ShapeError("propagate: online_softmax row statistics need one (score, value) "
                             f"pair and no update, found {len(outs)} output(s), update "
                             f"{update is not None}")
        outs += [msgs[0].strong(), msgs[0].strong()]
    if update is not None:
        outs = _update_types(update, rows, roles, outs)
    if reduce_by == "all":
        return outs
    lead = g.num_src if reduce_by == "src" else g.num_dst
    return [TensorType((lead,) + t.shape, t.dtype) for t in outs]


def _per_output_types(g, fields, edge_fn, reducer, roles, names, reduce_by, update):
    """A multi-output propagate grouping each output by its own side (`reduce_by`: one of
    "dst"/"src" per output), e.g. attention's dk, dv (by source) and dq (by destination)
    from one walk."""
    if (update is not None or not reducer.builtin or reducer.arity != 1 or reducer.stats or
            any(r not in ("dst", "src") for r in reduce_by)):
        raise ShapeError(f"propagate: per-output reduce_by {reduce_by} needs a one-part built-in "
                         f"reducer, no update and 'dst'/'src' entries, found "
                         f"{reducer.pp_param()}, update {update is not None}")
    rows = _check_fields(g, fields, roles, names)
    if [t.strong() for t in edge_fn.in_types] != [t.strong() for t in rows]:
        raise ShapeError("propagate: edge function binders do not match the field rows")
    msgs = edge_fn.out_types
    if len(msgs) != len(reduce_by):
        raise ShapeError(f"propagate: reduce_by names {len(reduce_by)} outputs, the edge "
                         f"function returns {len(msgs)} messages")
    return [TensorType(((g.num_src if by == "src" else g.num_dst),)
                       + _reduced_type(reducer, [m], "propagate").shape, m.strong().dtype)
            for m, by in zip(msgs, reduce_by)]


def _check_empty(reducer, m: TensorType, name: str) -> None:
    """`empty=` must be representable in the message dtype (an int row cannot hold inf)."""
    e = getattr(reducer, "empty", None)
    if e is None or m.dtype.is_float:
        return
    info = np.iinfo(m.dtype.np) if m.dtype.name != "bool" else np.iinfo(np.uint8)
    if not (e == e and abs(e) != float("inf") and float(e).is_integer()
            and info.min <= e <= info.max and m.dtype.name != "bool"):
        raise DTypeError(f"{name}: {reducer.name}(empty={e!r}) over {m} messages: an empty "
                         f"row of {m.dtype} cannot hold {e!r}; give an empty= that {m.dtype} "
                         "holds, or cast the message to a float")


def _update_types(update, rows, roles, outs):
    dst = [t for t, r in zip(rows, roles) if r == "dst"]
    params = [t for t, r in zip(rows, roles) if r == "param"]
    want = [t.strong() for t in dst + outs + params]
    if [t.strong() for t in update.in_types] != want:
        raise ShapeError("propagate: update binders do not match (dst rows, aggregated, params)"
                         f": {', '.join(map(str, update.in_types))} vs "
                         f"{', '.join(map(str, want))}")
    return [t.strong() for t in update.out_types]


def propagate_impl_rule(graph, *fields, edge_fn, reducer, roles, names, reduce_by, update):
    graph.ensure_valid()  # validate="none" promised validity; check it once before use
    row_ptr, col_idx = graph.resolve_csr()
    counts = np.diff(row_ptr)
    dst_of_edge = np.repeat(np.arange(graph.num_dst), counts)
    perm = graph.edge_perm
    args, batched = [], []
    for x, role in zip(fields, roles):
        x = np.asarray(x)
        if role == "src":
            x = x[col_idx]
        elif role == "dst":
            x = x[dst_of_edge]
        elif role == "edge" and perm is not None:
            x = x[perm]
        args.append(x)
        batched.append(role != "param")
    msgs = eval_rows(edge_fn, args, batched, len(col_idx))
    if reduce_by == "edge":
        return msgs if perm is None else [_unpermute(m, perm) for m in msgs]
    if isinstance(reduce_by, tuple):   # each output grouped by its own side
        sides = {"dst": (dst_of_edge, graph.num_dst), "src": (np.asarray(col_idx), graph.num_src)}
        return [_reduce(reducer, [m], sides[by][0], sides[by][1],
                        np.bincount(sides[by][0], minlength=sides[by][1]))
                for m, by in zip(msgs, reduce_by)]
    seg, n = {"dst": (dst_of_edge, graph.num_dst), "src": (np.asarray(col_idx), graph.num_src),
              "all": (np.zeros(len(col_idx), np.int64), 1)}[reduce_by]
    seg_counts = np.bincount(seg, minlength=n)
    k = reducer.arity
    outs = [_reduce(reducer, msgs[i:i + k], seg, n, seg_counts)
            for i in range(0, len(msgs), k)]
    if reducer.stats:
        outs += _softmax_stats(msgs[0], seg, n, seg_counts)
    if update is not None:
        outs = _apply_update(update, fields, roles, outs, reduce_by)
    return [o[0] for o in outs] if reduce_by == "all" else outs


def _softmax_stats(score, seg, n, counts) -> list:
    """online_softmax's per-row statistics: the row max of the scores (0 for an empty row)
    and mass = sum exp(score - max) (NaN where every score is -inf), as the reducer keeps;
    half-precision scores accumulate in float32 and round once."""
    dtype, score = score.dtype, wide(score)
    top = np.full((n,) + score.shape[1:], -np.inf, score.dtype)
    np.maximum.at(top, seg, score)
    top[counts == 0] = 0
    mass = np.zeros((n,) + score.shape[1:], score.dtype)
    with np.errstate(invalid="ignore"):
        np.add.at(mass, seg, np.exp(score - top[seg]))
    return [top.astype(dtype, copy=False), mass.astype(dtype, copy=False)]


def _unpermute(m, perm):
    out = np.empty_like(m)
    out[perm] = m
    return out


def _reduce(reducer, parts, seg, n, counts):
    if reducer.builtin:
        return segment_reduce(reducer.name, parts, seg, n, counts,
                              getattr(reducer, "empty", None))
    return _fold_user(reducer, parts[0], seg, n)


def _fold_user(reducer, m, seg, n):
    """Fold a user reducer's regions in edge order, all segments advancing together."""
    if reducer.regions is None:
        raise UnsupportedError(f"reducer {reducer.name!r} was not traced", hint="call it "
                               "through tg.propagate or a MessagePassing subclass")
    lift, combine, finalize = reducer.regions
    m = eval_rows(lift, [m], [True], len(m))[0] if lift is not None else m
    order = np.argsort(seg, kind="stable")
    seg_sorted = seg[order]
    starts = np.searchsorted(seg_sorted, np.arange(n))
    counts = np.bincount(seg, minlength=n)
    state = np.broadcast_to(np.asarray(reducer.identity, m.dtype), (n,) + m.shape[1:]).copy()
    for k in range(int(counts.max(initial=0))):
        rows = np.nonzero(counts > k)[0]
        msg = m[order[starts[rows] + k]]
        state[rows] = eval_rows(combine, [state[rows], msg], [True, True], len(rows))[0]
    if finalize is not None:
        state = eval_rows(finalize, [state], [True], n)[0]
    return state


def _apply_update(update, fields, roles, outs, reduce_by):
    if reduce_by != "dst":
        raise UnsupportedError("propagate: an update function needs reduce_by='dst'")
    dst = [np.asarray(x) for x, r in zip(fields, roles) if r == "dst"]
    params = [np.asarray(x) for x, r in zip(fields, roles) if r == "param"]
    n = outs[0].shape[0]
    batched = [True] * (len(dst) + len(outs)) + [False] * len(params)
    return eval_rows(update, dst + outs + params, batched, n)


def map_rows_abstract_eval_rule(*xs, fn: ClosedProgram, batched: tuple):
    leads = {x.shape[0] for x, b in zip(xs, batched) if b}
    if len(leads) != 1:
        raise ShapeError(f"map_rows: batched operands need one common leading axis, found "
                         f"{', '.join(map(str, xs))}")
    lead = leads.pop()
    want = [row_type(x) if b else x for x, b in zip(xs, batched)]
    if [t.strong() for t in fn.in_types] != [t.strong() for t in want]:
        raise ShapeError("map_rows: function binders do not match the operand rows")
    return [TensorType((lead,) + t.shape, t.dtype) for t in fn.out_types]


def map_rows_impl_rule(*xs, fn, batched):
    n = next(np.shape(x)[0] for x, b in zip(xs, batched) if b)
    return eval_rows(fn, xs, batched, n)


def _edge_count(g) -> int:
    # a radius relation counts its edges once resolved (the max/min VJP asks for edge ids
    # of a concrete relation while tracing; its CSR kernels resolve it anyway)
    return g.num_edges if g.num_edges is not None else len(g.resolve_csr()[1])


def edge_ids_abstract_eval_rule(g):
    return [TensorType((g.num_edges,), int64)]


def degrees_abstract_eval_rule(g, *, by):
    return [TensorType((g.num_src if by == "src" else g.num_dst,), int64)]


abstract_eval_rules.update({
    propagate_p: propagate_abstract_eval_rule, map_rows_p: map_rows_abstract_eval_rule,
    edge_ids_p: edge_ids_abstract_eval_rule, degrees_p: degrees_abstract_eval_rule})
impl_rules.update({
    propagate_p: propagate_impl_rule, map_rows_p: map_rows_impl_rule,
    edge_ids_p: lambda g: [np.arange(_edge_count(g), dtype=np.int64)],
    degrees_p: lambda g, *, by: [np.asarray(g.degrees(by=by), np.int64)]})

__all__ = ["propagate_p", "map_rows_p", "edge_ids_p", "degrees_p", "eval_closed"]
