"""runtime/paging: the distinct ids of a page (its gathered rows) and each id's position
among them, without a sort when cheap (the native kernel of paging.gather where it runs)."""
from __future__ import annotations

import numpy as np

from . import gather

BLOCK_SHIFT = 12      # id blocks of 4096 for pages whose ids sit in a few far-apart windows


def distinct(ci: np.ndarray, index_dtype, out: np.ndarray | None = None) -> tuple:
    """(sorted distinct ids, each id's position among them), i.e. np.unique's inverse,
    without a sort when cheap: a mark array over the ids' span (a page of a banded graph),
    or over the occupied 4096-id blocks (a page whose ids wrap around or sit in a few
    windows); a sort only for ids spread thin over a wide span. The mark array is the native
    kernel's (paging.gather) where it runs; then the positions go to `out` when given (the
    page's own id buffer: in place)."""
    if not len(ci):
        return np.zeros(0, np.int64), np.zeros(0, index_dtype)
    lo, hi = int(ci.min()), int(ci.max()) + 1
    if hi - lo <= 8 * len(ci):
        return _marked(ci, lo, hi - lo, index_dtype, out)
    blk = ci >> BLOCK_SHIFT
    occupied = np.zeros((hi - 1 >> BLOCK_SHIFT) + 1, bool)
    occupied[blk] = True
    blocks = np.flatnonzero(occupied)
    span = len(blocks) << BLOCK_SHIFT
    if span > 8 * len(ci):
        uniq, inv = np.unique(ci, return_inverse=True)
        return uniq, inv.astype(index_dtype, copy=False).reshape(-1)
    slot = np.zeros(len(occupied), ci.dtype)
    slot[blocks] = np.arange(len(blocks), dtype=ci.dtype)
    local = slot[blk]
    local <<= BLOCK_SHIFT
    local |= ci & ((1 << BLOCK_SHIFT) - 1)
    pos, inv = _marked(local, 0, span, index_dtype, out)
    return (blocks[pos >> BLOCK_SHIFT] << BLOCK_SHIFT) | (pos & ((1 << BLOCK_SHIFT) - 1)), inv


def _marked(ids: np.ndarray, lo: int, span: int, index_dtype, out=None) -> tuple:
    """distinct() of ids in [lo, lo + span) by a mark array: the native kernel's, else
    numpy's (a window every id of which occurs, a banded page, needs no remap there: the
    ids less lo are their own positions)."""
    got = gather.marked(ids, lo, span, index_dtype, out)
    if got is not None:
        return got
    local = ids - lo if lo else ids
    uniq = np.flatnonzero(np.bincount(local, minlength=span))    # (faster than a scatter)
    if len(uniq) == span:
        return uniq + lo, local.astype(index_dtype, copy=False)
    remap = np.empty(span, index_dtype)
    remap[uniq] = np.arange(len(uniq), dtype=index_dtype)
    return uniq + lo, remap[local]


__all__ = ["distinct", "BLOCK_SHIFT"]
