"""torch_bridge: the tg.nn.GATConv and tg.nn.GATv2Conv modules (routes and shapes: gat.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..compiled import compiling
from .common import (
    check_channels,
    check_size,
    edge_index_like,
    glorot_,
    linear,
    node_pair,
    reset_glorot,
)
from .gat import (
    _AttentionBase,
    attention_region,
    attention_v2_region,
    weights_region,
    weights_v2_region,
)
from .opaque import region


def _glorot_parameter(*shape) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.empty(*shape))
    glorot_(p)
    return p


class GATConv(_AttentionBase):
    """PyG's GATConv (graph attention), as a torch module.

    x'_i = sum_j alpha_ij W x_j per head, alpha_ij = softmax over i's incoming edges of
    leaky_relu(a_src . W x_j + a_dst . W x_i (+ a_edge . W_e e_ij), negative_slope).
    Arguments, defaults and parameter names (`lin.weight` or `lin_src`/`lin_dst`,
    `att_src`, `att_dst` (1, H, C), `lin_edge`, `att_edge`, `res`, `bias`) are PyG's.
    Self loops as PyG's GATConv: existing loops removed, one loop per node appended (edge
    attributes of the loops from fill_value, default the mean of the node's incoming ones).

    forward(x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
    x (N, F) or a pair (x_src (S, F_s), x_dst (N, F_t)) with in_channels=(F_s, F_t);
    edge_index a tg.Graph or a (2, E) integer tensor [sources; targets]. Returns (N, H*C)
    with concat=True, (N, C) otherwise; with return_attention_weights=True the pair
    (out, (edge_index, alpha)): the relation with its loops (a (2, E') tensor, or a tg.Graph
    when one was given) and alpha (E', H) in that edge order (after dropout in training,
    as PyG). dropout=p drops attention weights in training mode only, scaling the kept
    ones by 1/(1-p) as F.dropout: eagerly with F.dropout's draw (PyG's mask for the same
    torch seed), inside torch.compile with a mask drawn from a seed the compiled graph
    takes from torch's generator (the same distribution; its backward uses that mask).

    Shapes (H = heads, C = out_channels, E' edges after the self loops): the projection
    lin(x) (N, H * C) is viewed as (N, H, C), head h in columns h*C..(h+1)*C-1; alpha
    (E', H) sums to 1 over each node's incoming edges per head; the output is (N, H * C)
    with the heads side by side (concat=True) or (N, C), their mean (concat=False); bias
    has the output's width.
    """

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value="mean", bias: bool = True, residual: bool = False):
        super().__init__()
        n_src, n_dst = check_channels("GATConv", in_channels)
        self._common_args(in_channels, out_channels, heads, concat, negative_slope, dropout,
                          add_self_loops, edge_dim, fill_value, residual)
        width = heads * out_channels
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = linear(n_src, width, bias=False, glorot=True)
        else:
            self.lin_src = linear(n_src, width, bias=False, glorot=True)
            self.lin_dst = linear(n_dst, width, bias=False, glorot=True)
        self.att_src = _glorot_parameter(1, heads, out_channels)
        self.att_dst = _glorot_parameter(1, heads, out_channels)
        if edge_dim is not None:
            self.lin_edge = linear(edge_dim, width, bias=False, glorot=True)
            self.att_edge = _glorot_parameter(1, heads, out_channels)
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        self.res = linear(n_dst, total, bias=False, glorot=True) if residual else None
        self.bias = torch.nn.Parameter(torch.zeros(total)) if bias else None

    def reset_parameters(self) -> None:
        reset_glorot(self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res,
                     self.att_src, self.att_dst, self.att_edge)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _project(self, x) -> tuple:
        """(x_src (S, H, C), x_dst (N, H, C), residual or None)."""
        shape = (-1, self.heads, self.out_channels)
        x_src, x_dst = node_pair("GATConv", x)
        res = None if self.res is None else self.res(x_dst)
        if self.lin is not None:
            h = self.lin(x_src).view(shape)
            return h, (h if x_dst is x_src else self.lin(x_dst).view(shape)), res
        return self.lin_src(x_src).view(shape), self.lin_dst(x_dst).view(shape), res

    def forward(self, x, edge_index, edge_attr=None, size=None,
                return_attention_weights=None):
        x_src, x_dst, res = self._project(x)
        check_size("GATConv", size, x_src.size(0), x_dst.size(0))
        a_src = (x_src * self.att_src).sum(dim=-1)
        a_dst = (x_dst * self.att_dst).sum(dim=-1)
        w_edge = None if self.lin_edge is None else self.lin_edge.weight
        tensors = (x_src, a_src, a_dst, edge_attr, w_edge, self.att_edge)
        if not self._weights_route(return_attention_weights):
            out = region(attention_region, edge_index, self._settings(), tensors, ((2, 0),))
            return self._finish(out, res, None, None)
        if compiling():
            out, where, alpha = self._compiled_weights(
                weights_region, edge_index, tensors, (2, 0), 1, return_attention_weights)
            return self._finish(out, res, where, alpha)
        graph, edge_attr = self._relation(edge_index, x_src.size(0), x_dst.size(0), edge_attr)
        e = self._edge_features(edge_attr)
        ei = edge_index_like(graph, x_src)
        score = a_src[ei[0]] + a_dst[ei[1]]
        if e is not None:
            score = score + (e * self.att_edge).sum(dim=-1)
        out, alpha = self._weighted(graph, F.leaky_relu(score, self.negative_slope), x_src)
        if not return_attention_weights:
            return self._finish(out, res, None, None)
        return self._finish(out, res, self._where(graph, edge_index, out), alpha)


class GATv2Conv(_AttentionBase):
    """PyG's GATv2Conv (dynamic attention), as a torch module.

    x'_i = sum_j alpha_ij x_l[j] per head, x_l = lin_l(x_j), x_r = lin_r(x_i), alpha_ij =
    softmax over i's incoming edges of att . leaky_relu(x_l[j] + x_r[i] (+ lin_edge(e_ij))).
    Arguments, defaults and parameter names (`lin_l`, `lin_r` with bias=bias, `att`
    (1, H, C), `lin_edge`, `res`, `bias`) are PyG's; share_weights=True makes lin_r lin_l.
    Self loops, return_attention_weights and shapes as GATConv: x_l, x_r (N, H, C),
    alpha (E', H), output (N, H * C) with concat=True, else (N, C).

    forward(x, edge_index, edge_attr=None, return_attention_weights=None).
    """

    kind = "v2"

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value="mean", bias: bool = True, share_weights: bool = False,
                 residual: bool = False):
        super().__init__()
        n_src, n_dst = check_channels("GATv2Conv", in_channels)
        self._common_args(in_channels, out_channels, heads, concat, negative_slope, dropout,
                          add_self_loops, edge_dim, fill_value, residual)
        self.share_weights = share_weights
        width = heads * out_channels
        self.lin_l = linear(n_src, width, bias=bias, glorot=True)
        self.lin_r = (self.lin_l if share_weights else
            linear(n_dst, width, bias=bias, glorot=True))
        self.att = _glorot_parameter(1, heads, out_channels)
        self.lin_edge = (None if edge_dim is None else
            linear(edge_dim, width, bias=False, glorot=True))
        total = out_channels * (heads if concat else 1)
        self.res = linear(n_dst, total, bias=False, glorot=True) if residual else None
        self.bias = torch.nn.Parameter(torch.zeros(total)) if bias else None

    def reset_parameters(self) -> None:
        reset_glorot(self.lin_l, self.lin_r, self.lin_edge, self.res, self.att)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        shape = (-1, self.heads, self.out_channels)
        x_src, x_dst = node_pair("GATv2Conv", x)
        res = None if self.res is None else self.res(x_dst)
        x_l = self.lin_l(x_src).view(shape)
        x_r = x_l if self.share_weights and x_dst is x_src else self.lin_r(x_dst).view(shape)
        w_edge = None if self.lin_edge is None else self.lin_edge.weight
        tensors = (x_l, x_r, self.att, edge_attr, w_edge)
        if not self._weights_route(return_attention_weights):
            out = region(attention_v2_region, edge_index, self._settings(), tensors, ((1, 0),))
            return self._finish(out, res, None, None)
        if compiling():
            out, where, alpha = self._compiled_weights(
                weights_v2_region, edge_index, tensors, (1, 0), 0, return_attention_weights)
            return self._finish(out, res, where, alpha)
        graph, edge_attr = self._relation(edge_index, x_l.size(0), x_r.size(0), edge_attr)
        e = self._edge_features(edge_attr)
        ei = edge_index_like(graph, x_l)
        z = x_l[ei[0]] + x_r[ei[1]]
        if e is not None:
            z = z + e
        score = (F.leaky_relu(z, self.negative_slope) * self.att).sum(dim=-1)
        out, alpha = self._weighted(graph, score, x_l)
        if not return_attention_weights:
            return self._finish(out, res, None, None)
        return self._finish(out, res, self._where(graph, edge_index, out), alpha)
