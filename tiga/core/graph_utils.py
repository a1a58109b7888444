"""core: relation utilities a GNN user expects: self loops, GCN coefficients, edge_index.

Pure numpy over a relation's resolved CSR; `Graph` exposes them as thin methods. Edge order
follows API.md section 2: an edge field is indexed by the relation's user edge order, and
`edge_perm[p]` names the user edge stored at CSR position p (None: the same order).
"""
from __future__ import annotations

import numpy as np

from . import graph_build as gb
from .errors import GraphValidationError

_I64 = np.int64


def user_order(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm) -> tuple:
    """(src, dst) int64 per edge in user edge order."""
    dst = gb.dst_of_edges(row_ptr)
    src = np.asarray(col_idx, dtype=_I64)
    if edge_perm is None:
        return src, dst
    user_src, user_dst = np.empty_like(src), np.empty_like(dst)
    user_src[edge_perm] = src
    user_dst[edge_perm] = dst
    return user_src, user_dst


def to_edge_index(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm) -> np.ndarray:
    """(2, E) int64 [source; target] in user edge order: the inverse of from_edge_index."""
    src, dst = user_order(row_ptr, col_idx, edge_perm)
    return np.stack([src, dst])


def self_loops_csr(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm, num_loops: int,
                   index_dtype: np.dtype) -> tuple:
    """(row_ptr, col_idx, edge_perm) of A + I over the first `num_loops` destinations.

    User edge order: the original edges keep ids 0..E-1, loop i gets id E + i (as PyG's
    add_self_loops appends them). Storage: each loop is the last edge of its row.
    """
    num_dst, num_edges = len(row_ptr) - 1, len(col_idx)
    has_loop = np.zeros(num_dst, dtype=_I64)
    has_loop[:num_loops] = 1
    new_ptr = row_ptr + np.concatenate([[0], np.cumsum(has_loop)])
    # old CSR position p of row r moves to p + (loops in rows before r) = p + min(r, L)
    shift = np.minimum(gb.dst_of_edges(row_ptr), num_loops)
    old_pos = np.arange(num_edges, dtype=_I64) + shift
    loop_pos = new_ptr[1:num_loops + 1] - 1
    new_col = np.empty(num_edges + num_loops, dtype=index_dtype)
    new_col[old_pos] = col_idx
    new_col[loop_pos] = np.arange(num_loops, dtype=index_dtype)
    perm = np.empty(num_edges + num_loops, dtype=_I64)
    perm[old_pos] = np.arange(num_edges, dtype=_I64) if edge_perm is None else edge_perm
    perm[loop_pos] = np.arange(num_edges, num_edges + num_loops, dtype=_I64)
    if np.array_equal(perm, np.arange(len(perm), dtype=_I64)):
        perm = None   # storage order is already user order (e.g. no edges)
    return new_ptr.astype(_I64, copy=False), new_col, perm


def gcn_norm(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm, num_src: int,
             num_dst: int, dtype=np.float64) -> np.ndarray:
    """1 / sqrt(deg(i) * deg(j)) for each edge j -> i, in user edge order.

    deg is the in-degree (edges arriving at a node over this relation), for the target i and
    for the source j alike, as PyG's gcn_norm computes it; a zero degree gives 0.
    """
    if num_src != num_dst:
        raise GraphValidationError(
            f"gcn_norm: the relation has num_src={num_src} and num_dst={num_dst}, expected "
            "one node set (num_src == num_dst): the source's degree is its in-degree")
    deg = np.diff(row_ptr).astype(np.float64)
    with np.errstate(divide="ignore"):
        inv_sqrt = np.where(deg > 0, 1.0 / np.sqrt(deg), 0.0)
    coeff = inv_sqrt[gb.dst_of_edges(row_ptr)] * inv_sqrt[np.asarray(col_idx, dtype=_I64)]
    if edge_perm is not None:
        user = np.empty_like(coeff)
        user[edge_perm] = coeff
        coeff = user
    return coeff.astype(dtype, copy=False)
