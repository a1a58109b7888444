"""autodiff: the per-edge order key of the max/min VJP ("the first extremal edge").

The VJP of max/min sends a segment's cotangent to its extremal edge with the smallest edge
id. It needs, per edge, an integer key that increases with the edge id within every segment
(by destination, by source and over all edges). Stored relations use the edge ids
themselves: an int64 array of one id per edge, which scales with the relation's own index
arrays. An implicit relation has no index arrays, and its edge order follows from the
endpoints, so the key is computed on each edge from the ids of its destination and source
(one node-id array, int32 where the ids fit, read as a destination and a source field) and
takes no memory per edge; the key is int32 where every key fits:

- dense, triangular, cu_seqlens and radius (rows in ascending source, one edge per
  (destination, source) pair): key = dst * num_src + src, lexicographic (dst, src), which is
  the edge order;
- stencil: key = dst * K + k, k the edge's offset (edges are destination-major, then in
  offset order). k is read from the flat step src - dst where the steps that the offsets can
  take (periodic: wrapped on any axis) are distinct; else from the destination's lattice
  coordinates (float64 quotients, exact below 2**53 points), each offset's neighbour
  compared with the source. Two offsets that always reach the same neighbour (periodic,
  congruent modulo the shape) make two edges with the same endpoints: the edge ids are used.

Other relations (csr, cat, knn, paged, an edge permutation) keep the edge ids.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...core.prims.graph import edge_ids_p
from ...trace import math as m
from ...trace.math import _typeof
from ...trace.tracer import aval_of, bind

_ENDPOINT_KINDS = ("dense", "triangular", "cu_seqlens", "radius")
_MAX_STEPS = 512      # stencil steps compared per edge (64 offsets in 3-d, periodic)
_INT32_MAX = 2 ** 31 - 1
_INT64_NONE = 2 ** 62


class EdgeKey:
    """Operands (values with their field roles), `key(rows)` -> an edge's key from those
    operands' rows, the key's dtype and `none`, a key above every edge's ("no edge yet")."""

    def __init__(self, values: list, roles: list, key, dtype: str = "int64",
                 none: int = _INT64_NONE):
        self.values, self.roles, self.key = values, roles, key
        self.dtype, self.none = dtype, none


def edge_key(graph) -> EdgeKey:
    """The cheapest exact order key of the relation's edges (see the module docstring)."""
    t = aval_of(graph)
    n_src, n_dst = t.num_src, t.num_dst
    sized = isinstance(n_src, (int, np.integer)) and isinstance(n_dst, (int, np.integer))
    if sized and getattr(graph, "edge_perm", None) is None:
        key = _endpoint_key(graph, t.kind, int(n_src), int(n_dst))
        if key is not None:
            return key
    # (int64 even where the messages are float32: ids past 2**24 would round together)
    return EdgeKey([bind(edge_ids_p, graph)], ["edge"], lambda rows: rows[0])


def _endpoint_key(graph, kind: str, n_src: int, n_dst: int) -> EdgeKey | None:
    if kind in _ENDPOINT_KINDS:
        return _node_key(n_src, n_dst, n_src, lambda d, s: s)
    if kind == "stencil" and hasattr(graph, "params"):
        return _stencil_key(graph.params, n_src, n_dst)
    return None


def _node_key(n_src: int, n_dst: int, per_row: int, within) -> EdgeKey | None:
    """key = dst * per_row + within(dst, src), below n_dst * per_row, from node-id arrays
    (int32 where the ids fit)."""
    top = n_dst * per_row
    if top >= _INT64_NONE:
        return None
    small = max(n_src, n_dst) <= _INT32_MAX
    dst_ids = np.arange(n_dst, dtype=np.int32 if small else np.int64)
    # (one array where the sides are equal; a slice would hand a launcher a view whose
    # buffer is larger than the field)
    src_ids = dst_ids if n_src == n_dst else np.arange(n_src, dtype=dst_ids.dtype)
    dtype, none = ("int32", _INT32_MAX) if top < _INT32_MAX else ("int64", _INT64_NONE)

    def key(rows):
        d, s = (m.convert(r, dtype) for r in rows)
        return m.add(m.multiply(d, per_row), within(d, s))

    return EdgeKey([dst_ids, src_ids], ["dst", "src"], key, dtype, none)


