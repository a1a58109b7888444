"""core: numpy segment reductions the reference propagate folds messages with.

Half-precision messages (float16, bfloat16) accumulate in float32 and round once to their
dtype at the end (core/reducers.py states the rule every route follows).
"""
from __future__ import annotations

import numpy as np

from .errors import UnsupportedError


def wide(m: np.ndarray) -> np.ndarray:
    """`m` in the dtype its sums, products and softmax accumulate in (float32 for halves)."""
    return m.astype(np.float32) if m.dtype.name in ("float16", "bfloat16") else m


def _zeros_like_rows(n: int, m: np.ndarray, fill) -> np.ndarray:
    return np.full((n,) + m.shape[1:], fill, dtype=m.dtype)


def _extreme_fill(dtype, largest: bool):
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V":
        return -np.inf if largest else np.inf
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    if info is None:
        return not largest
    return info.min if largest else info.max


def segment_reduce(name: str, parts: list, seg: np.ndarray, n: int, counts: np.ndarray,
                   empty=None):
    """Reduce messages (rows of `parts`) into `n` segments with ids `seg`; an empty segment
    gives 0 (prod: 1; arg-reducers: -1), or `empty` where max/min/prod set it."""
    m = parts[0]
    if empty is not None and name in ("max", "min", "prod"):
        out = segment_reduce(name, parts, seg, n, counts)
        out[counts == 0] = empty
        return out
    if name in ("argmin", "argmax"):
        return _segment_arg(name == "argmax", m, np.asarray(parts[1], np.int64), seg, n, counts)
    if name in ("sum", "prod"):   # in the wide dtype, rounded once to the messages' dtype
        w = wide(m)
        out = _zeros_like_rows(n, w, 0 if name == "sum" else 1)
        (np.add if name == "sum" else np.multiply).at(out, seg, w)
        return out.astype(m.dtype, copy=False)
    if name == "mean":
        out = segment_reduce("sum", [wide(m)], seg, n, counts)
        denom = np.maximum(counts, 1).reshape((n,) + (1,) * (m.ndim - 1))
        return (out / denom).astype(m.dtype, copy=False)
    if name in ("max", "min"):
        out = _zeros_like_rows(n, m, _extreme_fill(m.dtype, name == "max"))
        (np.maximum if name == "max" else np.minimum).at(out, seg, m)
        out[counts == 0] = 0
        return out
    if name == "online_softmax":
        out = _segment_softmax(wide(parts[0]), wide(parts[1]), seg, n, counts)
        return out.astype(parts[1].dtype, copy=False)
    raise UnsupportedError(f"reducer {name!r} has no reference segment reduction")


def _segment_arg(largest: bool, m, ids, seg, n, counts):
    """The smallest id among each segment's extremal messages (a NaN is extremal, as in
    numpy's argmin), per message entry; -1 for an empty segment."""
    best = _zeros_like_rows(n, m, _extreme_fill(m.dtype, largest))
    with np.errstate(invalid="ignore"):   # NaN propagates: it is the extremum
        (np.maximum if largest else np.minimum).at(best, seg, m)
    top = best[seg]
    hit = m == top
    if m.dtype.kind in "fc" or m.dtype.kind == "V":
        hit |= np.isnan(m.astype(np.float64)) & np.isnan(top.astype(np.float64))
    lifted = np.broadcast_to(ids.reshape(ids.shape + (1,) * (m.ndim - 1)), m.shape)
    cand = np.where(hit, lifted, np.iinfo(np.int64).max)
    out = np.full((n,) + m.shape[1:], np.iinfo(np.int64).max, np.int64)
    np.minimum.at(out, seg, cand)
    out[counts == 0] = -1
    return out


def _segment_softmax(score, value, seg, n, counts):
    top = _zeros_like_rows(n, score, -np.inf)
    np.maximum.at(top, seg, score)
    top[counts == 0] = 0
    p = np.exp(score - top[seg])
    mass = _zeros_like_rows(n, score, 0)
    np.add.at(mass, seg, p)
    extra = value.ndim - score.ndim
    pw = p.reshape(p.shape + (1,) * extra)
    acc = _zeros_like_rows(n, value, 0)
    np.add.at(acc, seg, pw * value)
    safe = np.where(mass > 0, mass, 1).reshape(mass.shape + (1,) * extra)
    return (acc / safe).astype(value.dtype, copy=False)
