"""autodiff: batching rules of propagate, map_rows and the generated relations.

A propagate over batched fields stays one propagate: each batched field moves its batch
axis behind the entity axis, so an edge sees rows `(B, ...)` and the edge function is
batched on its rows; the reducer folds every instance's messages at once (the batch is
part of the feature axis), and the results move the batch back in front.
"""
from __future__ import annotations

from ...core.errors import UnsupportedError
from ...core.prims.generated import knn_p, radius_p
from ...core.prims.graph import degrees_p, edge_ids_p, map_rows_p, propagate_p
from ...trace.tracer import bind
from ..batching import batch_closed, batch_rules, move_axis


def _entity_rows(values, batched, roles):
    """Field operands with the batch behind the entity axis; params keep it in front."""
    return [move_axis(v, 0, 1) if b and r != "param" else v
            for v, b, r in zip(values, batched, roles)]


def _force_messages(reducer, n_msgs, reduce_by):
    """Which messages must carry the batch: all of them (so score and value agree), but an
    arg-reducer's id part stays one id per edge."""
    if reduce_by != "edge" and reducer.is_arg:
        return [k % 2 == 0 for k in range(n_msgs)]
    return [True] * n_msgs


def propagate_batch_rule(ins, batched, size, *, edge_fn, reducer, roles, names, reduce_by,
                         update):
    graph, fields, fb = ins[0], ins[1:], batched[1:]
    if batched[0]:
        raise UnsupportedError("vmap over relations", hint="relations are never batched; "
                               "batch graphs as one disjoint union (tg.Graph.cat)")
    moved = _entity_rows(fields, fb, roles)
    n_msgs = len(edge_fn.program.outs)
    edge_b, _ = batch_closed(edge_fn, list(fb), size,
                             _force_messages(reducer, n_msgs, reduce_by))
    new_update = None
    if update is not None:
        dst = [b for b, r in zip(fb, roles) if r == "dst"]
        params = [b for b, r in zip(fb, roles) if r == "param"]
        n_agg = len(update.in_types) - len(dst) - len(params)
        new_update, out_b = batch_closed(update, dst + [True] * n_agg + params, size,
                                         [True] * len(update.program.outs))
    outs = bind(propagate_p, graph, *moved, edge_fn=edge_b, reducer=reducer, roles=roles,
                names=names, reduce_by=reduce_by, update=new_update)
    lead = reduce_by != "all"
    return [move_axis(o, 1, 0) if lead else o for o in outs], [True] * len(outs)


def map_rows_batch_rule(ins, vmapped, size, *, fn, batched):
    """Row-batched operands that are vmapped put the batch behind their row axis."""
    moved = [move_axis(x, 0, 1) if v and r else x for x, v, r in zip(ins, vmapped, batched)]
    fn_b, _ = batch_closed(fn, list(vmapped), size, [True] * len(fn.program.outs))
    outs = bind(map_rows_p, *moved, fn=fn_b, batched=batched)
    return [move_axis(o, 1, 0) for o in outs], [True] * len(outs)


def _generated_batch_rule(prim):
    def rule(ins, batched, size, **params):
        raise UnsupportedError(f"vmap over the positions of a {prim.name} relation: each "
                               "instance would have its own topology",
                               hint="relations are never batched; build one relation over "
                                    "the union of the point sets")
    return rule


def _relation_only_rule(prim):
    def rule(ins, batched, size, **params):
        raise UnsupportedError(f"vmap over the relation of {prim.name}",
                               hint="relations are never batched")
    return rule


batch_rules[propagate_p] = propagate_batch_rule
batch_rules[edge_ids_p] = _relation_only_rule(edge_ids_p)
batch_rules[degrees_p] = _relation_only_rule(degrees_p)
batch_rules[map_rows_p] = map_rows_batch_rule
batch_rules[radius_p] = _generated_batch_rule(radius_p)
batch_rules[knn_p] = _generated_batch_rule(knn_p)