def _stencil_key(params: dict, n_src: int, n_dst: int) -> EdgeKey | None:
    if _twins(params):
        return None
    steps = stencil_steps(params)
    if steps is not None:
        def offset(d, s):
            return _offset_of_step(s, d, steps)
    elif n_dst < 2 ** 53:
        def offset(d, s):
            return _offset_of_coords(s, d, params)
    else:
        return None
    return _node_key(n_src, n_dst, len(params["offsets"]), offset)


def _twins(params: dict) -> bool:
    """Two offsets that reach the same neighbour from every point (equal; periodic: equal
    modulo the shape)."""
    shape = tuple(params["shape"])
    if params["periodic"]:
        seen = [tuple(int(o) % n if n else 0 for o, n in zip(off, shape))
                for off in params["offsets"]]
    else:
        seen = [tuple(int(o) for o in off) for off in params["offsets"]]
    return len(set(seen)) != len(seen)


def stencil_steps(params: dict) -> list | None:
    """[(flat step src - dst, offset index)] for every step an edge of this stencil can
    take, or None when a step does not name one offset (then the edge ids are the key)."""
    shape, offsets = tuple(params["shape"]), params["offsets"]
    strides = np.cumprod((1,) + shape[:0:-1])[::-1]
    found: dict = {}
    for k, off in enumerate(offsets):
        per_axis = []
        for o, n in zip(off, shape):
            if params["periodic"]:
                r = int(o) % n if n else 0     # (x + o) mod n - x is r or r - n
                per_axis.append({r, r - n} if r else {0})
            else:
                per_axis.append({int(o)} if abs(int(o)) < n else set())
        for step in itertools.product(*per_axis):
            flat = int(sum(c * int(s) for c, s in zip(step, strides)))
            if found.setdefault(flat, k) != k:
                return None
    return None if len(found) > _MAX_STEPS else sorted(found.items())


def _offset_of_step(s, d, steps: list):
    """The offset index k of the edge d <- s (its step s - d is one of `steps`)."""
    delta = m.subtract(s, d)
    k = m.zeros_like(delta)
    for flat, index in steps:
        if index:
            k = m.where(m.equal(delta, flat), m.full((), index, _typeof(delta).dtype), k)
    return k


def _offset_of_coords(s, d, params: dict):
    """The offset index k of the edge d <- s: the offset whose neighbour of d (inside the
    lattice, or wrapped) is s. Coordinates are float64 integers: exact below 2**53."""
    shape = tuple(int(n) for n in params["shape"])
    strides = [int(x) for x in np.cumprod((1,) + shape[:0:-1])[::-1]]
    df, sf = m.convert(d, "float64"), m.convert(s, "float64")
    coords = []
    for axis, (n, stride) in enumerate(zip(shape, strides)):
        q = m.floor(m.divide(df, float(stride)))
        coords.append(q if axis == 0 else _mod(q, n))
    k = m.zeros_like(d)
    for index, off in enumerate(params["offsets"]):
        flat, inside = 0.0, None
        for c, o, n, stride in zip(coords, off, shape, strides):
            c = m.add(c, float(o))
            if params["periodic"]:
                c = _mod(c, n)
            else:
                ok = m.logical_and(m.greater_equal(c, 0.0), m.less(c, float(n)))
                inside = ok if inside is None else m.logical_and(inside, ok)
            flat = m.add(flat, m.multiply(c, float(stride)))
        hit = m.equal(flat, sf)
        if inside is not None:
            hit = m.logical_and(hit, inside)
        k = m.where(hit, m.full((), index, _typeof(d).dtype), k)
    return k


def _mod(c, n: int):
    """c mod n for float64 integers c (floor division: the result lies in [0, n))."""
    return m.subtract(c, m.multiply(m.floor(m.divide(c, float(n))), float(n)))


__all__ = ["EdgeKey", "edge_key", "stencil_steps"]
