"""core: generated-relation primitives: radius and knn over (possibly traced) coordinates.

`radius(positions[, query])` and `knn(positions[, query])` produce a relation. Topology
selection is discrete, so the primitives are NONDIFF; gradients with respect to the
coordinates flow through the hidden position fields every propagate over a generated
relation reads (trace/message_passing.py: edge.displacement, edge.distance).
"""
from __future__ import annotations

from ..dtypes import int64
from ..errors import ShapeError
from ..graph import Graph
from ..primitive import abstract_eval_rules, impl_rules, primitive
from ..types import Dim, GraphType, TensorType

radius_p = primitive("radius", "graph")
knn_p = primitive("knn", "graph")


def _check(pos: TensorType, query: TensorType | None, name: str):
    if not isinstance(pos, TensorType) or pos.ndim != 2 or not pos.dtype.is_float:
        raise ShapeError(f"{name}: positions must be a float (num_points, dims) array, found "
                         f"{pos}")
    if query is not None and (query.ndim != 2 or query.shape[1] != pos.shape[1]
                              or query.dtype != pos.dtype):
        raise ShapeError(f"{name}: query must be a (num_queries, {pos.shape[1]}) "
                         f"{pos.dtype.name} array, found {query}")
    return pos.shape[0], (pos if query is None else query).shape[0], pos.shape[1]


def radius_abstract_eval_rule(pos, query=None, *, cutoff, loop, max_neighbors):
    m, n, d = _check(pos, query, "radius")
    return [GraphType("radius", m, n, Dim("E"), int64, d)]


def knn_abstract_eval_rule(pos, query=None, *, k, loop):
    m, n, d = _check(pos, query, "knn")
    e = n * k if isinstance(n, int) else Dim("E")
    return [GraphType("knn", m, n, e, int64, d)]


def radius_impl_rule(pos, query=None, *, cutoff, loop, max_neighbors):
    return [Graph.radius(pos, cutoff, query=query, loop=loop, max_neighbors=max_neighbors)]


def knn_impl_rule(pos, query=None, *, k, loop):
    return [Graph.knn(pos, k, query=query, loop=loop)]


abstract_eval_rules.update({radius_p: radius_abstract_eval_rule, knn_p: knn_abstract_eval_rule})
impl_rules.update({radius_p: radius_impl_rule, knn_p: knn_impl_rule})

__all__ = ["radius_p", "knn_p"]
