"""torch_bridge: tg.nn.EdgeConv and tg.nn.DynamicEdgeConv (DGCNN), PyG's layers with the
edge network evaluated inside Tiga's edge function where tg.nn.trace can capture it.

Inside torch.compile a layer is one opaque op (opaque.region) when Tiga runs its network:
the relation (edge_index, a tg.Graph, or the kNN of the features) and the Tiga call, with
the network's Parameters as op inputs that the VJP differentiates by object. A network
torch evaluates (not capturable, or stochastic: Dropout in training) stays in the compiled
graph, between two ops: the relation's edge_index (for the kNN: an output with a
data-dependent edge count) and Tiga's reduction of the messages.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ...core.errors import UnsupportedError
from ...core.graph import Graph
from ...trace.message_passing import MessagePassing
from .. import nn as bridge_nn
from ..compiled import compiling
from .common import (
    REDUCERS,
    Keyed,
    LayerArgumentError,
    check_aggr,
    check_positive,
    edge_index_like,
    edge_reduce,
    keyed,
    node_pair,
    relation,
    reset_children,
)
from .inputs import adjacency, check_flow
from .opaque import region

_AGGRS = ("add", "sum", "mean", "max", "min")


class _EdgeNetwork(MessagePassing):
    """aggr_{j -> i} h([x_i, x_j - x_i]) with h captured by tg.nn.trace."""

    def __init__(self, traced, aggr: str):
        super().__init__()
        self.reducer = REDUCERS[aggr]()
        self.h = traced

    def edge(self, src, dst, edge):
        return self.h(dst.x, src.x - dst.x)


def _network(layer):
    """The layer's traced edge network, or False when tg.nn.trace cannot capture it."""
    if layer._network is None:
        try:
            layer._network = _EdgeNetwork(bridge_nn.trace_module(layer.nn), layer.aggr)
        except UnsupportedError:
            layer._network = False
    return layer._network


def edge_messages(layer, graph: Graph, x_src, x_dst):
    """Aggregate h([x_i, x_j - x_i]) over the relation. The network runs inside Tiga when
    tg.nn.trace supports it (its gradient is Tiga's VJP); otherwise (any other module, or
    Dropout/BatchNorm in training mode) torch evaluates it on the gathered edge rows, as PyG
    does, and Tiga only reduces the messages."""
    if _network(layer):
        try:
            return layer._network(graph=graph, src={"x": x_src}, dst={"x": x_dst})
        except UnsupportedError:
            pass    # e.g. Dropout in training mode: evaluated by torch below
    ei = edge_index_like(graph, x_src)
    x_i = x_dst[ei[1]]
    messages = layer.nn(torch.cat([x_i, x_src[ei[0]] - x_i], dim=-1))
    return edge_reduce(graph, messages, layer.aggr)


class EdgeConv(Keyed):
    """PyG's EdgeConv: x'_i = aggr_{j -> i} nn([x_i, x_j - x_i]), as a torch module.

    nn maps 2 F features to the output width; its parameters keep their names (`nn.*`).
    aggr: "max" (default), "mean", "add"/"sum" or "min"; an empty neighbourhood gives 0.
    forward(x, edge_index): x (N, F) or a pair (x_src (S, F), x_dst (N, F)); edge_index a
    tg.Graph, a (2, E) integer tensor [sources; targets] (flow="target_to_source":
    [targets; sources]) or a torch.sparse adj_t (N, S). Returns (N, out).
    """

    def __init__(self, nn: torch.nn.Module, aggr: str = "max",
                 flow: str = "source_to_target"):
        super().__init__()
        self.nn = nn
        self.aggr = check_aggr(aggr, "EdgeConv", _AGGRS)
        self.flow = check_flow("EdgeConv", flow)
        self._network = None    # the traced edge network, or False: torch evaluates it
        self._new_key()

    def reset_parameters(self) -> None:
        reset_children(self.nn)

    def forward(self, x, edge_index):
        """aggr over edges j -> i of nn([x_i, x_j - x_i]).

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.

        Returns:
            Tensor (N_dst, F_out), F_out the width nn gives.
        """
        x_src, x_dst = node_pair("EdgeConv", x)
        edge_index = adjacency("EdgeConv", edge_index, self.flow).relation
        if compiling():
            return _compiled(self, edge_index, x_src, None if x_dst is x_src else x_dst,
                             None, None)
        graph = relation("EdgeConv", edge_index, x_src.size(0), x_dst.size(0))
        return edge_messages(self, graph, x_src, x_dst)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"


class DynamicEdgeConv(Keyed):
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
        self._new_key()

    def reset_parameters(self) -> None:
        reset_children(self.nn)

    def forward(self, x, batch=None):
        """EdgeConv over the k nearest neighbours of each row in feature space.

        Args:
            x: node features (N, F), or a pair (x_src, x_dst): neighbours of each x_dst row
                among x_src.
            batch: optional sorted graph id per row (N,) (or a pair): neighbours stay within a
                graph.

        Returns:
            Tensor (N_dst, F_out), F_out the width nn gives.
        """
        x_src, x_dst = node_pair("DynamicEdgeConv", x)
        same = x_src is x_dst
        b_src, b_dst = batch if isinstance(batch, (tuple, list)) else (batch, batch)
        if compiling():
            return _compiled(self, None, x_src, None if same else x_dst, b_src, b_dst)
        graph = knn_relation(x_src.detach(), None if same else x_dst.detach(), self.k,
                             b_src, b_dst)
        return edge_messages(self, graph, x_src, x_dst)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn}, k={self.k})"


# ---- inside torch.compile -------------------------------------------------------------------

