"""torch_bridge: the tg.nn.GATConv and tg.nn.GATv2Conv modules (routes and shapes: gat.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.errors import ShapeError
from .common import glorot_, reset_glorot
from .gat import (
    _AttentionBase,
    attention_region,
    attention_v2_region,
    weights_region,
    weights_v2_region,
)
from .inputs import adjacency, check_in_channels, check_size, make_linear, node_inputs


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
    x (N, F) or a pair (x_src (S, F_s), x_dst (N, F_t)) with in_channels=(F_s, F_t), x_dst
    None allowed (then the scores have no destination term and size= gives N); -1 widths
    are lazy. edge_index a tg.Graph, a (2, E) integer tensor [sources; targets]
    (flow="target_to_source": [targets; sources]) or a torch.sparse adj_t (N, S). Returns
    (N, H*C) with concat=True, (N, C) otherwise; with return_attention_weights=True the pair
    (out, (edge_index, alpha)): the relation with its loops (a (2, E') tensor, a tg.Graph
    when one was given, a sparse adj_t (N, S, H) of alpha for a sparse one) and alpha
    (E', H) in that edge order (after dropout in training, as PyG). `out` is then the
    plain forward's output bit for bit (without attention dropout in training it comes
    from the same fused propagate; alpha is formed beside it). dropout=p drops attention
    weights in training mode only, scaling the kept ones by 1/(1-p) as F.dropout: eagerly
    with F.dropout's draw (PyG's mask for the same torch seed), inside torch.compile with a
    mask drawn from a seed the compiled graph takes from torch's generator (the same
    distribution; its backward uses that mask).

    Shapes (H = heads, C = out_channels, E' edges after the self loops): the projection
    lin(x) (N, H * C) is viewed as (N, H, C), head h in columns h*C..(h+1)*C-1; alpha
    (E', H) sums to 1 over each node's incoming edges per head; the output is (N, H * C)
    with the heads side by side (concat=True) or (N, C), their mean (concat=False); bias
    has the output's width.
    """

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value="mean", bias: bool = True, residual: bool = False,
                 flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("GATConv", in_channels)
        self._common_args(in_channels, out_channels, heads, concat, negative_slope, dropout,
                          add_self_loops, edge_dim, fill_value, residual, flow)
        width = heads * out_channels
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = make_linear(n_src, width, bias=False, glorot=True)
        else:
            self.lin_src = make_linear(n_src, width, bias=False, glorot=True)
            self.lin_dst = make_linear(n_dst, width, bias=False, glorot=True)
        self.att_src = _glorot_parameter(1, heads, out_channels)
        self.att_dst = _glorot_parameter(1, heads, out_channels)
        if edge_dim is not None:
            self.lin_edge = make_linear(edge_dim, width, bias=False, glorot=True)
            self.att_edge = _glorot_parameter(1, heads, out_channels)
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        total = out_channels * (heads if concat else 1)
        self.res = make_linear(n_dst, total, bias=False, glorot=True) if residual else None
        self.bias = torch.nn.Parameter(torch.zeros(total)) if bias else None

    def reset_parameters(self) -> None:
        reset_glorot(self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res,
                     self.att_src, self.att_dst, self.att_edge)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _project(self, x) -> tuple:
        """(x_src (S, H, C), x_dst (N, H, C) or None, residual or None)."""
        x_src, x_dst = node_inputs("GATConv", x, static=False)
        res = None if self.res is None or x_dst is None else self.res(x_dst)
        lin_src = self.lin if self.lin is not None else self.lin_src
        lin_dst = self.lin if self.lin is not None else self.lin_dst
        h = self._heads(lin_src(x_src))
        if x_dst is None:
            return h, None, res
        return h, (h if x_dst is x_src and lin_dst is lin_src else
                   self._heads(lin_dst(x_dst))), res

    def forward(self, x, edge_index, edge_attr=None, size=None,
                return_attention_weights=None):
        """Attention-weighted sum of the projected source rows, per head.

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation (x_dst may be None with `size`).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: optional edge features (E, edge_dim) (needs edge_dim); the added self
                loops get fill_value's.
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.
            return_attention_weights: True to return the attention weights too.

        Returns:
            Tensor (N_dst, heads * out_channels) with concat=True, else (N_dst, out_channels);
                with return_attention_weights, (out, (edge_index, alpha)): the edges used (self
                loops included; a torch.sparse adjacency for a sparse input) and alpha (E',
                heads).
        """
        x_src, x_dst, res = self._project(x)
        adj = adjacency("GATConv", edge_index, self.flow)
        n_dst = x_dst.size(0) if x_dst is not None else adj.num_dst("GATConv", size, None)
        check_size("GATConv", size, x_src.size(0), n_dst)
        a_src = (x_src * self.att_src).sum(dim=-1)
        # without x_dst the scores have no destination term (PyG's alpha_i None): + 0
        if x_dst is None:
            a_dst = a_src.new_zeros((n_dst, self.heads))
        else:
            a_dst = (x_dst * self.att_dst).sum(dim=-1)
        w_edge = None if self.lin_edge is None else self.lin_edge.weight
        tensors = (x_src, a_src, a_dst, edge_attr, w_edge, self.att_edge)

        def scores(ei, e):
            score = a_src[ei[0]] + a_dst[ei[1]]
            if e is not None:
                score = score + (e * self.att_edge).sum(dim=-1)
            return F.leaky_relu(score, self.negative_slope)
        return self._attend(adj, (attention_region, weights_region), tensors, (2, 0), 1,
                            res, return_attention_weights, (x_src, a_dst, edge_attr, scores))


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
                 residual: bool = False, flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("GATv2Conv", in_channels)
        self._common_args(in_channels, out_channels, heads, concat, negative_slope, dropout,
                          add_self_loops, edge_dim, fill_value, residual, flow)
        self.share_weights = share_weights
        width = heads * out_channels
        self.lin_l = make_linear(n_src, width, bias=bias, glorot=True)
        self.lin_r = (self.lin_l if share_weights else
            make_linear(n_dst, width, bias=bias, glorot=True))
        self.att = _glorot_parameter(1, heads, out_channels)
        self.lin_edge = (None if edge_dim is None else
            make_linear(edge_dim, width, bias=False, glorot=True))
        total = out_channels * (heads if concat else 1)
        self.res = make_linear(n_dst, total, bias=False, glorot=True) if residual else None
        self.bias = torch.nn.Parameter(torch.zeros(total)) if bias else None

    def reset_parameters(self) -> None:
        reset_glorot(self.lin_l, self.lin_r, self.lin_edge, self.res, self.att)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        """Attention (scores from the summed projections) over the source rows, per head.

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation. x_dst must not be None.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: optional edge features (E, edge_dim) (needs edge_dim).
            return_attention_weights: True to return the attention weights too.

        Returns:
            Tensor (N_dst, heads * out_channels) with concat=True, else (N_dst, out_channels);
                with return_attention_weights, (out, (edge_index, alpha)), alpha (E', heads).
        """
        x_src, x_dst = node_inputs("GATv2Conv", x, static=False)
        if x_dst is None:
            raise ShapeError("GATv2Conv: x_dst is None, expected a tensor (the scores "
                             "need the destination rows)")
        res = None if self.res is None else self.res(x_dst)
        x_l = self._heads(self.lin_l(x_src))
        x_r = x_l
        if not (self.share_weights and x_dst is x_src):
            x_r = self._heads(self.lin_r(x_dst))
        adj = adjacency("GATv2Conv", edge_index, self.flow)
        w_edge = None if self.lin_edge is None else self.lin_edge.weight
        tensors = (x_l, x_r, self.att, edge_attr, w_edge)

        def scores(ei, e):
            z = x_l[ei[0]] + x_r[ei[1]]
            if e is not None:
                z = z + e
            return (F.leaky_relu(z, self.negative_slope) * self.att).sum(dim=-1)
        return self._attend(adj, (attention_v2_region, weights_v2_region), tensors, (1, 0),
                            0, res, return_attention_weights, (x_l, x_r, edge_attr, scores))
