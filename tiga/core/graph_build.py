"""core: vectorised CSR construction for relations (implicit kinds, COO sorting, cat, transpose).

Everything here is numpy over whole arrays; no loop runs per edge or per destination.
"""
from __future__ import annotations

import numpy as np

_I64 = np.int64


def ranges_csr(starts: np.ndarray, lengths: np.ndarray) -> tuple:
    """CSR where destination r reads the contiguous sources starts[r] .. starts[r]+lengths[r]-1
    (dense, triangular and cu_seqlens relations are all of this form)."""
    lengths = np.asarray(lengths, dtype=_I64)
    row_ptr = np.zeros(len(lengths) + 1, dtype=_I64)
    np.cumsum(lengths, out=row_ptr[1:])
    num_edges = int(row_ptr[-1])
    # position p in row r holds starts[r] + (p - row_ptr[r])
    shift = np.asarray(starts, dtype=_I64) - row_ptr[:-1]
    col_idx = np.arange(num_edges, dtype=_I64)
    col_idx += np.repeat(shift, lengths)
    return row_ptr, col_idx


def dense_csr(num_src: int, num_dst: int) -> tuple:
    row_ptr = np.arange(num_dst + 1, dtype=_I64) * num_src
    col_idx = np.tile(np.arange(num_src, dtype=_I64), num_dst)
    return row_ptr, col_idx


def triangular_csr(n: int) -> tuple:
    return ranges_csr(np.zeros(n, dtype=_I64), np.arange(1, n + 1, dtype=_I64))


def cu_seqlens_csr(cu_seqlens: tuple, causal: bool) -> tuple:
    cu = np.asarray(cu_seqlens, dtype=_I64)
    seq_len = np.diff(cu)
    starts = np.repeat(cu[:-1], seq_len)
    if causal:
        lengths = np.arange(1, int(cu[-1]) + 1, dtype=_I64) - starts
    else:
        lengths = np.repeat(seq_len, seq_len)
    return ranges_csr(starts, lengths)


