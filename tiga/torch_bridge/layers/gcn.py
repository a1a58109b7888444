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
    edge_index_like,
    edge_reduce,
    follow,
    keyed,
    loop_edit,
    relation,
    reset_glorot,
)
from .inputs import (
    adjacency,
    batch_first,
    check_flow,
    check_in_channels,
    make_linear,
    nodes_first,
    sparse_like,
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

    forward(x, edge_index, edge_weight=None): x (N, in_channels), or (B, N, in_channels)
    (PyG's static graph: one relation for B feature sets); edge_index a tg.Graph over N
    nodes, a (2, E) integer tensor [sources; targets] (flow="target_to_source": [targets;
    sources]) or a torch.sparse adj_t (N, N) whose values are the edge weights;
    in_channels=-1: lazy, as PyG. edge_weight (E,) in that relation's edge order,
    differentiable (where a node has several self loops, only the last one's weight is
    used, as in PyG, so the others' gradient is 0; PyG's backward hands them the kept
    loop's gradient too). Returns (N, out_channels).

    cached=True (as PyG: for a fixed graph, transductive learning) computes the relation
    with its loops and the normalisation on the first call and reuses them: a constant, so
    edge_weight gets no gradient (PyG differentiates its first call and cannot backward
    through a later one). Unlike PyG, which silently reuses the first graph's
    normalisation for any later graph, a call whose relation or edge_weight differs from
    the cached one (another tg.Graph object, or an edge_index / edge_weight of other
    values; the same tensors, equal copies, or the same weighted edges in another order
    or as a sparse adjacency are the cached graph) raises a
    LayerArgumentError; reset_parameters() or cached=False start over.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: bool | None = None,
                 normalize: bool = True, bias: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise LayerArgumentError(
                "'GCNConv' does not support adding self-loops to the graph when no "
                "on-the-fly normalization is applied")
        self.in_channels = check_in_channels("GCNConv", in_channels, pair=False)[0]
        self.out_channels = check_positive("GCNConv", "out_channels", out_channels)
        self.improved, self.cached = improved, cached
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self.flow = check_flow("GCNConv", flow)
        self._cache = None
        self._new_key()
        self.lin = make_linear(in_channels, out_channels, bias=False, glorot=True)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        reset_glorot(self.lin)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._cache = None

    @property
    def _cached_edge_index(self):
        """PyG's name for the cached normalisation: (relation, weights), or None."""
        return None if self._cache is None else self._cache.norm[:2]

    def forward(self, x, edge_index, edge_weight=None):
        """Normalized neighbourhood sum of the projected features, plus bias.

        Args:
            x: node features (N, in_channels), or a static-graph batch (B, N, in_channels)
                sharing one edge_index.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).

        Returns:
            Tensor (N, out_channels) ((B, N, out_channels) for a 3-D x).
        """
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
            found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(f"GCNConv: x is {found}, expected a 2-D tensor (nodes, "
                             "features) or a 3-D static-graph tensor (batch, nodes, "
                             "features); GCNConv has no bipartite form (as PyG)")
        h = nodes_first(self.lin(x))
        adj = adjacency("GCNConv", edge_index, self.flow)
        if edge_weight is None and adj.values is not None:
            edge_weight = adj.values.to(h.dtype)
        settings = (self.improved, self.add_self_loops, self.normalize)
        # one opaque op inside torch.compile (opaque.py); the cache stays on the layer
        if self.cached:
            out = region(_cached_region, adj.relation, settings + (self._key,),
                         (edge_weight, h), ((1, 1),))
        else:
            out = region(_region, adj.relation, settings, (edge_weight, h), ((1, 1),))
        out = batch_first(out, x)
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
    identity; an edge_index by identity and version, else as its set of weighted edges,
    so the same edges in another order or read from a sparse adjacency match) and
    edge_weight."""

    def __init__(self, edge_index, edge_weight, n: int, norm: tuple):
        self.norm, self.n = norm, n
        self.relation, self.edge_weight = _held(edge_index), _held(edge_weight)
        self.edges = None
        if isinstance(edge_index, torch.Tensor):
            self.edges = _weighted_edges(edge_index, edge_weight, n)

    def check(self, edge_index, edge_weight, n: int) -> None:
        for name, held, now in (("edge_index", self.relation, edge_index),
                                ("edge_weight", self.edge_weight, edge_weight)):
            if not _same(held, now) and not self._same_edges(edge_index, edge_weight, n):
                raise LayerArgumentError(
                    f"GCNConv: cached=True holds the normalisation of the first call's "
                    f"graph, and this call's {name} differs from that call's (PyG would "
                    "silently reuse the stale one); use cached=False for changing graphs, "
                    "or call reset_parameters() to drop the cache")
        if n != self.n:
            raise ShapeError(f"GCNConv: cached=True holds a graph of {self.n} nodes, but x "
                             f"has {n} rows")

    def _same_edges(self, edge_index, edge_weight, n: int) -> bool:
        if self.edges is None or not isinstance(edge_index, torch.Tensor):
            return False
        keys, w = _weighted_edges(edge_index, edge_weight, n)
        return torch.equal(keys, self.edges[0]) and torch.equal(w, self.edges[1])


def _weighted_edges(edge_index, edge_weight, n: int) -> tuple:
    """(sorted edge keys target * n + source, their weights, 1 where none are given)."""
    ei = edge_index.detach().to(device="cpu", dtype=torch.int64)
    if ei.dim() != 2 or ei.size(0) != 2:
        return ei.flatten(), ei.flatten()
    keys, perm = torch.sort(ei[1] * max(n, 1) + ei[0], stable=True)
    if edge_weight is None:
        return keys, torch.ones(len(keys), dtype=torch.float64)
    w = edge_weight.detach().to(device="cpu", dtype=torch.float64)
    return keys, (w[perm] if w.shape == perm.shape else w)


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
    copy = held[2]    # by value: .data / .numpy() edits keep the version counter
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


def gcn_norm(edge_index, edge_weight=None, num_nodes=None, improved: bool = False,
             add_self_loops: bool = True, flow: str = "source_to_target", dtype=None):
    """PyG's gcn_norm: the relation with PyG's remaining self loops (weight 2 if improved,
    else 1) and the weights D^-1/2 w D^-1/2 (D: weighted in-degree). edge_index (2, E)
    gives (edge_index, weights) in the looped relation's edge order (PyG's: the edges,
    then the new loops); a torch.sparse adj_t gives (adj_t of the normalised weights in
    its layout, None). Differentiable in the weights (or the adjacency's values)."""
    check_flow("gcn_norm", flow)
    adj = adjacency("gcn_norm", edge_index, flow)
    ei = torch.as_tensor(adj.relation)
    if num_nodes is None:
        num_nodes = adj.sparse.size(0) if adj.sparse is not None else (
            int(ei.max()) + 1 if ei.numel() else 0)
    w = edge_weight if edge_weight is not None else adj.values
    if w is None:
        w = torch.ones(ei.size(1), dtype=dtype or torch.float32, device=ei.device)
    graph = relation("gcn_norm", ei, num_nodes, num_nodes)
    if add_self_loops:
        graph, ids = loop_edit(graph, "remaining")
        w = follow(w, ids, torch.tensor(2.0 if improved else 1.0))
    looped = edge_index_like(graph, w)
    deg = w.new_zeros(num_nodes).index_add(0, looped[1], w)
    dis = deg.pow(-0.5)
    dis = dis.masked_fill(dis == float("inf"), 0.0)
    w = dis[looped[0]] * w * dis[looped[1]]
    if adj.sparse is not None:
        return sparse_like(adj.sparse, looped, w), None
    return (looped.flip(0) if flow == "target_to_source" else looped), w
