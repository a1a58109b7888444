"""torch_bridge: tg.nn.GCNConv, PyG's GCNConv with its aggregation run by Tiga."""
from __future__ import annotations

import numpy as np
import torch

from ...core.errors import ShapeError
from ...core.reducers import sum as sum_r
from ...trace.message_passing import MessagePassing
from .common import (
    WEIGHTED_SUM,
    Keyed,
    LayerArgumentError,
    check_positive,
    edge_reduce,
    follow,
    keyed,
    linear,
    loop_edit,
    relation,
    reset_glorot,
)
from .opaque import region


class _Normalized(MessagePassing):
    """sum_j dis(j) w(j -> i) dis(i) h_j: PyG's gcn_norm edge weight, formed per edge."""
    reducer = sum_r()

    def edge(self, src, dst, edge):
        return src.dis * edge.w * dst.dis * src.h


_NORMALIZED = _Normalized()


class GCNConv(Keyed):
    """PyG's GCNConv: x' = D^-1/2 (A + fill I) D^-1/2 (x W^T) + b, as a torch module.

    Arguments, defaults and parameter names (`lin.weight`, `bias`) are PyG's, so
    `load_state_dict(pyg_conv.state_dict())` gives PyG's outputs and gradients.
    Self loops are PyG's `add_remaining_self_loops` (Graph.add_remaining_self_loops): a node
    that already has a self edge keeps it and its weight and gets no second loop; the others
    get a loop of weight 1 (2 with improved=True and an edge_weight given: PyG fills 2 into
    given weights only, and weighs every edge 1 when there are none). D is the weighted
    in-degree over that relation (0 where it is 0). normalize=False sums w(j -> i) x_j W^T
    with no loops.

    forward(x, edge_index, edge_weight=None): x (N, in_channels); edge_index a tg.Graph
    over N nodes or a (2, E) integer tensor [sources; targets]; edge_weight (E,) in that
    relation's edge order, differentiable (where a node has several self loops, only the
    last one's weight is used, as in PyG, so the others' gradient is 0; PyG's backward hands
    them the kept loop's gradient too). Returns (N, out_channels).

    cached=True (as PyG: for a fixed graph, transductive learning) computes the relation
    with its loops and the normalisation on the first call and reuses them: a constant, so
    edge_weight gets no gradient (PyG differentiates its first call and cannot backward
    through a later one). Unlike PyG, which silently reuses the first graph's
    normalisation for any later graph, a call whose relation or edge_weight differs from
    the cached one (another tg.Graph object, or an edge_index / edge_weight of other
    values; the same tensors, or equal copies, are the cached graph) raises a
    LayerArgumentError; reset_parameters() or cached=False start over.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: bool | None = None,
                 normalize: bool = True, bias: bool = True):
        super().__init__()
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise LayerArgumentError(
                "GCNConv: add_self_loops=True needs normalize=True (as PyG: loops are added "
                "by the on-the-fly normalisation)")
        self.in_channels = check_positive("GCNConv", "in_channels", in_channels)
        self.out_channels = check_positive("GCNConv", "out_channels", out_channels)
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self._cache = None
        self._new_key()
        self.lin = linear(in_channels, out_channels, bias=False, glorot=True)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        reset_glorot(self.lin)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._cache = None

    def forward(self, x, edge_index, edge_weight=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(f"GCNConv: x is {found}, expected a 2-D tensor (nodes, "
                             "features); GCNConv has no bipartite form (as PyG)")
        h = self.lin(x)
        settings = (self.improved, self.add_self_loops, self.normalize)
        # one opaque op inside torch.compile (opaque.py); the cache stays on the layer
        if self.cached:
            out = region(_cached_region, edge_index, settings + (self._key,),
                         (edge_weight, h), ((1, 1),))
        else:
            out = region(_region, edge_index, settings, (edge_weight, h), ((1, 1),))
        return out if self.bias is None else out + self.bias

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


def _aggregate(graph, w, dis, h):
    if dis is None:
        return WEIGHTED_SUM(graph=graph, src={"h": h}, edge={"w": w.unsqueeze(-1)})
    return _NORMALIZED(graph=graph, src={"h": h, "dis": dis}, dst={"dis": dis},
                       edge={"w": w})


def _region(edge_index, settings, edge_weight, h):
    """The relation-dependent part of GCNConv.forward (h = lin(x)): node rows out."""
    return _aggregate(*_normalized(edge_index, settings, edge_weight, h), h)


def _cached_region(edge_index, settings, edge_weight, h):
    """_region with the layer's cache (cached=True): the normalisation of the first call."""
    layer = keyed(settings[-1])
    if layer._cache is None:
        with torch.no_grad():
            norm = _normalized(edge_index, settings[:3], edge_weight, h)
        layer._cache = _Cache(edge_index, edge_weight, h.size(0), norm)
    else:
        layer._cache.check(edge_index, edge_weight, h.size(0))
    return _aggregate(*layer._cache.norm, h)


