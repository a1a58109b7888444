"""core: batches of small graphs (API.md section 12): `tg.Graph.batch([g0, g1, ...])`, their
disjoint union with PyG's `batch` vector (node -> graph) and `ptr` (node offsets), and
`unbatch()` back to the graphs.

A batch is a tg.Graph (Graph.cat's relation: source and destination ids offset graph by
graph, edges in graph order), so layers and propagates take it as they take any relation.
The items may be tg.Graphs or PyG-style objects with an `edge_index` and a `num_nodes`
(torch_geometric.data.Data: read by attribute, never imported); a PyG `Batch` (with its
`batch` and `ptr`) is taken as it is. Torch-free: index arrays are numpy.

`Graph.batch` is attached here (GraphBatch.attach), so the Graph class body stays as it is.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import GraphValidationError
from .graph import Graph


class GraphBatch(Graph):
    """The disjoint union of a sequence of graphs (a tg.Graph), with per-node graph ids.

    batch: int64 (num_dst,), the graph of each destination node (PyG's `batch`); ptr:
    int64 (num_graphs + 1,), destination offsets (PyG's `ptr`); src_batch / src_ptr the
    same for the sources (equal to batch / ptr for square graphs); num_graphs."""

    @property
    def num_graphs(self) -> int:
        return len(self.ptr) - 1

    # (set by batch(); kept out of params, which describe the relation itself)
    _ptr: np.ndarray
    _src_ptr: np.ndarray
    _graphs: tuple | None = None

    @property
    def ptr(self) -> np.ndarray:
        return self._ptr

    @property
    def src_ptr(self) -> np.ndarray:
        return self._src_ptr

    @property
    def batch(self) -> np.ndarray:
        return _ids(self.ptr)

    @property
    def src_batch(self) -> np.ndarray:
        return _ids(self.src_ptr)

    def unbatch(self) -> list:
        """The graphs, in order: the tg.Graphs given to batch() as they were, or (for a
        PyG Batch or Data items) relations rebuilt from this batch's edges, each in its
        edges' order."""
        if self._graphs is not None:
            return list(self._graphs)
        ei = self.to_edge_index()
        sp, dp = self.src_ptr, self.ptr
        graph_of_edge = np.searchsorted(dp, ei[1], side="right") - 1
        out = []
        for b in range(self.num_graphs):
            mine = graph_of_edge == b
            out.append(Graph.from_coo(ei[0][mine] - sp[b], ei[1][mine] - dp[b],
                                      num_src=int(sp[b + 1] - sp[b]),
                                      num_dst=int(dp[b + 1] - dp[b])))
        return out

    def __repr__(self) -> str:
        return (f"GraphBatch(num_graphs={self.num_graphs}, num_nodes={self.num_dst}, "
                f"num_edges={self.num_edges})")

    @staticmethod
    def attach() -> None:
        """Graph.batch: this module's batch() as a classmethod of tg.Graph."""
        Graph.batch = classmethod(lambda cls, graphs: batch(graphs))


def _ids(ptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def _as_graph(item: Any, i: int) -> Graph:
    if isinstance(item, Graph):
        return item
    edge_index = getattr(item, "edge_index", None)
    if edge_index is None:
        raise GraphValidationError(
            f"Graph.batch: item {i} is a {type(item).__name__}, expected a tg.Graph or an "
            "object with an edge_index (and num_nodes), such as torch_geometric's Data")
    n = getattr(item, "num_nodes", None)
    return Graph.from_edge_index(edge_index, num_nodes=None if n is None else int(n))


def _from_pyg_batch(pyg) -> GraphBatch:
    """A PyG Batch as it is: its edge_index over all nodes, and its ptr."""
    ptr = np.asarray(_numpy(pyg.ptr), dtype=np.int64)
    out = Graph.from_edge_index(pyg.edge_index, num_nodes=int(ptr[-1]))
    out.__class__ = GraphBatch      # a fresh relation of ours: now with its graph offsets
    out._ptr = out._src_ptr = ptr
    return out


def _numpy(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):          # a torch tensor (torch is not imported here)
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def batch(graphs: Sequence | Any) -> GraphBatch:
    """tg.Graph.batch(graphs): the disjoint union of tg.Graphs (or PyG Data objects; or a
    PyG Batch, taken as it is) as a GraphBatch with `batch`, `ptr` and `unbatch()`."""
    if hasattr(graphs, "ptr") and hasattr(graphs, "edge_index"):
        return _from_pyg_batch(graphs)
    if isinstance(graphs, Graph) or not isinstance(graphs, Sequence):
        raise GraphValidationError(f"Graph.batch: expected a list of graphs, found "
                                   f"{type(graphs).__name__}")
    parts = [_as_graph(g, i) for i, g in enumerate(graphs)]
    if not parts:
        raise GraphValidationError("Graph.batch: the list of graphs is empty")
    out = GraphBatch.cat(parts)
    out._ptr = np.concatenate([[0], np.cumsum([g.num_dst for g in parts])]).astype(np.int64)
    out._src_ptr = np.concatenate([[0], np.cumsum([g.num_src for g in parts])]
                                  ).astype(np.int64)
    if all(isinstance(g, Graph) for g in graphs):
        out._graphs = tuple(graphs)
    return out


GraphBatch.attach()

__all__ = ["GraphBatch", "batch"]
