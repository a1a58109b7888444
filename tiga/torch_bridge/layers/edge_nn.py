"""torch_bridge: tg.nn.NNConv and tg.nn.PointNetConv, PyG's layers whose message is a torch
network applied per edge (an edge-conditioned weight matrix, a local PointNet). The
network runs in torch on the gathered edge rows, as it must (any torch module); the
reduction of the messages into each destination is a Tiga propagate."""
from __future__ import annotations

import math
import operator

import torch

from ...core.graph import Graph
from .aggr import fused_names, resolve
from .common import (
    REDUCERS,
    LayerArgumentError,
    check_positive,
    edge_index_like,
    edge_reduce,
    loop_edit,
    relation,
    reset_children,
)
from .inputs import (
    adjacency,
    check_flow,
    check_in_channels,
    check_size,
    make_linear,
    node_count,
    node_inputs,
)
from .opaque import region


def reduce_messages(aggr, graph, msgs, ei):
    """Per-edge messages (E, ...) reduced into the relation's destinations: one Tiga
    reduction for a single named reducer, else the aggregation module grouped by
    destination (its own Tiga reductions)."""
    names = fused_names(aggr)
    if names in REDUCERS:
        return edge_reduce(graph, msgs, names)
    return aggr(msgs, ei[1], dim_size=graph.num_dst, dim=0)


def _opaque(edge_index) -> bool:
    """Whether the relation argument can be an opaque op's (a tg.Graph or a tensor)."""
    return isinstance(edge_index, (Graph, torch.Tensor))


def edge_count(edge_index):
    """The relation's edge count where it is known before the op runs."""
    if isinstance(edge_index, Graph):
        return int(edge_index.num_edges)
    return operator.index(edge_index.size(1))


def edge_order_region(edge_index, settings, x_src, x_dst):
    """The relation's edge_index (2, E) in its edge order (opaque.region)."""
    graph = relation(settings[0], edge_index, x_src.size(0), x_dst.size(0))
    return edge_index_like(graph, x_src)


def _reduce_region(edge_index, settings, msgs, x_src, x_dst):
    """Per-edge messages reduced into the relation's destinations (opaque.region): rows of
    x_dst."""
    name, reducer = settings
    graph = relation(name, edge_index, x_src.size(0), x_dst.size(0))
    return edge_reduce(graph, msgs, reducer)


class NNConv(torch.nn.Module):
    """PyG's NNConv (edge-conditioned convolution, ECC):
    x'_i = lin(x_i) + aggr_{j -> i} x_j . reshape(nn(e_ji), (in, out)) + bias.

    Parameter names (`nn.*`, `lin.weight` (root_weight), `bias`) and arguments are PyG's;
    aggr ("add" default) a name, a list or an aggregation module. forward(x, edge_index,
    edge_attr=None, size=None): x (N, F) or a pair (x_src, x_dst) (x_dst None: no root
    term, size= gives the destinations); edge_attr (E, D) in the relation's edge order,
    or a torch.sparse adj_t's values.
    """

    def __init__(self, in_channels, out_channels: int, nn: torch.nn.Module, aggr="add",
                 root_weight: bool = True, bias: bool = True, aggr_kwargs: dict | None = None,
                 flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("NNConv", in_channels)
        if n_src < 0:
            raise LayerArgumentError("NNConv: in_channels=-1 (lazy) is not supported for "
                                     "the sources (nn's output width depends on it)")
        self.in_channels = in_channels
        self.in_channels_l = n_src
        self.out_channels = check_positive("NNConv", "out_channels", out_channels)
        self.nn, self.root_weight = nn, root_weight
        self.flow = check_flow("NNConv", flow)
        self.aggr = aggr if isinstance(aggr, (str, list, tuple)) else type(aggr).__name__
        try:
            self.aggr_module = resolve(aggr, **dict(aggr_kwargs or {}))
        except LayerArgumentError as exc:
            raise LayerArgumentError(f"NNConv: {exc}") from exc
        if root_weight:
            self.lin = make_linear(n_dst, out_channels, bias=False, glorot=False)
            self._uniform(self.lin)
        else:
            self.register_module("lin", None)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    @staticmethod
    def _uniform(lin) -> None:
        """PyG's 'uniform' initialiser: U(-1/sqrt(in), 1/sqrt(in))."""
        if getattr(lin, "in_features", 0) > 0 and not isinstance(
                lin.weight, torch.nn.parameter.UninitializedParameter):
            bound = 1.0 / math.sqrt(lin.in_features)
            torch.nn.init.uniform_(lin.weight, -bound, bound)

    def reset_parameters(self) -> None:
        reset_children(self.nn)
        self.aggr_module.reset_parameters()
        if self.lin is not None:
            self._uniform(self.lin)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_attr=None, size=None):
        """aggr over j -> i of x_j times the (F_in, out_channels) matrix nn(e_ji), plus the root
        term.

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation. x_dst may be None with `size`.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: edge features (E, D) that nn maps to F_in * out_channels weights (a
                torch.sparse adj_t's values when None).
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, out_channels).
        """
        x_src, x_dst = node_inputs("NNConv", x, static=False)
        adj = adjacency("NNConv", edge_index, self.flow)
        n_dst = adj.num_dst("NNConv", size, x_dst)
        check_size("NNConv", size, node_count(x_src), n_dst)
        if edge_attr is None:
            edge_attr = adj.values
        if edge_attr is None:
            raise LayerArgumentError("NNConv: edge_attr is None, expected the edge features "
                                     "(E, D) its nn maps to weights")
        names = fused_names(self.aggr_module)
        if x_dst is not None and names in REDUCERS and _opaque(adj.relation):
            # the relation work as two opaque ops inside torch.compile (no graph break):
            # its edge order, then the reduction of the messages formed here in torch
            ei = region(edge_order_region, adj.relation, ("NNConv",), (x_src, x_dst),
                        (("edge_index", edge_count(adj.relation)),))
            msgs = self._messages(x_src, ei, edge_attr)
            out = region(_reduce_region, adj.relation, ("NNConv", names),
                         (msgs, x_src, x_dst), ((2, 0, (self.out_channels,)),))
        else:
            graph = relation("NNConv", adj.relation, x_src.size(0), n_dst)
            ei = edge_index_like(graph, x_src)
            msgs = self._messages(x_src, ei, edge_attr)
            out = reduce_messages(self.aggr_module, graph, msgs, ei)
        if x_dst is not None and self.lin is not None:
            out = out + self.lin(x_dst)
        return out if self.bias is None else out + self.bias

    def _messages(self, x_src, ei, edge_attr):
        """x_j . reshape(nn(e_ji), (in, out)) per edge, in the relation's edge order."""
        if edge_attr.size(0) != ei.size(1):
            raise LayerArgumentError(f"NNConv: edge_attr has {edge_attr.size(0)} rows, "
                                     f"expected {ei.size(1)} (one per edge)")
        weight = self.nn(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
        weight = weight.view(-1, self.in_channels_l, self.out_channels)
        return torch.matmul(x_src[ei[0]].unsqueeze(1), weight).squeeze(1)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr}, nn={self.nn})")


