"""runtime: degrees of a stored ("paged") relation, read by row ranges, never the CSR whole.

In-degrees are differences of the stored row_ptr, read one range of rows at a time.
Out-degrees are the transposed relation's in-degrees when the store holds one, else the
column ids counted one range of edges at a time (store_transpose.out_degrees), so the
column array is never in memory whole. The result (8 bytes a row) is charged to the host
budget for as long as it lives, and the read buffers while they are read.
"""
from __future__ import annotations

import weakref

import numpy as np

from ...core.errors import StorageError
from ...core.graph import store_hooks
from ..memory import budgets as memory
from ..memory import scope as sc
from ..store.transpose import out_degrees

BY = ("dst", "src")
# rows (or edges) read at once; 0: one zarr chunk of the array, less under a tight host
# budget (tests set a small value to see every read stay inside its window)
STEP_ROWS = 0


def paged_degrees(graph, by: str) -> np.ndarray | None:
    """int64 in-degree per destination (by="dst") or out-degree per source (by="src") of a
    paged relation; None for any other relation or grouping (the impl rule answers)."""
    if getattr(graph, "kind", None) != "paged" or by not in BY:
        return None
    reader = graph.params["reader"]
    if by == "dst":
        return row_degrees(reader)
    if reader.transposed is not None:
        return row_degrees(reader.transposed)
    return column_counts(reader)


def step_rows(storage) -> int:
    """Rows of `storage` per read: one chunk, at most a quarter of the host budget left."""
    if STEP_ROWS:
        return int(STEP_ROWS)
    rows = storage.chunk_rows
    owner = sc.budget_scope("host")
    if owner is not None:
        room = owner.budgets["host"] - owner.used["host"]
        rows = min(rows, max(1 << 12, room // (4 * storage.dtype.itemsize)))
    return max(1, int(rows))


def row_degrees(reader) -> np.ndarray:
    """Row lengths of a store (or its transposed relation) from its row_ptr alone, one
    range at a time; each range is checked (non-decreasing, ending at num_edges)."""
    rp, n = reader._row_ptr, reader.num_dst
    step = step_rows(rp)

    def fill(out: np.ndarray) -> None:
        last = int(rp.read_rows(0, 1)[0])
        if last != 0:
            raise StorageError(f"{rp.path}: row_ptr check failed: starts at {last}, "
                               "expected 0")
        for a in range(0, n, step):
            b = min(n, a + step)
            part = rp.read_rows(a + 1, b + 1)      # row_ptr[a] is the previous range's last
            out[a] = part[0] - last
            np.subtract(part[1:], part[:-1], out=out[a + 1:b])
            if np.any(out[a:b] < 0):
                raise StorageError(f"{rp.path}: row_ptr check failed in rows [{a}:{b}) "
                                   "(offsets decrease)")
            last = int(part[-1])
        if last != reader.num_edges:
            raise StorageError(f"{rp.path}: row_ptr check failed: ends at {last}, expected "
                               f"num_edges={reader.num_edges}")

    def run() -> np.ndarray:
        out = np.empty(n, np.int64)
        fill(out)
        return out
    return _charged(n, min(step, n + 1) * 8, run)


def column_counts(reader) -> np.ndarray:
    """Out-degrees of a store without a transposed relation: its column ids counted one
    range of edges at a time (the ids, their shifted copy and the counts over their span,
    at most num_src, are the working memory)."""
    col = reader._col
    step = step_rows(col)
    work = 2 * min(step, reader.num_edges) * col.dtype.itemsize + reader.num_src * 8
    return _charged(reader.num_src, work, lambda: out_degrees(reader, step))


def _charged(n: int, work_bytes: int, run) -> np.ndarray:
    """run() under host charges: the int64 result's for as long as the array lives, the
    read buffers' until it returns."""
    result = memory.charge("host", n * 8, "degrees of a paged relation")
    try:
        work = memory.charge("host", work_bytes, "degrees of a paged relation (read buffers)")
        try:
            deg = run()
        finally:
            work.credit()
    except BaseException:
        result.credit()
        raise
    weakref.finalize(deg, result.credit).atexit = False
    return deg


# Graph.degrees (and so the degrees impl rule, also when a trace folds it eagerly) of a
# paged relation asks this module instead of resolving the whole CSR
store_hooks["degrees"] = paged_degrees

__all__ = ["paged_degrees", "row_degrees", "column_counts", "step_rows"]
