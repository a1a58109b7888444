"""torch_bridge: tg.nn.TransformerConv, PyG's graph transformer layer (scaled dot-product
attention over each destination's incoming edges) with the softmax aggregation run by Tiga.

As GATConv (gat.py): without attention weights to return and without attention dropout in
training the layer is one Tiga propagate with the online_softmax reducer (the scores are
formed in the edge function, no per-edge weight is stored); otherwise the per-edge scores
are formed in torch, normalised by Tiga reductions (gat.edge_softmax) and the weighted
values summed by Tiga. `out` comes from the fused propagate whenever no dropout applies,
so return_attention_weights=True returns the plain forward's output bit for bit.

Shapes (H heads, C = out_channels): queries (N, H, C) from x_dst, keys and values (S, H, C)
from x_src, lin_edge(edge_attr) (E, H, C) added to both keys and values; scores (E, H).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...core.graph import Graph
from ...core.reducers import online_softmax
from ...trace import math as tm
from ...trace.message_passing import MessagePassing
from .common import WEIGHTED_SUM, LayerArgumentError, edge_index_like, edge_reduce, relation
from .gat import edge_softmax
from .inputs import adjacency, check_flow, check_in_channels, make_linear, node_inputs, sparse_like
from .opaque import region


class _Attention(MessagePassing):
    """softmax_j (q_i . (k_j + e_ji)) weighting v_j + e_ji, per head (q pre-scaled)."""

    def __init__(self):
        super().__init__()
        self.reducer = online_softmax()

    def edge(self, src, dst, edge):
        k, v = src.k, src.v
        if "e" in edge:
            k, v = k + edge.e, v + edge.e
        return self.reducer(tm.sum(dst.q * k, axis=-1), v)


_ATTENTION = _Attention()


def _graph(edge_index, q, k, e):
    graph = relation("TransformerConv", edge_index, k.size(0), q.size(0))
    if e is not None and e.size(0) != graph.num_edges:
        raise LayerArgumentError(f"TransformerConv: edge_attr has {e.size(0)} rows, "
                                 f"expected {graph.num_edges} (one per edge)")
    return graph


def _fused_region(edge_index, settings, q, k, v, e):
    """The attention aggregation (opaque.region): (N, H, C) rows of q."""
    graph = _graph(edge_index, q, k, e)
    return _ATTENTION(graph=graph, src={"k": k, "v": v}, dst={"q": q},
                      edge={} if e is None else {"e": e})


class TransformerConv(torch.nn.Module):
    """PyG's TransformerConv: x'_i = W_skip x_i + sum_{j -> i} alpha_ij (W_v x_j + W_e e_ji),
    alpha_ij = softmax over i's incoming edges of (W_q x_i) . (W_k x_j + W_e e_ji) / sqrt(C),
    per head; beta=True gates the skip: b = sigmoid(lin_beta([out, skip, out - skip])),
    x' = b skip + (1 - b) out. No self loops (as PyG).

    Arguments and parameter names (`lin_key`, `lin_query`, `lin_value` (bias=bias),
    `lin_edge` (no bias), `lin_skip` (always present, used with root_weight), `lin_beta`)
    are PyG's; -1 widths are lazy. forward(x, edge_index, edge_attr=None,
    return_attention_weights=None): x (N, F) or a pair (x_src, x_dst) with
    in_channels=(F_s, F_t); edge_index a tg.Graph, a (2, E) integer tensor or a
    torch.sparse adj_t. Returns (N, H*C) (concat=True) or (N, C) (the mean over heads);
    with return_attention_weights=True the pair (out, (edge_index, alpha (E, H))), a
    sparse adj_t (N, S, H) of alpha for a sparse input, alpha after dropout in training.
    dropout=p drops attention weights in training mode (F.dropout's draw, PyG's mask for
    the same seed).
    """

    _alpha = None     # PyG's attribute (it stores alpha between calls; always None here)

    def __init__(self, in_channels, out_channels: int, heads: int = 1, concat: bool = True,
                 beta: bool = False, dropout: float = 0.0, edge_dim: int | None = None,
                 bias: bool = True, root_weight: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        name = "TransformerConv"
        n_src, n_dst = check_in_channels(name, in_channels)
        for arg, value in (("out_channels", out_channels), ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise LayerArgumentError(f"{name}: {arg} is {value!r}, expected a positive "
                                         "int")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.beta = concat, beta and root_weight
        self.dropout, self.edge_dim, self.root_weight = float(dropout), edge_dim, root_weight
        self.flow = check_flow(name, flow)
        width = heads * out_channels
        self.lin_key = make_linear(n_src, width, bias=bias, glorot=False)
        self.lin_query = make_linear(n_dst, width, bias=bias, glorot=False)
        self.lin_value = make_linear(n_src, width, bias=bias, glorot=False)
        if edge_dim is not None:
            self.lin_edge = torch.nn.Linear(edge_dim, width, bias=False)
        else:
            self.register_module("lin_edge", None)
        out = width if concat else out_channels
        self.lin_skip = make_linear(n_dst, out, bias=bias, glorot=False)
        if self.beta:
            self.lin_beta = torch.nn.Linear(3 * out, 1, bias=False)
        else:
            self.register_module("lin_beta", None)

    def reset_parameters(self) -> None:
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge,
                    self.lin_skip, self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        """Scaled dot-product attention of each destination's query over its sources' keys and
        values, per head.

        Args:
            x: node features (N, F_in), or a pair (x_src, x_dst) of them for a bipartite
                relation. x_dst must not be None.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: optional edge features (E, edge_dim), needed when edge_dim is set (added
                to keys and values).
            return_attention_weights: True to return the attention weights too.

        Returns:
            Tensor (N_dst, heads * out_channels) with concat=True, else (N_dst, out_channels);
                with return_attention_weights, (out, (edge_index, alpha)), alpha (E, heads).
        """
        x_src, x_dst = node_inputs("TransformerConv", x, static=False)
        if x_dst is None:
            raise LayerArgumentError("TransformerConv: x_dst is None, expected the "
                                     "destination features (the queries read them)")
        adj = adjacency("TransformerConv", edge_index, self.flow)
        h, c = self.heads, self.out_channels
        q = self.lin_query(x_dst).view(-1, h, c) / math.sqrt(c)
        k = self.lin_key(x_src).view(-1, h, c)
        v = self.lin_value(x_src).view(-1, h, c)
        if edge_attr is None and adj.values is not None and adj.values.dim() >= 2:
            edge_attr = adj.values      # a torch.sparse adj_t's edge features (PyG)
        if self.lin_edge is not None and edge_attr is None:
            raise LayerArgumentError("TransformerConv: edge_attr is None, but the layer has "
                                     "edge_dim set: give the edge features (E, edge_dim)")
        e = None
        if self.lin_edge is not None:
            e = self.lin_edge(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
            e = e.view(-1, h, c)
        dropping = self.training and self.dropout > 0.0
        alpha = where = None
        if dropping or return_attention_weights:
            out, where, alpha = self._per_edge(adj, q, k, v, e, dropping)
        if not dropping:
            out = region(_fused_region, adj.relation, (), (q, k, v, e), ((0, 0),))
        out = out.reshape(-1, h * c) if self.concat else out.mean(dim=1)
        if self.root_weight:
            skip = self.lin_skip(x_dst)
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, skip, out - skip], dim=-1)))
                out = b * skip + (1 - b) * out
            else:
                out = out + skip
        return (out, (where, alpha)) if return_attention_weights else out

    def _per_edge(self, adj, q, k, v, e, dropping: bool) -> tuple:
        """(out (N, H, C), the relation as given back, alpha (E, H)) with the scores formed
        per edge in torch and the softmax and sums in Tiga."""
        graph = _graph(adj.relation, q, k, e)
        ei = edge_index_like(graph, q)
        key, value = k[ei[0]], v
        if e is not None:
            key = key + e
        alpha = edge_softmax(graph, (q[ei[1]] * key).sum(dim=-1), ei[1])
        if dropping:
            alpha = F.dropout(alpha, p=self.dropout)
        out = WEIGHTED_SUM(graph=graph, src={"h": value}, edge={"w": alpha.unsqueeze(-1)})
        if e is not None:
            out = out + edge_reduce(graph, alpha.unsqueeze(-1) * e, "sum")
        if adj.sparse is not None:
            where = sparse_like(adj.sparse, ei, alpha)
        elif isinstance(adj.relation, Graph):
            where = graph
        else:
            where = ei.flip(0) if self.flow == "target_to_source" else ei
        return out, where, alpha

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")


__all__ = ["TransformerConv"]
