"""torch_bridge: tg.nn.GENConv (DeeperGCN's generalised graph convolution) and
tg.nn.MessageNorm, PyG's, with the aggregation (softmax, powermean or any tg.nn.aggr) run
by Tiga.

Without edge attributes a message relu(x_j) + eps depends on its source alone, so the
aggregation is one Tiga propagate over the relation with those source rows (no per-edge
tensor); with edge attributes the messages relu(x_j + e_ji) + eps are formed per edge in
torch and reduced into their destinations by the same aggregation over the edges ->
destinations relation (pna.edges_to_destinations).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .aggr import MultiAggregation, over, resolve
from .common import LayerArgumentError, check_positive, relation
from .inputs import (
    adjacency,
    check_flow,
    check_in_channels,
    check_size,
    make_linear,
    node_count,
    node_inputs,
)
from .pna import edges_to_destinations


class MessageNorm(torch.nn.Module):
    """PyG's MessageNorm: normalize(msg) * ||x|| * scale (p-norms over the last axis);
    `scale` (1,) starts at 1, learned with learn_scale=True."""

    def __init__(self, learn_scale: bool = False):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1), requires_grad=learn_scale)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.fill_(1.0)

    def forward(self, x, msg, p: float = 2.0):
        """The messages scaled to the norm of x: normalize(msg) * ||x|| * scale, per row.

        Args:
            x: node features (N, F).
            msg: aggregated messages (N, F').
            p: the norm's order.

        Returns:
            Tensor (N, F').
        """
        return F.normalize(msg, p=p, dim=-1) * x.norm(p=p, dim=-1, keepdim=True) * self.scale

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learn_scale={self.scale.requires_grad})"


NORMS = ("batch", "layer", "instance")


def _mlp(channels: list, norm, bias: bool) -> torch.nn.Sequential:
    """GENConv's MLP with PyG's module order (its state dict indices): Linear, then, for
    each hidden layer, norm, ReLU, Dropout(0) before the next Linear."""
    modules = []
    for i in range(1, len(channels)):
        modules.append(torch.nn.Linear(channels[i - 1], channels[i], bias=bias))
        if i < len(channels) - 1:
            c = channels[i]
            if norm == "batch":
                modules.append(torch.nn.BatchNorm1d(c, affine=True))
            elif norm == "layer":
                modules.append(torch.nn.LayerNorm(c, elementwise_affine=True))
            elif norm == "instance":
                modules.append(torch.nn.InstanceNorm1d(c, affine=False))
            elif norm:
                raise LayerArgumentError(f"GENConv: norm is {norm!r}, expected one of "
                                         f"{NORMS} or None")
            modules += [torch.nn.ReLU(), torch.nn.Dropout(0.0)]
    return torch.nn.Sequential(*modules)


class GENConv(torch.nn.Module):
    """PyG's GENConv: x'_i = mlp(x_i + aggr_{j -> i}(relu(x_j + e_ji) + eps)), with x_j
    through lin_src, e_ji through lin_edge and x_i through lin_dst where their widths
    differ from out_channels; msg_norm=True rescales the aggregate by MessageNorm (against
    the destination's input features); a list aggr (concatenated) is mapped back by
    lin_aggr_out.

    Arguments and parameter names (`aggr_module.*`, `lin_src`, `lin_edge`, `lin_dst`,
    `lin_aggr_out`, `mlp.<k>`, `msg_norm.scale`) are PyG's; aggr "softmax" (t, learn_t),
    "softmax_sg", "powermean"/"power" (p, learn_p), any tg.nn.aggr name, a list or an
    aggregation module; -1 widths (and edge_dim=-1) are lazy. forward(x, edge_index,
    edge_attr=None, size=None): x (N, F) or a pair (x_src, x_dst), x_dst None allowed;
    edge_attr (E, edge_dim) in the relation's edge order (a torch.sparse adj_t's 2-D
    values when not given).
    """

    def __init__(self, in_channels, out_channels: int, aggr="softmax", t: float = 1.0,
                 learn_t: bool = False, p: float = 1.0, learn_p: bool = False,
                 msg_norm: bool = False, learn_msg_scale: bool = False, norm: str = "batch",
                 num_layers: int = 2, expansion: int = 2, eps: float = 1e-7,
                 bias: bool = False, edge_dim: int | None = None,
                 aggr_kwargs: dict | None = None, flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("GENConv", in_channels)
        self.in_channels, self.aggr = in_channels, aggr
        self.out_channels = check_positive("GENConv", "out_channels", out_channels)
        self.eps, self.flow = eps, check_flow("GENConv", flow)
        name, kwargs = _aggregation(aggr, t, learn_t, p, learn_p, aggr_kwargs)
        self.aggr_module = resolve(name, **kwargs)
        if n_src != out_channels:
            self.lin_src = make_linear(n_src, out_channels, bias=bias, glorot=False)
        if edge_dim is not None and edge_dim != out_channels:
            self.lin_edge = make_linear(edge_dim, out_channels, bias=bias, glorot=False)
        width = out_channels
        if isinstance(self.aggr_module, MultiAggregation):
            width = self.aggr_module.get_out_channels(out_channels)
        if width != out_channels:
            self.lin_aggr_out = torch.nn.Linear(width, out_channels, bias=bias)
        if n_dst != out_channels:
            self.lin_dst = make_linear(n_dst, out_channels, bias=bias, glorot=False)
        channels = [out_channels] + [out_channels * expansion] * (num_layers - 1)
        self.mlp = _mlp(channels + [out_channels], norm, bias)
        if msg_norm:
            self.msg_norm = MessageNorm(learn_msg_scale)

    def reset_parameters(self) -> None:
        self.aggr_module.reset_parameters()
        for child in self.modules():
            if child is not self and child is not self.aggr_module and hasattr(
                    child, "reset_parameters"):
                child.reset_parameters()

    def forward(self, x, edge_index, edge_attr=None, size=None):
        """mlp(aggregate of relu(x_j + e_ji) + eps, normalized with msg_norm, plus x_i).

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation. x_dst may be None with `size`.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: optional edge features (E, F) (edge_dim wide when edge_dim is set).
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, out_channels).
        """
        x_src, x_dst = node_inputs("GENConv", x, static=False)
        adj = adjacency("GENConv", edge_index, self.flow)
        n_dst = adj.num_dst("GENConv", size, x_dst)
        check_size("GENConv", size, node_count(x_src), n_dst)
        if edge_attr is None and adj.values is not None and adj.values.dim() >= 2:
            edge_attr = adj.values
        h_src = self.lin_src(x_src) if hasattr(self, "lin_src") else x_src
        graph = relation("GENConv", adj.relation, h_src.size(0), n_dst)
        if edge_attr is None:
            out = over(self.aggr_module, graph, h_src.relu() + self.eps)
        else:
            out = self._with_edges(graph, h_src, edge_attr)
        if hasattr(self, "lin_aggr_out"):
            out = self.lin_aggr_out(out)
        if hasattr(self, "msg_norm"):
            out = self.msg_norm(x_dst if x_dst is not None else x_src, out)
        if x_dst is not None:
            out = out + (self.lin_dst(x_dst) if hasattr(self, "lin_dst") else x_dst)
        return self.mlp(out)

    def _with_edges(self, graph, h_src, edge_attr):
        """The aggregate of relu(x_j + e_ji) + eps, formed per edge in torch."""
        if edge_attr.size(0) != graph.num_edges:
            raise LayerArgumentError(f"GENConv: edge_attr has {edge_attr.size(0)} rows, "
                                     f"expected {graph.num_edges} (one per edge)")
        e = self.lin_edge(edge_attr) if hasattr(self, "lin_edge") else edge_attr
        if e.size(-1) != h_src.size(-1):
            raise LayerArgumentError(f"GENConv: edge features have width {e.size(-1)}, "
                                     f"the messages {h_src.size(-1)}: give edge_dim")
        edges, ei = edges_to_destinations(graph)
        src = torch.tensor(ei[0], device=h_src.device)    # (the memo's array is read-only)
        return over(self.aggr_module, edges, (h_src[src] + e).relu() + self.eps)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr})")


def _aggregation(aggr, t, learn_t, p, learn_p, aggr_kwargs) -> tuple:
    """(aggr, kwargs) for resolve(): GENConv's aliases and default kwargs."""
    semi_grad = aggr == "softmax_sg"
    if isinstance(aggr, str):
        aggr = {"softmax_sg": "softmax", "power": "powermean"}.get(aggr, aggr)
    if aggr_kwargs is None:
        aggr_kwargs = {}
        if aggr == "softmax":
            aggr_kwargs = {"t": t, "learn": learn_t, "semi_grad": semi_grad}
        elif aggr == "powermean":
            aggr_kwargs = {"p": p, "learn": learn_p}
    return aggr, aggr_kwargs


__all__ = ["GENConv", "MessageNorm"]
