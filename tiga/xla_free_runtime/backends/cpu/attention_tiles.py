"""runtime: numpy/OpenBLAS tiles of streaming attention (forward, dq, dk/dv) over row ranges.

Arrays arrive head-major as (H, N, D) views of any strides (a permuted (N, H, D) tensor or a
head-major allocation); each tile is packed once and the two products of a tile are batched
matrix products over the heads. Destination row i reads sources lo[i] <= j < hi[i], with lo and
hi nondecreasing, so a block of rows reads one contiguous source range and a tile needs a mask
only where it crosses a range boundary.

Memory: one BLOCK_M x BLOCK_N tile per head and thread plus O(N) per-row statistics; never an
N x N array. Rows with an empty range finalize to 0 (max 0, mass 0), the reducer convention.

These tiles (batched OpenBLAS products, one BLAS thread per tile job, vectorised numpy softmax
update) run float64, head widths that are not a multiple of 16, pruning, and their backward
(dq, dk, dv). float32 with a head width multiple of 16 has LLVM micro-kernels instead
(`lower.llvm.attention` forward, `lower.llvm.attention_backward` backward).
"""
from __future__ import annotations

import threading

import numpy as np

BLOCK_M = 128     # destination rows per tile
BLOCK_N = 256     # source rows per tile


def _blocks(start: int, stop: int, size: int):
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


def _in_range(i0, i1, j0, j1, lo, hi):
    """(i1 - i0, j1 - j0) bool: tile entry (i, j) lies in row i's range; None when all do."""
    if j0 >= lo[i1 - 1] and j1 <= hi[i0]:
        return None
    cols = np.arange(j0, j1)
    return (cols[None, :] >= lo[i0:i1, None]) & (cols[None, :] < hi[i0:i1, None])


def _select(x, ok, fill) -> None:
    """x[:, i, j] = fill where ok[i, j] is False. A select, never `+ -inf` or `* 0`: a masked
    entry must not see a NaN or inf of a row it may not read (NaN - inf, NaN * 0 are NaN)."""
    if ok is not None:
        np.copyto(x, x.dtype.type(fill), where=~ok[None])


def _masked_matmul(a, b, ok):
    """a @ b over (H, M, K) x (H, K, D) where `a` is 0 at the entries ok (M, K) masks out.

    With b finite the plain product is exact (masked terms are 0 * finite = 0). Otherwise a
    masked 0 would meet a NaN or inf of b, so each row contracts only its own allowed range
    (contiguous: lo and hi are nondecreasing), as the reference interpreter never forms it."""
    if ok is None or np.isfinite(b).all():
        return np.matmul(a, b)
    out = np.zeros(a.shape[:2] + b.shape[2:], np.result_type(a, b))
    starts, counts = ok.argmax(axis=1), ok.sum(axis=1)
    for i in np.nonzero(counts)[0]:
        s0, s1 = starts[i], starts[i] + counts[i]
        out[:, i] = np.matmul(a[:, i, None, s0:s1], b[:, s0:s1])[:, 0]
    return out


def _row_blocks(lo, hi, n_dst, weights=True):
    """Destination row blocks, largest work first (threads pull them in order)."""
    blocks = _blocks(0, n_dst, BLOCK_M)
    if weights:
        blocks.sort(key=lambda b: -(hi[b[1] - 1] - lo[b[0]]) if b[1] > b[0] else 0)
    return blocks


def forward(q, k, v, out, top, mass, lo, hi, scale, prune, jobs) -> tuple:
    """out[h, i] = softmax-weighted sum of v over row i's range; top/mass: (H, N) statistics.

    Returns (blocks skipped by pruning, blocks visited)."""
    n = q.shape[1]
    counts = [0, 0]
    dtype = top.dtype

    def run(i0, i1):
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            _forward_block(i0, i1)

    def _forward_block(i0, i1):
        qs = np.ascontiguousarray(q[:, i0:i1]) * dtype.type(scale)
        nh, bm = qs.shape[0], i1 - i0
        m = np.full((nh, bm), -np.inf, dtype)
        ell = np.zeros((nh, bm), dtype)
        acc = np.zeros((nh, bm, v.shape[2]), dtype)
        skipped = visited = 0
        for j0, j1 in _blocks(int(lo[i0]), int(hi[i1 - 1]), BLOCK_N):
            s = np.matmul(qs, k[:, j0:j1].transpose(0, 2, 1))
            ok = _in_range(i0, i1, j0, j1, lo, hi)
            _select(s, ok, -np.inf)
            bmax = s.max(axis=2)
            visited += 1
            if prune is not None and np.all(bmax < m - prune):
                skipped += 1      # approximate: this tile's values are never loaded
                continue
            m_new = np.maximum(m, bmax)
            m_safe = np.where(np.isneginf(m_new), 0, m_new).astype(dtype)
            s -= m_safe[:, :, None]
            np.exp(s, out=s)
            alpha = np.exp(m - m_safe)
            ell *= alpha
            ell += s.sum(axis=2)
            acc *= alpha[:, :, None]
            if acc.shape[2]:
                acc += _masked_matmul(s, v[:, j0:j1], ok)
            m = m_new
        # empty rows finalize to 0; a row whose every score is -inf (or NaN, or has a +inf)
        # is NaN with its top and mass, as the reference's softmax (and torch's) gives
        nonempty = (hi[i0:i1] > lo[i0:i1])[None]
        dead = nonempty & np.isneginf(m)
        out[:, i0:i1] = acc / np.where(nonempty, ell, 1)[:, :, None]
        top[:, i0:i1] = np.where(nonempty, m, 0)
        mass[:, i0:i1] = np.where(dead, np.nan, ell)
        counts[0] += skipped
        counts[1] += visited

    jobs(run, _row_blocks(lo, hi, n))
    return tuple(counts)