def cu_seqlens_num_edges(cu_seqlens: tuple, causal: bool) -> int:
    lens = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True)]
    return sum(n * (n + 1) // 2 for n in lens) if causal else sum(n * n for n in lens)


def stencil_num_edges(shape: tuple, offsets: tuple, periodic: bool) -> int:
    """Edge count from the lattice alone: per offset, the points whose neighbour is inside."""
    points = int(np.prod(shape, dtype=object))
    if periodic or points == 0:
        return points * len(offsets)
    total = 0
    for off in offsets:
        inside = 1
        for n, o in zip(shape, off, strict=True):
            inside *= max(0, n - abs(o))
        total += inside
    return total


def implicit_degrees(kind: str, params: dict, by: str) -> np.ndarray:
    """int64 degrees of an implicit relation from its formula (no CSR): per destination
    (by='dst') or per source (by='src'); the output is the only array of its size."""
    if kind == "dense":
        rows, other = ((params["num_dst"], params["num_src"]) if by == "dst" else
            (params["num_src"], params["num_dst"]))
        return np.full(rows, other, dtype=_I64)
    if kind == "triangular":   # destination i reads 0..i; source s is read by s..n-1
        n = params["n"]
        return (np.arange(1, n + 1, dtype=_I64) if by == "dst" else
            np.arange(n, 0, -1, dtype=_I64))
    if kind == "cu_seqlens":
        cu = np.asarray(params["cu_seqlens"], dtype=_I64)
        lens = np.diff(cu)
        length = np.repeat(lens, lens)
        if not params["causal"]:
            return length
        pos = np.arange(int(cu[-1]), dtype=_I64) - np.repeat(cu[:-1], lens)
        return pos + 1 if by == "dst" else length - pos
    return _stencil_degrees(params["shape"], params["offsets"], params["periodic"], by)


def _stencil_degrees(shape: tuple, offsets: tuple, periodic: bool, by: str) -> np.ndarray:
    """Per point, the offsets whose neighbour (by='dst': p + off; by='src': the reader
    p - off) is inside: one box per offset, broadcast from per-axis masks."""
    points = int(np.prod(shape, dtype=object))
    if periodic:
        return np.full(points, len(offsets), dtype=_I64)
    out = np.zeros(shape, dtype=_I64)
    sign = 1 if by == "dst" else -1
    for off in offsets:
        box = np.ones((1,) * len(shape), dtype=bool)
        for axis, (n, o) in enumerate(zip(shape, off)):
            c = np.arange(n) + sign * o
            box = box & _axis_mask((c >= 0) & (c < n), axis, len(shape))
        out += box
    return out.reshape(points)


def _axis_mask(mask: np.ndarray, axis: int, rank: int) -> np.ndarray:
    return mask.reshape((1,) * axis + (len(mask),) + (1,) * (rank - axis - 1))


def _axis_table(table: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis (n, offsets) table shaped to broadcast over the (*shape, offsets) grid."""
    return table.reshape((1,) * axis + (table.shape[0],) + (1,) * (rank - axis - 1) + (-1,))


def stencil_csr(shape: tuple, offsets: tuple, periodic: bool) -> tuple:
    """Destination-major, offset-ordered neighbours of every lattice point (C order).

    Works on the (*shape, offsets) grid, which in C order is exactly dst-major then offset
    order; per-axis tables broadcast into it, so no coordinate array is materialised."""
    points, rank = int(np.prod(shape, dtype=object)), len(shape)
    if points == 0 or not offsets:
        return np.zeros(points + 1, dtype=_I64), np.zeros(0, dtype=_I64)
    off = np.asarray(offsets, dtype=_I64).reshape(len(offsets), rank)
    strides = np.cumprod((1,) + tuple(shape[:0:-1]), dtype=_I64)[::-1]
    src = np.zeros(shape + (len(offsets),), dtype=_I64)
    inside = None if periodic else np.ones(src.shape, dtype=bool)
    for axis, n in enumerate(shape):
        c = np.arange(n, dtype=_I64)[:, None] + off[None, :, axis]
        if periodic:
            c %= n
        else:
            inside &= _axis_table((c >= 0) & (c < n), axis, rank)
        src += _axis_table(c * strides[axis], axis, rank)
    src = src.reshape(points, len(offsets))
    if periodic:
        return np.arange(points + 1, dtype=_I64) * len(offsets), src.reshape(-1)
    inside = inside.reshape(points, len(offsets))
    row_ptr = np.zeros(points + 1, dtype=_I64)
    np.cumsum(np.count_nonzero(inside, axis=1), out=row_ptr[1:])
    return row_ptr, src[inside]


def coo_to_csr(src: np.ndarray, dst: np.ndarray, num_dst: int, index_dtype: np.dtype) -> tuple:
    """Stable sort by destination; safe on out-of-range ids (they are caught by validation)."""
    edge_perm = _stable_order(dst)
    sorted_dst = dst[edge_perm]
    # searchsorted (not bincount) so that unvalidated negative or huge ids cannot crash
    row_ptr = np.searchsorted(sorted_dst, np.arange(num_dst + 1, dtype=_I64), side="left")
    row_ptr = row_ptr.astype(_I64, copy=False)
    col_idx = np.ascontiguousarray(src[edge_perm], dtype=index_dtype)
    return row_ptr, col_idx, edge_perm


def dst_of_edges(row_ptr: np.ndarray, dtype=_I64) -> np.ndarray:
    """Destination id of every CSR position."""
    return np.repeat(np.arange(len(row_ptr) - 1, dtype=dtype), np.diff(row_ptr))


def transpose_rows(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm,
                   index_dtype: np.dtype) -> tuple:
    """The transposed CSR over the sources that have edges only: (row_ids, row_ptr_t,
    col_idx_t, perm), source row_ids[k] owning positions row_ptr_t[k]:row_ptr_t[k+1].

    Every array is sized by the edges (a relation over 2**31 sources with 3 edges gets
    3-entry arrays); perm maps user edge order into it (field_t = field[perm])."""
    # (int32 destination ids where they fit: half the bytes to write, permute and gather; a
    # first tg.grad transposes its relation here, on memory it touches for the first time)
    dst = dst_of_edges(row_ptr, np.int32 if len(row_ptr) <= 1 << 31 else _I64)
    src = np.asarray(col_idx)
    if edge_perm is not None:
        # bring both endpoint arrays into user edge order so the stable sort keeps it
        user_src = np.empty_like(src)
        user_src[edge_perm] = src
        user_dst = np.empty_like(dst)
        user_dst[edge_perm] = dst
        src, dst = user_src, user_dst
    perm = _stable_order(src)
    counts = _source_counts(src)
    if counts is not None:      # (counted: no gather of the sorted ids to find the runs)
        row_ids = np.flatnonzero(counts).astype(_I64, copy=False)
        row_ptr_t = np.zeros(len(row_ids) + 1, dtype=_I64)
        np.cumsum(counts[row_ids], out=row_ptr_t[1:])
    else:
        sorted_src = src[perm]
        starts = np.flatnonzero(np.diff(sorted_src, prepend=-1) if len(src) else sorted_src)
        row_ids = sorted_src[starts].astype(_I64, copy=False)
        row_ptr_t = np.append(starts, len(src)).astype(_I64, copy=False)
    col_idx_t = np.ascontiguousarray(dst[perm], dtype=index_dtype)
    return row_ids, row_ptr_t, col_idx_t, perm


def _source_counts(src: np.ndarray):
    """Edges per source id (np.bincount) where the ids are non-negative integers not many
    more than the edges (the arrays stay sized by the edges), else None."""
    if not len(src) or src.dtype.kind not in "iu":
        return None
    lo, hi = int(src.min()), int(src.max())
    if lo < 0 or hi >= 2 * len(src) + (1 << 16):
        return None
    return np.bincount(src.astype(np.intp, copy=False), minlength=hi + 1)


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") as int64, by a least-significant-digit radix sort
    over 16-bit digits for non-negative integer keys: numpy's stable argsort of a uint16
    array is a linear radix sort, of an int64 one a timsort (7x slower at 512K edges over
    32K sources, one digit; a first tg.grad transposes its relation here)."""
    n = len(keys)
    if n > 1 << 12 and keys.dtype.kind in "iu":
        lo, hi = int(keys.min()), int(keys.max())
        if lo >= 0:
            perm = None
            for shift in range(0, max(hi.bit_length(), 1), 16):
                digit = keys if perm is None else keys[perm]
                # (the uint16 cast keeps the low 16 bits: no shifted copy for the first digit)
                digit = digit >> shift if shift else digit
                order = np.argsort(digit.astype(np.uint16), kind="stable")
                perm = order if perm is None else perm[order]
            return perm.astype(_I64, copy=False)
    return np.argsort(keys, kind="stable").astype(_I64, copy=False)


def expand_rows(row_ids: np.ndarray, row_ptr_t: np.ndarray, num_rows: int) -> np.ndarray:
    """The full row_ptr (num_rows + 1 entries) of a CSR stored over `row_ids` only."""
    counts = np.zeros(num_rows + 1, dtype=_I64)
    counts[row_ids + 1] = np.diff(row_ptr_t)
    return np.cumsum(counts, out=counts)


def transpose_csr(row_ptr: np.ndarray, col_idx: np.ndarray, edge_perm, num_src: int,
                  index_dtype: np.dtype) -> tuple:
    """Source-major CSR of a valid relation and the permutation from user edge order into it.

    Returns (row_ptr_t, col_idx_t, perm): field_t = field[perm] for an edge field in user order.
    """
    row_ids, rp, col_idx_t, perm = transpose_rows(row_ptr, col_idx, edge_perm, index_dtype)
    return expand_rows(row_ids, rp, num_src), col_idx_t, perm


def cat_csr(parts: list, index_dtype: np.dtype) -> tuple:
    """Block-diagonal CSR of parts [(row_ptr, col_idx, edge_perm, num_src), ...] with the
    composed edge permutation (None when every part keeps CSR order)."""
    row_ptrs, cols, perms = [np.zeros(1, dtype=_I64)], [], []
    src_off = edge_off = 0
    any_perm = any(p[2] is not None for p in parts)
    for row_ptr, col_idx, edge_perm, num_src in parts:
        num_edges = len(col_idx)
        row_ptrs.append(np.asarray(row_ptr[1:], dtype=_I64) + edge_off)
        # cast before adding: numpy refuses Python-int offsets that overflow the array dtype
        cols.append(np.asarray(col_idx).astype(index_dtype) + index_dtype.type(src_off))
        if any_perm:
            local = np.arange(num_edges, dtype=_I64) if edge_perm is None else edge_perm
            perms.append(local + edge_off)
        src_off += num_src
        edge_off += num_edges
    col_idx = np.concatenate(cols) if cols else np.zeros(0, dtype=index_dtype)
    edge_perm = np.concatenate(perms) if any_perm else None
    return np.concatenate(row_ptrs), col_idx.astype(index_dtype, copy=False), edge_perm


def freeze(*arrays):
    """Mark arrays the graph created itself read-only, so cached results cannot be mutated."""
    for a in arrays:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return arrays
