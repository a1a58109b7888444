"""runtime: the arrays a computed (non-CSR) kernel walk reads, and the row offsets its row
chunks are cut by.

Implicit relations walked natively bind small tables only: O(1) parameters, or O(K) per
cu_seqlens sequence. A stencil's edge ids are computed in the kernel (lower/llvm/walks.py),
so nothing per lattice point exists. Walks by source (lower/llvm/walks_transposed.py) bind
the same tables; a CSR whose sources are sparse binds its transposed CSR over the sources
with edges only (Graph.transpose_rows), every array sized by the edges.

Row chunks need row offsets. Where every row costs about the same (dense, stencil, a sparse
transposed CSR whose rows are nearly all empty) they are a `RowOffsets`: the row count and
the edge total, no array; the others are O(rows) int64 arrays, never O(edges).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..calls.threads import row_chunks

_I64 = np.int64


@dataclass(frozen=True)
class RowOffsets:
    """A row_ptr known only at its ends (rows + 1 entries, first 0, last `edges`): cut into
    chunks of the same rows (the walk's rows cost about the same)."""

    rows: int
    edges: int

    def __len__(self) -> int:
        return self.rows + 1

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)) and int(i) in (0, -self.rows - 1):
            return 0
        if isinstance(i, (int, np.integer)) and int(i) in (-1, self.rows):
            return self.edges
        raise IndexError(f"RowOffsets: only the first and last offsets are known, not {i!r}")


def chunks_of(row_ptr, threads: int, partition: str, per_thread: int) -> list:
    """row_chunks, cutting computed offsets by rows (they have no per-row offsets)."""
    if isinstance(row_ptr, RowOffsets):
        partition = "row-balanced"
    return row_chunks(row_ptr, threads, partition, per_thread)


def implicit_tables(graph, relation: tuple) -> tuple:
    """({slot: array}, row offsets) of a computed walk (abi.relation_descriptor)."""
    kind, p, i64 = relation[0], graph.params, _I64
    if kind in ("dense", "dense_t"):
        rows = graph.num_dst if kind == "dense" else graph.num_src
        params = [graph.num_src] + ([graph.num_dst] if kind == "dense_t" else [])
        return {"walk_params": np.array(params, i64)}, RowOffsets(rows, graph.num_edges)
    if kind in ("stencil", "stencil_t"):
        return {}, RowOffsets(graph.num_dst, graph.num_edges)
    if kind == "triangular":
        r = np.arange(graph.num_dst + 1, dtype=i64)
        return {}, r * (r + 1) // 2
    if kind == "triangular_t":   # source s is read by destinations s..n-1
        n = graph.num_src
        lens = np.arange(n, 0, -1, dtype=i64)
        return {"walk_params": np.array([n], i64)}, _offsets(lens)
    if kind in ("cu_seqlens", "cu_seqlens_t"):
        return _sequence_tables(p["cu_seqlens"], relation[1], kind == "cu_seqlens_t")
    if kind == "csr_rows":
        row_ids, rp, ci, perm = graph.transpose_rows()
        arrays = {"row_ptr": np.ascontiguousarray(rp, dtype=i64),
                  "col_idx": np.ascontiguousarray(ci, dtype=graph.index_dtype.np),
                  "row_ids": np.ascontiguousarray(row_ids, dtype=i64),
                  "walk_params": np.array([len(row_ids)], i64),
                  "edge_perm": np.ascontiguousarray(perm, dtype=i64)}
        return arrays, RowOffsets(graph.num_src, graph.num_edges)
    raise ValueError(f"no walk tables for the relation walk {relation!r}")


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=_I64)
    np.cumsum(lengths, out=out[1:])
    return out


def _sequence_tables(cu_seqlens, causal: bool, by_source: bool) -> tuple:
    """cu_ext (cu with its last entry repeated), seq_edges (edges before each sequence) and
    the K; row offsets over destinations (forward) or sources (by_source)."""
    cu = np.asarray(cu_seqlens, dtype=_I64)
    lens = np.diff(cu)
    per_seq = lens * (lens + 1) // 2 if causal else lens * lens
    seq_edges = _offsets(per_seq)
    n = int(cu[-1])
    pos = np.arange(n, dtype=_I64) - np.repeat(cu[:-1], lens)     # index within its sequence
    if not causal:
        row_len = np.repeat(lens, lens)
    elif by_source:      # source i of a sequence is read by destinations i..len-1
        row_len = np.repeat(lens, lens) - pos
    else:
        row_len = pos + 1
    tables = {"walk_params": np.array([len(cu) - 1], _I64),
              "cu_ext": np.concatenate([cu, cu[-1:]]), "seq_edges": seq_edges}
    return tables, _offsets(row_len)
