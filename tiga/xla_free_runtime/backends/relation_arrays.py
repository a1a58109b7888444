"""runtime/backends: the arrays of a relation a kernel walk binds, on any backend.

A compiled propagate binds its relation's walk: the CSR (or its transpose, for a walk by
source) as contiguous arrays, or an implicit relation's small tables (walk_tables.py), and cuts
its rows into chunks by the walk's row offsets. All of it is derived from the relation alone
(its arrays are frozen), so it is kept in the relation's weak cache, shared by the cpu-llvm
and Triton backends.
"""
from __future__ import annotations

import threading

import numpy as np

from ...core.errors import UnsupportedError
from ..caches.relations import kept as relation_cache
from .walk_tables import chunks_of, implicit_tables

_LOCK = threading.Lock()     # (a relation's row chunks are cut once)


def walked_csr(graph, walk: str) -> tuple:
    """(row_ptr, col_idx, edge_perm or None) of the CSR the kernel walks (the relation's
    arrays are frozen, so the contiguous views are kept per relation)."""
    per_graph = relation_cache(graph, "walks")
    found = per_graph.get(("csr-arrays", walk))
    if found is None:
        found = per_graph[("csr-arrays", walk)] = _walked_csr(graph, walk)
    return found


def _walked_csr(graph, walk: str) -> tuple:
    graph.ensure_valid()
    if walk == "src":
        graph_t, perm = graph.transpose()   # built once per relation and cached on it
        rp, ci = graph_t.resolve_csr()
    else:
        (rp, ci), perm = graph.resolve_csr(), graph.edge_perm
    perm = None if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
    return (np.ascontiguousarray(rp, dtype=np.int64),
            np.ascontiguousarray(ci, dtype=graph.index_dtype.np), perm)


def walk_arrays(graph, sig) -> tuple:
    """({slot: array} of the kernel's walk, row_ptr used to balance row chunks).

    Compressed rows bind the CSR (or the cached transpose). Implicit relations walked
    natively, by destination or by source, bind only O(#sequences) tables, and a CSR with
    sparse sources its transpose over the sources with edges (walk_tables.py); their row
    offsets for chunking are computed from the kind's formula and cached.
    """
    if tuple(sig.relation) == ("csr",):
        rp, ci, perm = walked_csr(graph, sig.walk)
        return {"row_ptr": rp, "col_idx": ci, "edge_perm": perm}, rp
    graph.ensure_valid()
    per_graph = relation_cache(graph, "walks")
    found = per_graph.get(tuple(sig.relation))
    if found is None:
        found = implicit_tables(graph, tuple(sig.relation))
        if int(found[1][-1]) != graph.num_edges:
            raise UnsupportedError(f"the {graph.kind} walk counts {int(found[1][-1])} edges, "
                                   f"the relation has {graph.num_edges}; this is a Tiga bug")
        per_graph[tuple(sig.relation)] = found
    return found


def launch_chunks(graph, walk, row_ptr, launch) -> list:
    """The row chunks of a launch over this relation (cached per relation and partition)."""
    key = (walk, launch.threads, launch.row_partition, launch.chunks_per_thread, len(row_ptr))
    per_graph = relation_cache(graph, "chunks")
    found = per_graph.get(key)
    if found is not None:
        return found
    with _LOCK:
        if key not in per_graph:
            per_graph[key] = chunks_of(row_ptr, launch.threads, launch.row_partition,
                                       launch.chunks_per_thread)
        return per_graph[key]


__all__ = ["walked_csr", "walk_arrays", "launch_chunks"]