class PointNetConv(torch.nn.Module):
    """PyG's PointNetConv (PointNet set layer): x'_i = global_nn(max_{j -> i}
    local_nn([x_j, pos_j - pos_i])), each network optional (then the identity), x optional
    (then the messages are the offsets alone). add_self_loops=True replaces the relation's
    self loops by one loop per node (i < min(#sources, #destinations)), as PyG.

    Parameter names (`local_nn.*`, `global_nn.*`) are PyG's. forward(x, pos, edge_index):
    x (N, F), a pair (x_src, x_dst) whose x_dst is not read, or None; pos (N, 3) or a
    pair (pos_src, pos_dst) (bipartite); edge_index a tg.Graph, a (2, E) integer tensor
    or a torch.sparse adj_t.
    """

    def __init__(self, local_nn: torch.nn.Module | None = None,
                 global_nn: torch.nn.Module | None = None, add_self_loops: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        self.local_nn, self.global_nn = local_nn, global_nn
        self.add_self_loops = add_self_loops
        self.flow = check_flow("PointNetConv", flow)

    def reset_parameters(self) -> None:
        for net in (self.local_nn, self.global_nn):
            if net is not None:
                reset_children(net)

    def forward(self, x, pos, edge_index):
        """global_nn(max over j -> i of local_nn([x_j, pos_j - pos_i])).

        Args:
            x: optional source features (N_src, F) (or a pair whose first is used; None:
                positions only).
            pos: positions (N, D), or a pair (pos_src, pos_dst).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.

        Returns:
            Tensor (N_dst, F_out), F_out the width global_nn (else local_nn) gives.
        """
        x_src = x[0] if isinstance(x, (tuple, list)) else x
        pos_src, pos_dst = node_inputs("PointNetConv", pos, static=False)
        if pos_dst is None:
            raise LayerArgumentError("PointNetConv: pos_dst is None, expected the "
                                     "destination positions")
        adj = adjacency("PointNetConv", edge_index, self.flow)
        graph = relation("PointNetConv", adj.relation, pos_src.size(0), pos_dst.size(0))
        if self.add_self_loops:
            graph = loop_edit(graph, "replace")[0]
        ei = edge_index_like(graph, pos_src)
        msgs = pos_src[ei[0]] - pos_dst[ei[1]]
        if x_src is not None:
            msgs = torch.cat([x_src[ei[0]], msgs], dim=-1)
        if self.local_nn is not None:
            msgs = self.local_nn(msgs)
        out = edge_reduce(graph, msgs, "max")
        return out if self.global_nn is None else self.global_nn(out)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(local_nn={self.local_nn}, "
                f"global_nn={self.global_nn})")


__all__ = ["NNConv", "PointNetConv", "edge_count", "edge_order_region", "reduce_messages"]