class _Cache:
    """A cached normalisation and what it was computed from: the relation (a tg.Graph by
    identity; an edge_index by identity and version, else by value) and edge_weight."""

    def __init__(self, edge_index, edge_weight, n: int, norm: tuple):
        self.norm, self.n = norm, n
        self.relation, self.edge_weight = _held(edge_index), _held(edge_weight)

    def check(self, edge_index, edge_weight, n: int) -> None:
        for name, held, now in (("edge_index", self.relation, edge_index),
                                ("edge_weight", self.edge_weight, edge_weight)):
            if not _same(held, now):
                raise LayerArgumentError(
                    f"GCNConv: cached=True holds the normalisation of the first call's "
                    f"graph, and this call's {name} differs from that call's (PyG would "
                    "silently reuse the stale one); use cached=False for changing graphs, "
                    "or call reset_parameters() to drop the cache")
        if n != self.n:
            raise ShapeError(f"GCNConv: cached=True holds a graph of {self.n} nodes, but x "
                             f"has {n} rows")


def _held(value):
    """What a cache keeps of a relation or edge_weight: an object to compare later."""
    if isinstance(value, torch.Tensor):
        return value, value._version, value.detach().clone()
    return value


def _same(held, now) -> bool:
    if not isinstance(held, tuple):
        return held is now      # a tg.Graph (immutable) or None
    if not isinstance(now, torch.Tensor):
        return False
    tensor, version, copy = held
    if now is tensor and now._version == version:
        return True
    return (now.shape == copy.shape and
        torch.equal(now.detach().to(device=copy.device, dtype=copy.dtype), copy))


def _normalized(edge_index, settings, edge_weight, x) -> tuple:
    """(relation with loops, edge weights, D^-1/2 or None) for x's node count."""
    improved, add_self_loops, normalize = settings
    graph = relation("GCNConv", edge_index, x.size(0), x.size(0))
    w = edge_weight
    # PyG fills the loops' weights (2 if improved) only into a given edge_weight;
    # without one every edge, loops included, weighs 1
    fill = 2.0 if improved and w is not None else 1.0
    if w is None:
        w = torch.ones(graph.num_edges, dtype=x.dtype, device=x.device)
    elif not isinstance(w, torch.Tensor) or tuple(w.shape) != (graph.num_edges,):
        found = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ShapeError(f"GCNConv: edge_weight is {found}, expected a tensor of shape "
                         f"({graph.num_edges},): one weight per edge")
    if not normalize:
        return graph, w, None
    if add_self_loops:
        graph, ids = loop_edit(graph, "remaining")
        w = follow(w, ids, torch.tensor(fill))
    if edge_weight is None:    # unit weights: the degree is the edge count
        deg = torch.from_numpy(graph.degrees("dst").astype(np.float64)).to(w)
    else:
        deg = edge_reduce(graph, w, "sum")
    dis = deg.pow(-0.5)
    return graph, w, dis.masked_fill(dis == float("inf"), 0.0)
