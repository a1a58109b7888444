"""core: self-loop edits of a relation in PyG's edge order (remove_self_loops,
add_remaining_self_loops), on user-ordered (src, dst) edge arrays.

Each function returns the new edges in user order and `edge_ids`: for every new edge, the id
of the edge of the input relation it comes from, or -1 for a loop that did not exist, so that
an edge field follows as `w[edge_ids]` (with a fill value where edge_ids is -1).
"""
from __future__ import annotations

import numpy as np

_I64 = np.dtype(np.int64)


def without_loops(src: np.ndarray, dst: np.ndarray) -> tuple:
    """(src, dst, edge_ids) of the edges with src != dst, in their original order."""
    keep = np.flatnonzero(src != dst).astype(_I64, copy=False)
    return src[keep], dst[keep], keep


def remaining_loops(src: np.ndarray, dst: np.ndarray, num_loops: int) -> tuple:
    """(src, dst, edge_ids) of PyG's add_remaining_self_loops: the non-loop edges in their
    order, then one loop i -> i for i = 0..num_loops-1. Loop i's id is the last self edge
    i -> i of the input in edge order (PyG keeps its attribute: `loop_attr[i] = attr[e]`,
    the last assignment winning), or -1 where node i had none."""
    s, d, keep = without_loops(src, dst)
    loop_ids = np.full(num_loops, -1, dtype=_I64)
    # the last loop of each node: the first one of the reversed list (np.unique's index)
    loops = np.flatnonzero(src == dst).astype(_I64, copy=False)[::-1]
    nodes, first = np.unique(src[loops], return_index=True)
    loop_ids[nodes.astype(_I64, copy=False)] = loops[first]
    ring = np.arange(num_loops, dtype=_I64)
    return (np.concatenate([s.astype(_I64, copy=False), ring]),
            np.concatenate([d.astype(_I64, copy=False), ring]),
            np.concatenate([keep, loop_ids]))