def _compiled(layer, edge_index, x_src, x_dst, b_src, b_dst):
    """The layer while Dynamo traces (x_dst None: x_src's rows are the destinations too;
    edge_index None: the kNN relation of the features, DynamicEdgeConv)."""
    # the modules' modes are read here, so that Dynamo guards on them (train/eval recompiles)
    width = _tiga_width(layer._key, tuple(m.training for m in layer.nn.modules()))
    settings = (layer._key, getattr(layer, "k", 0))
    if width is not None:   # Tiga runs the network: one op
        width = width or 2 * x_src.size(-1)
        return region(_network_region, edge_index, settings,
                      (x_src, x_dst, b_src, b_dst) + tuple(layer.nn.parameters()),
                      ((0 if x_dst is None else 1, 0, (width,)),), live=_parameters)
    return _torch_network(layer, edge_index, settings, x_src, x_dst, b_src, b_dst)


def _torch_network(layer, edge_index, settings, x_src, x_dst, b_src, b_dst):
    """A network torch evaluates, in the compiled graph: the relation's edge_index (an op
    output unless the user's), the messages, Tiga's reduction (an op)."""
    dst = x_src if x_dst is None else x_dst
    ei = edge_index
    if edge_index is None:
        count = _knn_edges(layer, dst, b_src, b_dst)
        ei = edge_index = region(_relation_region, None, settings,
                                 (x_src.detach(), None if x_dst is None else x_dst.detach(),
                                  b_src, b_dst), (("edge_index", count),))
        if count is None and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and
                                 m.training for m in layer.nn.modules()):
            # batch statistics branch on the row count (one row: an error, none: empty),
            # which Dynamo cannot follow for a data-dependent count: asserted at run time
            torch._check(ei.size(1) > 1, lambda: "tg.nn DynamicEdgeConv: a BatchNorm in "
                         "training mode inside torch.compile needs more than 1 edge")
    elif not isinstance(edge_index, torch.Tensor):   # a tg.Graph: its edge order, constant
        ei = region(_relation_region, edge_index, settings, (x_src.detach(),),
                    (("edge_index", _edge_count(edge_index)),))
    x_i = dst[ei[1]]
    messages = layer.nn(torch.cat([x_i, x_src[ei[0]] - x_i], dim=-1))
    return region(_reduce_region, edge_index, settings,
                  (x_src.detach(), None if x_dst is None else x_dst.detach(), messages),
                  ((0 if x_dst is None else 1, 2),))


@torch._dynamo.assume_constant_result
def _tiga_width(key: int, modes: tuple):
    """The width of the traced network's output (0: its input width), or None when torch
    evaluates the network (not capturable, or a Dropout with p > 0 in training mode)."""
    layer = keyed(key)
    network = _network(layer)
    if not network or any(isinstance(m, torch.nn.Dropout) and m.training and m.p > 0
                           for m in layer.nn.modules()):
        return None
    linears = [m for m in layer.nn.modules()
               if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2]
    return int(linears[-1].weight.shape[0]) if linears else 0


def _knn_edges(layer, dst, b_src, b_dst):
    """The kNN relation's edge count where the shapes give it (no batch: k per
    destination, Graph.knn refuses k above the sources), else None (data-dependent)."""
    if b_src is not None or b_dst is not None:
        return None
    return operator.index(dst.size(0)) * layer.k


@torch._dynamo.assume_constant_result
def _edge_count(graph: Graph) -> int:
    return int(graph.num_edges)


def _parameters(settings) -> list:
    return list(keyed(settings[0]).nn.parameters())


def _graph_of(layer, edge_index, x_src, x_dst, b_src, b_dst) -> Graph:
    dst = x_src if x_dst is None else x_dst
    if edge_index is not None:
        return relation(type(layer).__name__, edge_index, x_src.size(0), dst.size(0))
    return knn_relation(x_src.detach(), None if x_dst is None else x_dst.detach(), layer.k,
                        b_src, b_dst)


def _network_region(edge_index, settings, x_src, x_dst, b_src, b_dst, *params):
    """Relation and traced network (opaque.region; params are read from the layer)."""
    layer = keyed(settings[0])
    graph = _graph_of(layer, edge_index, x_src, x_dst, b_src, b_dst)
    dst = x_src if x_dst is None else x_dst
    return _network(layer)(graph=graph, src={"x": x_src}, dst={"x": dst})


def _relation_region(edge_index, settings, x_src, x_dst=None, b_src=None, b_dst=None):
    """The relation's edge_index (2, E) (opaque.region, an edge output)."""
    graph = _graph_of(keyed(settings[0]), edge_index, x_src, x_dst, b_src, b_dst)
    return edge_index_like(graph, x_src)


def _reduce_region(edge_index, settings, x_src, x_dst, messages):
    """Tiga's reduction of torch-evaluated messages in the relation's edge order."""
    layer = keyed(settings[0])
    dst = x_src if x_dst is None else x_dst
    graph = relation(type(layer).__name__, edge_index, x_src.size(0), dst.size(0))
    return edge_reduce(graph, messages, layer.aggr)


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
    ids = (np.zeros(n, dtype=np.int64) if batch is None else
        np.asarray(torch.as_tensor(batch).detach().cpu(), dtype=np.int64))
    if ids.shape != (n,) or (n and (ids[0] < 0 or np.any(np.diff(ids) < 0))):
        raise LayerArgumentError(f"DynamicEdgeConv: {name} has shape {ids.shape}, expected "
                                 f"a sorted non-negative graph id per row ({n} rows)")
    counts = np.bincount(ids, minlength=int(ids[-1]) + 1 if n else 0)
    return np.concatenate([[0], np.cumsum(counts)])
