"""runtime: paged execution over a relation held in memory, when its fields do not fit.

API.md section 7: a program called on a paged graph, or on fields whose bytes exceed the
host budget, runs page by page. For a relation built in memory (from_csr, from_edge_index,
cat) the CSR is resident already; what does not fit is its disk-tier fields and its result.
Read whole, they would exceed the budget behind its back. ResidentRows serves the
relation's row ranges (and its transpose's, for a propagate grouped by source) the way a
store version does, so the paged route (paging.PagedPlan) runs on it unchanged: per page it
reads the disk fields' rows, gathers each distinct source row once, runs the page kernel
and writes the rows to a host result, or to a disk one when the result does not fit either.
"""
from __future__ import annotations

import numpy as np

from ..memory import scope as sc
from ..memory.tiers import HostStorage
from .run import PagedPlan, backend_pages, pageable

RESIDENT_KINDS = ("csr", "cat")     # relations whose CSR is stored, not implied or generated


class ResidentRows:
    """Row ranges of an in-memory CSR, read like a store version's (store.Store): `edge_perm`
    names the edge id stored at each CSR position (None: ids are positions)."""

    tier = "host"

    def __init__(self, row_ptr, col_idx, num_src: int, edge_perm, name: str):
        self.row_ptr, self.col_idx = row_ptr, col_idx
        self.num_src, self.num_dst = int(num_src), len(row_ptr) - 1
        self.num_edges, self.index_dtype = len(col_idx), col_idx.dtype
        self.edge_perm = None if edge_perm is None else HostStorage(np.asarray(edge_perm))
        self.path = self.vdir = name       # (messages; the page plan's cache key)
        self.transposed = None

    def read_rows(self, start: int, stop: int, out: tuple = (None, None)) -> tuple:
        """(row_ptr local to the range, col_idx, first edge) of rows [start, stop), copied
        into `out` when given: the page owns its ids (paging remaps them in place)."""
        rp = self.row_ptr[start:stop + 1]
        lo, hi = int(rp[0]), int(rp[-1])
        local = np.empty(len(rp), np.int64) if out[0] is None else out[0][:len(rp)]
        np.subtract(rp, lo, out=local)
        ci = np.empty(hi - lo, self.index_dtype) if out[1] is None else out[1][:hi - lo]
        ci[...] = self.col_idx[lo:hi]
        return local, ci, lo

    def read_csr(self) -> tuple:
        return self.row_ptr, self.col_idx

    def page_bounds(self, page_rows: int) -> np.ndarray:
        at = np.append(np.arange(0, self.num_dst, page_rows, dtype=np.int64), self.num_dst)
        return np.asarray(self.row_ptr[at], np.int64)


def reader_of(graph, reduce_by: str) -> ResidentRows:
    """The rows a page walk of `graph` reads: its CSR, and for a walk by source also its
    transpose (Graph.transpose: built once per relation and cached)."""
    rows = ResidentRows(*graph.resolve_csr(), graph.num_src, graph.edge_perm,
                        f"in-memory {graph.kind} relation")
    if reduce_by == "src":
        t, perm = graph.transpose()
        rows.transposed = ResidentRows(*t.resolve_csr(), t.num_src, perm,
                                       f"in-memory {graph.kind} relation (transposed)")
    return rows


def _bytes(shape, dtype) -> int:
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        return 0        # (a symbolic size: a result whose bytes are known only at the call)
    return (int(np.prod(tuple(shape), dtype=np.int64)) *
        np.dtype(getattr(dtype, "np", dtype)).itemsize)


def plan_resident(eqn, graph, values: list):
    """A PagedPlan for `eqn` over `graph` held in memory when a host budget is set and the
    call's disk-tier fields and its result would not fit what is left of it; else None (the
    in-memory route); the executor binds its Kernel op."""
    p = eqn.params
    if getattr(graph, "kind", None) not in RESIDENT_KINDS or not pageable(p):
        return None
    owner = sc.budget_scope("host")
    if owner is None:
        return None
    disk = sum(_bytes(v.shape, v.dtype) for v, r in zip(values, p["roles"])
               if r != "param" and getattr(v, "tier", None) == "disk")
    if not disk:
        return None
    by = p["reduce_by"]
    if by == "edge" and graph.edge_perm is not None:
        return None    # (pages write edge rows in stored order: only where that is id order)
    lead = {"dst": graph.num_dst, "src": graph.num_src, "edge": graph.num_edges}.get(by)
    result = sum(_bytes(v.type.shape if lead is None else (lead,) + tuple(v.type.shape[1:]),
                        v.type.dtype) for v in eqn.outputs)
    if disk + result <= owner.budgets["host"] - owner.used["host"]:
        return None
    return PagedPlan(reader_of(graph, by), **backend_pages())


__all__ = ["plan_resident", "ResidentRows", "reader_of", "RESIDENT_KINDS"]
