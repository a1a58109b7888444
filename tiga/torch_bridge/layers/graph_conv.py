"""torch_bridge: tg.nn.GraphConv and tg.nn.ResGatedGraphConv, PyG's layers with the
reduction over each destination's edges run by Tiga (projections stay in torch).

Inputs as PyG's (inputs.py): x or (x_src, x_dst) (x_dst None allowed for GraphConv), a
static-graph x (B, N, F) for GraphConv, an edge_index (int32 or int64), a tg.Graph or a
torch.sparse adj_t (its values are GraphConv's edge weights), size=, flow=.
"""
from __future__ import annotations

import torch

from ...core.reducers import sum as sum_r
from ...trace import math as tm
from ...trace.message_passing import MessagePassing
from .aggr import fused_names, resolve
from .common import (
    REDUCERS,
    LayerArgumentError,
    check_positive,
    edge_index_like,
    edge_reduce,
    relation,
)
from .hops import edge_weight_of
from .inputs import (
    adjacency,
    batch_first,
    check_flow,
    check_in_channels,
    check_size,
    make_linear,
    node_count,
    node_inputs,
    nodes_first,
)
from .opaque import region
from .sage_gin import aggregate


class _WeightedReduce(MessagePassing):
    """Per destination: the reducer over edges of w(edge) * x(source)."""

    def __init__(self, reducer):
        super().__init__()
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return edge.w * src.x


# one instance per reducer: a call's compiled program is cached per (function, owner)
_WEIGHTED = {name: _WeightedReduce(make()) for name, make in REDUCERS.items()}


def _weighted_region(edge_index, settings, w, x_src, x_dst):
    """sum/mean/max/min/mul over j -> i of w_ji x_j (opaque.region): rows of x_dst."""
    name, reducer, n_dst = settings
    graph = relation(name, edge_index, x_src.size(0), n_dst)
    _check_edges(name, "edge_weight", w, graph)
    return _WEIGHTED[reducer](graph=graph, src={"x": x_src}, edge={"w": w})


def _check_edges(layer: str, what: str, t, graph) -> None:
    if t.size(0) != graph.num_edges:
        raise LayerArgumentError(f"{layer}: {what} has {t.size(0)} rows, expected "
                                 f"{graph.num_edges} (one per edge)")


def weighted_aggregate(name: str, aggr, adj, w, x_src, x_dst, n_dst: int):
    """aggr over j -> i of w_ji x_j (x_src nodes first): one fused Tiga propagate for a
    single named reducer; otherwise the weighted messages are formed in torch and handed
    to the aggregation module (its own Tiga reductions) grouped by destination."""
    names = fused_names(aggr)
    if names in REDUCERS:
        settings = (name, names, n_dst)
        if x_dst is None:
            return _weighted_region(adj.relation, settings, w, x_src, None)
        return region(_weighted_region, adj.relation, settings, (w, x_src, x_dst), ((2, 1),))
    graph = relation(name, adj.relation, x_src.size(0), n_dst)
    _check_edges(name, "edge_weight", w, graph)
    ei = edge_index_like(graph, x_src)
    msgs = x_src[ei[0]] * w.view((-1,) + (1,) * (x_src.dim() - 1))
    return aggr(msgs, ei[1], dim_size=n_dst, dim=0)


