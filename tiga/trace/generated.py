"""trace: radius/knn on traced coordinates stay symbolic; the edge fields of generated relations.

A propagate over a generated relation reads two hidden fields: the source coordinates
(`src._tg_pos`) and the destination coordinates (`dst._tg_qpos`). `edge.displacement`
(`p_src - p_dst`) and `edge.distance` are ordinary traced math on them, so gradients with
respect to the coordinates flow through the propagate's own VJP on the selected topology.
"""
from __future__ import annotations

from ..core import graph as core_graph
from ..core.prims.generated import knn_p, radius_p
from . import math as tm
from .tracer import Tracer, bind

POS, QPOS = "_tg_pos", "_tg_qpos"
GENERATED_KINDS = ("radius", "knn")


def _bind(kind: str, positions, query, **params):
    prim = radius_p if kind == "radius" else knn_p
    args = (positions,) if query is None else (positions, query)
    graph = bind(prim, *args, **params)
    # the coordinates of this traced relation, found again by the propagates that read it
    table = graph.builder.__dict__.setdefault("_tg_generated", {})
    table[id(graph.var)] = (graph, positions, positions if query is None else query)
    return graph


core_graph.generated_hooks["traced"] = lambda v: isinstance(v, Tracer)
core_graph.generated_hooks["bind"] = _bind


def hidden_fields(graph) -> dict | None:
    """{"src": {POS: ...}, "dst": {QPOS: ...}} for a generated relation, else None."""
    if isinstance(graph, Tracer):
        if getattr(graph.aval, "kind", None) not in GENERATED_KINDS:
            return None
        found = graph.builder.__dict__.get("_tg_generated", {}).get(id(graph.var))
        if found is None:
            return None
        _, pos, qpos = found
        return {"src": {POS: pos}, "dst": {QPOS: qpos}}
    if getattr(graph, "kind", None) not in GENERATED_KINDS:
        return None
    pos, query = graph.params["inputs"]
    return {"src": {POS: pos}, "dst": {QPOS: pos if query is None else query}}


def edge_geometry(src_fields: dict, dst_fields: dict) -> dict:
    """Lazy edge attributes computed from the hidden coordinate rows of one edge."""
    if POS not in src_fields or QPOS not in dst_fields:
        return {}
    cache = {}

    def displacement():
        if "d" not in cache:
            cache["d"] = tm.subtract(src_fields[POS], dst_fields[QPOS])
        return cache["d"]

    def distance():
        if "r" not in cache:
            d = displacement()
            cache["r"] = tm.sqrt(tm.sum(tm.multiply(d, d), axis=-1))
        return cache["r"]

    return {"displacement": displacement, "distance": distance}
