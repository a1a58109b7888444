"""torch_bridge: tg.nn.EdgeConv and tg.nn.DynamicEdgeConv (DGCNN), PyG's layers with the
edge network evaluated inside Tiga's edge function where tg.nn.trace can capture it."""
from __future__ import annotations

import numpy as np
import torch

from ...core.errors import UnsupportedError
from ...core.graph import Graph
from ...trace.message_passing import MessagePassing
from .. import nn as bridge_nn
from .common import (
    REDUCERS,
    LayerArgumentError,
    check_aggr,
    check_positive,
    edge_index_like,
    edge_reduce,
    node_pair,
    relation,
    reset_children,
)

_AGGRS = ("add", "sum", "mean", "max", "min")


class _EdgeNetwork(MessagePassing):
    """aggr_{j -> i} h([x_i, x_j - x_i]) with h captured by tg.nn.trace."""

    def __init__(self, traced, aggr: str):
        super().__init__()
        self.reducer = REDUCERS[aggr]()
        self.h = traced

    def edge(self, src, dst, edge):
        return self.h(dst.x, src.x - dst.x)


def edge_messages(layer, graph: Graph, x_src, x_dst):
    """Aggregate h([x_i, x_j - x_i]) over the relation. The network runs inside Tiga when
    tg.nn.trace supports it (its gradient is Tiga's VJP); otherwise (any other module, or
    Dropout/BatchNorm in training mode) torch evaluates it on the gathered edge rows, as PyG
    does, and Tiga only reduces the messages."""
    if layer._network is None:
        try:
            layer._network = _EdgeNetwork(bridge_nn.trace_module(layer.nn), layer.aggr)
        except UnsupportedError:
            layer._network = False
    if layer._network:
        try:
            return layer._network(graph=graph, src={"x": x_src}, dst={"x": x_dst})
        except UnsupportedError:
            pass    # e.g. Dropout in training mode: evaluated by torch below
    ei = edge_index_like(graph, x_src)
    x_i = x_dst[ei[1]]
    messages = layer.nn(torch.cat([x_i, x_src[ei[0]] - x_i], dim=-1))
    return edge_reduce(graph, messages, layer.aggr)


class EdgeConv(torch.nn.Module):
    """PyG's EdgeConv: x'_i = aggr_{j -> i} nn([x_i, x_j - x_i]), as a torch module.

    nn maps 2 F features to the output width; its parameters keep their names (`nn.*`).
    aggr: "max" (default), "mean", "add"/"sum" or "min"; an empty neighbourhood gives 0.
    forward(x, edge_index): x (N, F) or a pair (x_src (S, F), x_dst (N, F)); edge_index a
    tg.Graph or a (2, E) integer tensor [sources; targets]. Returns (N, out).
    """

    def __init__(self, nn: torch.nn.Module, aggr: str = "max"):
        super().__init__()
        self.nn = nn
        self.aggr = check_aggr(aggr, "EdgeConv", _AGGRS)
        self._network = None    # the traced edge network, or False: torch evaluates it

    def reset_parameters(self) -> None:
        reset_children(self.nn)

    def forward(self, x, edge_index):
        x_src, x_dst = node_pair("EdgeConv", x)
        graph = relation("EdgeConv", edge_index, x_src.size(0), x_dst.size(0))
        return edge_messages(self, graph, x_src, x_dst)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"


class DynamicEdgeConv(torch.nn.Module):
    """PyG's DynamicEdgeConv: EdgeConv over the k nearest neighbours in feature space,
    rebuilt on every call (tg.Graph.knn: exact, ties to the smaller index; a point is its
    own nearest neighbour, as in PyG's knn). The neighbour choice is not differentiated.

    forward(x, batch=None): x (N, F) or a pair (x_src, x_dst) (neighbours of each x_dst row
    among x_src); batch: a sorted graph id per row (or a pair), neighbours then stay within
    a graph. num_workers is accepted for PyG compatibility and unused.
    """

    def __init__(self, nn: torch.nn.Module, k: int, aggr: str = "max", num_workers: int = 1):
        super().__init__()
        self.nn = nn
        self.k = check_positive("DynamicEdgeConv", "k", k)
        self.aggr = check_aggr(aggr, "DynamicEdgeConv", _AGGRS)
        self.num_workers = num_workers
        self._network = None

    def reset_parameters(self) -> None:
        reset_children(self.nn)

    def forward(self, x, batch=None):
        x_src, x_dst = node_pair("DynamicEdgeConv", x)
        same = x_src is x_dst
        b_src, b_dst = batch if isinstance(batch, (tuple, list)) else (batch, batch)
        graph = knn_relation(x_src.detach(), None if same else x_dst.detach(), self.k,
                             b_src, b_dst)
        return edge_messages(self, graph, x_src, x_dst)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn}, k={self.k})"


def knn_relation(x_src, x_dst, k: int, b_src, b_dst) -> Graph:
    """k nearest x_src rows of every x_dst row (x_dst None: of every x_src row, itself
    included), within each graph of a sorted batch vector."""
    if b_src is None and b_dst is None:
        return Graph.knn(x_src, k, query=x_dst, loop=True)
    q = x_src if x_dst is None else x_dst
    s_ptr = _segments("batch", b_src, len(x_src))
    d_ptr = _segments("batch", b_dst, len(q))
    if len(s_ptr) != len(d_ptr):
        raise LayerArgumentError(f"DynamicEdgeConv: batch has {len(s_ptr) - 1} source and "
                                 f"{len(d_ptr) - 1} destination graphs, expected as many")
    parts = []
    for i in range(len(s_ptr) - 1):
        pos = x_src[s_ptr[i]:s_ptr[i + 1]]
        query = None if x_dst is None else q[d_ptr[i]:d_ptr[i + 1]]
        parts.append(Graph.knn(pos, k, query=query, loop=True))
    return Graph.cat(parts)


def _segments(name: str, batch, n: int) -> np.ndarray:
    """Row offsets of the graphs of a sorted batch vector (graph ids 0..B-1)."""
    ids = np.zeros(n, dtype=np.int64) if batch is None else \
        np.asarray(torch.as_tensor(batch).detach().cpu(), dtype=np.int64)
    if ids.shape != (n,) or (n and (ids[0] < 0 or np.any(np.diff(ids) < 0))):
        raise LayerArgumentError(f"DynamicEdgeConv: {name} has shape {ids.shape}, expected "
                                 f"a sorted non-negative graph id per row ({n} rows)")
    counts = np.bincount(ids, minlength=int(ids[-1]) + 1 if n else 0)
    return np.concatenate([[0], np.cumsum(counts)])