class GraphConv(torch.nn.Module):
    """PyG's GraphConv: x'_i = lin_rel(aggr_{j -> i} w_ji x_j) + lin_root(x_i).

    Parameter names (`lin_rel.weight`, `lin_rel.bias`, `lin_root.weight`) and arguments
    are PyG's; aggr ("add" default) as SAGEConv's: a name, a list, or an aggregation
    module (aggr_kwargs for it); lin_rel reads in_channels[0] columns whatever aggr is (as
    PyG's), so a list must combine to that width (aggr_kwargs=dict(mode="sum"), "mean",
    "proj", ...). in_channels may be a pair or -1 (lazy).
    forward(x, edge_index, edge_weight=None, size=None): x (N, F), (B, N, F) or a pair
    (x_src, x_dst), x_dst None allowed (then no root term; size= gives the destinations);
    edge_weight (E,) in the relation's edge order (a torch.sparse adj_t's values when not
    given); without weights w_ji is 1.
    """

    def __init__(self, in_channels, out_channels: int, aggr="add", bias: bool = True,
                 aggr_kwargs: dict | None = None, flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("GraphConv", in_channels)
        self.in_channels = in_channels
        self.out_channels = check_positive("GraphConv", "out_channels", out_channels)
        self.flow = check_flow("GraphConv", flow)
        self.aggr = aggr if isinstance(aggr, (str, list, tuple)) else type(aggr).__name__
        try:
            self.aggr_module = resolve(aggr, **dict(aggr_kwargs or {}))
        except LayerArgumentError as exc:
            raise LayerArgumentError(f"GraphConv: {exc}") from exc
        # lin_rel reads in_channels[0] columns whatever aggr is (PyG's state dict): a list
        # aggr must combine to that width (mode="sum", "mean", "proj", ...)
        self.lin_rel = make_linear(n_src, out_channels, bias=bias, glorot=False)
        self.lin_root = make_linear(n_dst, out_channels, bias=False, glorot=False)

    def reset_parameters(self) -> None:
        self.aggr_module.reset_parameters()
        self.lin_rel.reset_parameters()
        self.lin_root.reset_parameters()

    def forward(self, x, edge_index, edge_weight=None, size=None):
        """lin_rel of the (weighted) aggregate of the neighbours plus lin_root of x_i.

        Args:
            x: node features (N, F_in), a pair (x_src, x_dst) of them for a bipartite relation
                (x_dst may be None with `size`), or a 3-D static-graph batch (B, N, F_in)
                sharing one edge_index.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, out_channels) ((B, N_dst, out_channels) for a 3-D x).
        """
        x_src, x_dst = node_inputs("GraphConv", x)
        adj = adjacency("GraphConv", edge_index, self.flow)
        n_dst = adj.num_dst("GraphConv", size, x_dst)
        check_size("GraphConv", size, node_count(x_src), n_dst)
        edge_weight = edge_weight_of(adj, edge_weight, x_src)
        src, dst = nodes_first(x_src), nodes_first(x_dst)
        if edge_weight is None:
            agg = aggregate("GraphConv", self.aggr_module, adj, src, dst, n_dst)
        else:
            agg = weighted_aggregate("GraphConv", self.aggr_module, adj, edge_weight, src,
                                     dst, n_dst)
        out = self.lin_rel(batch_first(agg, x_src))
        if x_dst is not None:
            out = out + self.lin_root(x_dst)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


# ---- ResGatedGraphConv ------------------------------------------------------------------------

class _Gated(MessagePassing):
    """sum_j sigmoid(k_i + q_j + s_ji) * (v_j + u_ji): s, u the edge attributes' share of
    the key + query and value projections (0 without edge attributes)."""
    reducer = sum_r()

    def edge(self, src, dst, edge):
        return tm.sigmoid(dst.k + src.q + edge.s) * (src.v + edge.u)


class _GatedPlain(MessagePassing):
    """sum_j sigmoid(k_i + q_j) * v_j."""
    reducer = sum_r()

    def edge(self, src, dst, edge):
        return tm.sigmoid(dst.k + src.q) * src.v


_GATED, _GATED_PLAIN = _Gated(), _GatedPlain()


def _gated_region(edge_index, settings, k, q, v, s, u):
    """ResGatedGraphConv's sigmoid-gated sum (opaque.region): rows of k."""
    name = settings[0]
    graph = relation(name, edge_index, q.size(0), k.size(0))
    if s is None:
        return _GATED_PLAIN(graph=graph, src={"q": q, "v": v}, dst={"k": k})
    _check_edges(name, "edge_attr", s, graph)
    return _GATED(graph=graph, src={"q": q, "v": v}, dst={"k": k}, edge={"s": s, "u": u})


class ResGatedGraphConv(torch.nn.Module):
    """PyG's ResGatedGraphConv: x'_i = lin_skip(x_i) + sum_{j -> i} act(k_i + q_j) * v_j
    + bias, k_i = lin_key(x_i), q_j = lin_query(x_j), v_j = lin_value(x_j); with edge_dim
    the projections read [x, e_ji] (their edge-attribute columns are applied per edge in
    torch, the node columns per node). act (default Sigmoid) is fused into the Tiga
    propagate when it is torch.nn.Sigmoid; any other module runs in torch on the gathered
    edge rows, the sum still a Tiga reduction.

    Parameter names (`lin_key.*`, `lin_query.*`, `lin_value.*`, `lin_skip.weight`, `bias`)
    are PyG's. forward(x, edge_index, edge_attr=None): x (N, F) or a pair (x_src, x_dst)
    with in_channels=(F_s, F_t); edge_attr (E, edge_dim) in the relation's edge order.
    """

    def __init__(self, in_channels, out_channels: int, act=None, edge_dim: int | None = None,
                 root_weight: bool = True, bias: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("ResGatedGraphConv", in_channels)
        if n_src < 0 or n_dst < 0:
            raise LayerArgumentError("ResGatedGraphConv: in_channels=-1 (lazy) is not "
                                     "supported; give the input widths")
        self.in_channels = in_channels
        self.out_channels = check_positive("ResGatedGraphConv", "out_channels", out_channels)
        self.act = torch.nn.Sigmoid() if act is None else act
        self.edge_dim, self.root_weight = edge_dim, root_weight
        self.flow = check_flow("ResGatedGraphConv", flow)
        extra = edge_dim or 0
        self.lin_key = torch.nn.Linear(n_dst + extra, out_channels)
        self.lin_query = torch.nn.Linear(n_src + extra, out_channels)
        self.lin_value = torch.nn.Linear(n_src + extra, out_channels)
        if root_weight:
            self.lin_skip = torch.nn.Linear(n_dst, out_channels, bias=False)
        else:
            self.lin_skip = None
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_skip):
            if lin is not None:
                lin.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_attr=None):
        """Gated sum: sum over j -> i of act(k_i + q_j) * v_j, plus the skip and bias.

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation. x_dst must not be None.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: optional edge features (E, edge_dim), needed when edge_dim is set.

        Returns:
            Tensor (N_dst, out_channels).
        """
        name = "ResGatedGraphConv"
        x_src, x_dst = node_inputs(name, x, static=False)
        if x_dst is None:
            raise LayerArgumentError(f"{name}: x_dst is None, expected the destination "
                                     "features (the keys and the skip read them)")
        adj = adjacency(name, edge_index, self.flow)
        if (edge_attr is None and self.edge_dim and adj.values is not None
                and adj.values.dim() == 2):
            edge_attr = adj.values
        k, q, v, s, u = self._projections(x_src, x_dst, edge_attr)
        if isinstance(self.act, torch.nn.Sigmoid):
            out = region(_gated_region, adj.relation, (name,), (k, q, v, s, u), ((0, 0),))
        else:
            out = self._unfused(adj, k, q, v, s, u)
        if self.lin_skip is not None:
            out = out + self.lin_skip(x_dst)
        return out if self.bias is None else out + self.bias

    def _projections(self, x_src, x_dst, edge_attr) -> tuple:
        """(k, q, v) per node and (s, u) per edge (None without edge attributes). With
        edge_dim but no edge_attr the raw features are the key, query and value (PyG)."""
        if not self.edge_dim:
            return (self.lin_key(x_dst), self.lin_query(x_src), self.lin_value(x_src),
                    None, None)
        if edge_attr is None:
            return x_dst, x_src, x_src, None, None
        nd, ns = x_dst.size(-1), x_src.size(-1)

        def split(lin, n):
            node = torch.nn.functional.linear
            return (node(x_dst if lin is self.lin_key else x_src, lin.weight[:, :n], lin.bias),
                    node(edge_attr, lin.weight[:, n:]))

        (k, ke), (q, qe), (v, ve) = (split(self.lin_key, nd), split(self.lin_query, ns),
                                     split(self.lin_value, ns))
        return k, q, v, ke + qe, ve

    def _unfused(self, adj, k, q, v, s, u):
        """Another act: the gated messages formed in torch per edge, summed by Tiga."""
        graph = relation("ResGatedGraphConv", adj.relation, q.size(0), k.size(0))
        ei = edge_index_like(graph, q)
        gate = k[ei[1]] + q[ei[0]]
        value = v[ei[0]]
        if s is not None:
            gate, value = gate + s, value + u
        return edge_reduce(graph, self.act(gate) * value, "sum")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels})"


__all__ = ["GraphConv", "ResGatedGraphConv", "weighted_aggregate"]