def _probabilities(qs, kb, lse_b, i0, i1, j0, j1, lo, hi):
    """(p, ok): p = exp(s - lse), 0 (selected) outside each row's range; ok as _in_range."""
    s = np.matmul(qs, kb.transpose(0, 2, 1))
    s -= lse_b[:, :, None]
    np.exp(s, out=s)
    ok = _in_range(i0, i1, j0, j1, lo, hi)
    _select(s, ok, 0.0)
    return s, ok


def _dscores(p, ok, dob, vb, delta_b):
    """ds = p * (dO v^T - delta), selected to 0 outside the rows' ranges."""
    dp = np.matmul(dob, vb.transpose(0, 2, 1))
    dp -= delta_b[:, :, None]
    dp *= p
    _select(dp, ok, 0.0)
    return dp


def backward_dq(q, k, v, do, lse, delta, dq, lo, hi, scale, jobs) -> None:
    """dq[h, i] = scale * sum_j p_ij (do_i . v_j - delta_i) k_j, recomputing p per tile."""
    dtype = dq.dtype
    sc = dtype.type(scale)

    def run(i0, i1):
        with np.errstate(invalid="ignore", over="ignore"):
            _dq_block(i0, i1)

    def _dq_block(i0, i1):
        qs = np.ascontiguousarray(q[:, i0:i1]) * sc
        dob = np.ascontiguousarray(do[:, i0:i1])
        lse_b, delta_b = lse[:, i0:i1], delta[:, i0:i1]
        acc = np.zeros((q.shape[0], i1 - i0, q.shape[2]), dtype)
        for j0, j1 in _blocks(int(lo[i0]), int(hi[i1 - 1]), BLOCK_N):
            kb, vb = k[:, j0:j1], v[:, j0:j1]
            p, ok = _probabilities(qs, kb, lse_b, i0, i1, j0, j1, lo, hi)
            ds = _dscores(p, ok, dob, vb, delta_b)
            acc += _masked_matmul(ds, kb, ok)
        acc *= sc
        dq[:, i0:i1] = acc

    jobs(run, _row_blocks(lo, hi, q.shape[1]))


def backward_dkdv(q, k, v, do, lse, delta, dk, dv, lo, hi, scale, jobs, dq=None) -> None:
    """dv[h, j] = sum_i p_ij do_i and dk[h, j] = scale * sum_i ds_ij q_i over the rows whose
    range holds j (a contiguous block of rows, since lo and hi are nondecreasing).

    With `dq` (zeros, (H, N, D)), dq[h, i] = scale * sum_j ds_ij k_j comes out of the same
    pass: each thread adds into its own partial (O(N) per thread), the partials are added once.
    """
    dtype = dk.dtype
    sc = dtype.type(scale)
    n_src = k.shape[1]
    partials: dict = {}
    lock = threading.Lock()

    def run(j0, j1):
        with np.errstate(invalid="ignore", over="ignore"):
            _dkdv_block(j0, j1)

    def _dkdv_block(j0, j1):
        kb = np.ascontiguousarray(k[:, j0:j1])
        vb = np.ascontiguousarray(v[:, j0:j1])
        r0 = int(np.searchsorted(hi, j0, side="right"))
        r1 = int(np.searchsorted(lo, j1, side="left"))
        acc_k = np.zeros(kb.shape, dtype)
        acc_v = np.zeros(vb.shape, dtype)
        acc_q = None
        if dq is not None:
            me = threading.get_ident()
            with lock:
                acc_q = partials.get(me)
                if acc_q is None:
                    acc_q = partials[me] = np.zeros(dq.shape, dtype)
        for i0, i1 in _blocks(r0, r1, BLOCK_M):
            qb = np.ascontiguousarray(q[:, i0:i1])
            dob = np.ascontiguousarray(do[:, i0:i1])
            p, ok = _probabilities(qb * sc, kb, lse[:, i0:i1], i0, i1, j0, j1, lo, hi)
            okt = None if ok is None else ok.T
            acc_v += _masked_matmul(p.transpose(0, 2, 1), dob, okt)
            ds = _dscores(p, ok, dob, vb, delta[:, i0:i1])
            acc_k += _masked_matmul(ds.transpose(0, 2, 1), qb, okt)
            if acc_q is not None:
                acc_q[:, i0:i1] += _masked_matmul(ds, kb, ok)
        acc_k *= sc
        dk[:, j0:j1] = acc_k
        dv[:, j0:j1] = acc_v

    blocks = _blocks(0, n_src, BLOCK_N)
    jobs(run, blocks)
    if dq is not None:
        for part in partials.values():
            dq += part
        dq *= sc
