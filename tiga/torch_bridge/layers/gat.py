"""torch_bridge: tg.nn.GATConv and tg.nn.GATv2Conv, PyG's attention layers with the softmax
aggregation run by Tiga.

Without attention weights to return (and without attention dropout in training) a layer is
one Tiga propagate with the online_softmax reducer: scores are formed in the edge function
and no per-edge weight is ever stored. return_attention_weights=True (or dropout > 0 in
training) forms the per-edge scores in torch, normalises them with two Tiga reductions
(maximum and sum per destination) and aggregates the weighted sources with a third.
Inside torch.compile either route is one opaque op; the second one's per-edge outputs
(edge_index, alpha) have a data-dependent edge count, and its dropout mask is drawn from a
seed the compiled graph takes from torch's generator (eagerly: F.dropout's own draw, PyG's
mask for the same torch seed).

Multi-head shapes (H = heads, C = out_channels, N destinations, E edges after self loops):
projected sources/destinations (N, H, C); scores and attention weights (E, H), softmax-
normalised over each destination's incoming edges per head; output (N, H * C) with
concat=True (heads side by side, head h in columns h*C..(h+1)*C-1), (N, C) with
concat=False (the mean over heads); bias (H * C,) or (C,) accordingly.
"""
from __future__ import annotations

import functools
import operator

import torch
import torch.nn.functional as F

from ...core.errors import ShapeError
from ...core.graph import Graph
from ...core.reducers import online_softmax
from ...trace import math as tm
from ...trace.message_passing import MessagePassing
from ..compiled import compiling
from .common import (
    REDUCERS,
    WEIGHTED_SUM,
    LayerArgumentError,
    edge_index_like,
    edge_reduce,
    loop_edit,
    relation,
)
from .inputs import check_flow, sparse_like
from .opaque import region


class _Attention(MessagePassing):
    """GAT: softmax_j leaky_relu(a_src[j] + a_dst[i] (+ a_edge)) weighting h_j, per head."""

    def __init__(self, slope: float):
        super().__init__()
        self.reducer, self.slope = online_softmax(), slope

    def edge(self, src, dst, edge):
        score = src.a + dst.a
        if "a" in edge:
            score = score + edge.a
        return self.reducer(tm.leaky_relu(score, self.slope), src.h)


class _AttentionV2(MessagePassing):
    """GATv2: softmax_j att . leaky_relu(x_l[j] + x_r[i] (+ e)) weighting x_l[j], per head."""

    def __init__(self, slope: float):
        super().__init__()
        self.reducer, self.slope = online_softmax(), slope

    def edge(self, src, dst, edge, att):
        z = src.h + dst.r
        if "e" in edge:
            z = z + edge.e
        score = tm.sum(tm.leaky_relu(z, self.slope) * att, axis=-1)
        return self.reducer(score, src.h)


@functools.cache
def _attention(kind: str, slope: float) -> MessagePassing:
    # one instance per slope: compiled programs are cached per (edge function, owner)
    return (_Attention if kind == "v1" else _AttentionV2)(slope)


def edge_softmax(graph: Graph, score: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """PyG's softmax of per-edge scores (E, H) over each destination's incoming edges: the
    maximum (not differentiated: the softmax does not depend on it) and the sum run in
    Tiga; PyG's 1e-16 guard on the sum is kept."""
    peak = edge_reduce(graph, score.detach(), "max")
    z = (score - peak[dst]).exp()
    total = edge_reduce(graph, z, "sum")
    return z / (total[dst] + 1e-16)


def self_loops(layer: str, graph: Graph, edge_attr, fill_value) -> tuple:
    """PyG's GAT loops: remove_self_loops then add_self_loops (edge order: the non-loop
    edges, then loops 0..n-1); a loop's edge_attr from fill_value: a number or tensor, or
    "add"/"sum"/"mean"/"max"/"min"/"mul" of the node's incoming edge attributes."""
    looped, keep, bare = loop_edit(graph, "replace")
    if edge_attr is None:
        return looped, None
    if not isinstance(edge_attr, torch.Tensor) or edge_attr.size(0) != graph.num_edges:
        found = (tuple(edge_attr.shape) if isinstance(edge_attr, torch.Tensor) else
            type(edge_attr).__name__)
        raise ShapeError(f"{layer}: edge_attr is {found}, expected a tensor with "
                         f"{graph.num_edges} rows (one per edge)")
    kept = edge_attr[torch.tensor(keep, device=edge_attr.device)]
    n = looped.num_edges - bare.num_edges
    if isinstance(fill_value, str):
        if fill_value not in REDUCERS:
            raise LayerArgumentError(f"{layer}: fill_value is {fill_value!r}, expected a "
                                     f"number, a tensor or one of {tuple(REDUCERS)}")
        loop_attr = edge_reduce(bare, kept, fill_value)[:n]
    else:
        loop_attr = torch.as_tensor(fill_value, dtype=kept.dtype, device=kept.device)
        if loop_attr.dim() != kept.dim():   # PyG: a value for every loop
            loop_attr = loop_attr.unsqueeze(0)
        loop_attr = loop_attr.expand((n,) + tuple(kept.shape[1:]))
    return looped, torch.cat([kept, loop_attr], dim=0)


def attention_region(edge_index, settings, h, a_src, a_dst, edge_attr, w_edge, att_edge):
    """GATConv's relation-dependent part (opaque.region): loops, edge scores a_edge from
    lin_edge's weight, the softmax aggregation; (N, H, C) out."""
    graph, e = _looped(edge_index, settings, h, a_dst, edge_attr, w_edge)
    edge = {} if e is None else {"a": (e * att_edge).sum(dim=-1)}
    return _attention("v1", settings[1])(graph=graph, src={"h": h, "a": a_src},
                                         dst={"a": a_dst}, edge=edge)


def attention_v2_region(edge_index, settings, x_l, x_r, att, edge_attr, w_edge):
    """GATv2Conv's relation-dependent part (opaque.region); (N, H, C) out."""
    graph, e = _looped(edge_index, settings, x_l, x_r, edge_attr, w_edge)
    return _attention("v2", settings[1])(graph=graph, src={"h": x_l}, dst={"r": x_r},
                                         edge={} if e is None else {"e": e}, att=att[0])


def weights_region(edge_index, settings, h, a_src, a_dst, edge_attr, w_edge, att_edge,
                   seed):
    """GATConv's route with per-edge attention (opaque.region): (N, H, C) out, the looped
    relation's edge_index (2, E') and alpha (E', H) (dropped out with `seed`'s mask)."""
    graph, e = _looped(edge_index, settings[:4], h, a_dst, edge_attr, w_edge)
    ei = edge_index_like(graph, h)
    score = a_src[ei[0]] + a_dst[ei[1]]
    if e is not None:
        score = score + (e * att_edge).sum(dim=-1)
    return _attend(graph, ei, F.leaky_relu(score, settings[1]), h, settings[4], seed)


def weights_v2_region(edge_index, settings, x_l, x_r, att, edge_attr, w_edge, seed):
    """GATv2Conv's route with per-edge attention (opaque.region), as weights_region."""
    graph, e = _looped(edge_index, settings[:4], x_l, x_r, edge_attr, w_edge)
    ei = edge_index_like(graph, x_l)
    z = x_l[ei[0]] + x_r[ei[1]]
    if e is not None:
        z = z + e
    score = (F.leaky_relu(z, settings[1]) * att).sum(dim=-1)
    return _attend(graph, ei, score, x_l, settings[4], seed)


def _attend(graph, ei, score, h, p: float, seed) -> tuple:
    """(aggregated (N, H, C), edge_index, alpha (E, H)) from the scores; dropout on alpha
    with a mask drawn from `seed` (the VJP recomputes the region: the same mask)."""
    alpha = edge_softmax(graph, score, ei[1])
    if seed is not None and p > 0.0:
        gen = torch.Generator(device=alpha.device)
        gen.manual_seed(int(seed))
        keep = torch.empty_like(alpha).bernoulli_(1.0 - p, generator=gen)
        alpha = alpha * keep / (1.0 - p)     # as F.dropout
    out = WEIGHTED_SUM(graph=graph, src={"h": h}, edge={"w": alpha.unsqueeze(-1)})
    return out, ei, alpha


@torch._dynamo.assume_constant_result
def looped_graph(graph: Graph, add_loops: bool) -> Graph:
    """A constant tg.Graph's relation with PyG's GAT loops (inside torch.compile)."""
    return loop_edit(graph, "replace")[0] if add_loops else graph


@torch._dynamo.assume_constant_result
def looped_edges(graph: Graph, add_loops: bool) -> int:
    """The edge count of a constant tg.Graph with PyG's GAT loops (a static output size)."""
    return int(looped_graph(graph, add_loops).num_edges)


def _looped(edge_index, settings, h_src, h_dst, edge_attr, w_edge) -> tuple:
    """(relation with PyG's GAT loops, lin_edge(edge_attr) as (E, H, C) or None)."""
    name, _, add_loops, fill_value = settings
    graph = relation(name, edge_index, h_src.size(0), h_dst.size(0))
    if add_loops:
        graph, edge_attr = self_loops(name, graph, edge_attr, fill_value)
    if edge_attr is None or w_edge is None:
        return graph, None
    if edge_attr.dim() == 1:
        edge_attr = edge_attr.view(-1, 1)
    return graph, F.linear(edge_attr, w_edge).view((-1,) + tuple(h_src.shape[1:]))


class _AttentionBase(torch.nn.Module):
    """What GATConv and GATv2Conv share: arguments, loops, the two aggregation routes."""

    kind = "v1"

    def _common_args(self, in_channels, out_channels, heads, concat, negative_slope,
                     dropout, add_self_loops, edge_dim, fill_value, residual, flow):
        name = type(self).__name__
        for arg, value in (("out_channels", out_channels), ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise LayerArgumentError(f"{name}: {arg} is {value!r}, expected a positive "
                                         "int")
        if not 0.0 <= float(dropout) < 1.0:
            raise LayerArgumentError(f"{name}: dropout is {dropout!r}, expected 0 <= p < 1")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope = concat, float(negative_slope)
        self.dropout, self.add_self_loops = float(dropout), add_self_loops
        self.edge_dim, self.fill_value, self.residual = edge_dim, fill_value, residual
        self.flow = check_flow(name, flow)

    def _heads(self, h):
        """A projection (N, H * C) as (N, H, C) (N may be 0)."""
        return h.view(h.size(0), self.heads, self.out_channels)

    def _attend(self, adj, fns, tensors, rows, heads, res, want, parts):
        """The layer's output, with (relation, alpha) when `want`. fns: the fused region
        and the per-edge-weights region; parts: (projected sources, a destination-rows
        tensor, edge_attr, scores(edge_index, lin_edge features) -> (E, H)). Whatever is
        returned, `out` comes from the fused region unless attention dropout applies, so
        it is the plain forward's output bit for bit."""
        fused, weighted = fns
        dropping = self.training and self.dropout > 0.0
        if not want and not dropping:
            out = region(fused, adj.relation, self._settings(), tensors, (rows,))
            return self._finish(out, res, None, None)
        if compiling():
            out, where, alpha = self._compiled_weights(weighted, adj.relation, tensors, rows,
                                                       heads, want)
            if not dropping:
                out = region(fused, adj.relation, self._settings(), tensors, (rows,))
            if want and adj.sparse is not None:
                where = sparse_like(adj.sparse, where, alpha)
            return self._finish(out, res, where, alpha)
        h, h_dst, edge_attr, scores = parts
        graph, edge_attr = self._relation(adj.relation, h.size(0), h_dst.size(0), edge_attr)
        ei = edge_index_like(graph, h)
        score = scores(ei, self._edge_features(edge_attr))
        if dropping:
            out, alpha = self._weighted(graph, score, h)
        else:
            out = region(fused, adj.relation, self._settings(), tensors, (rows,))
            alpha = edge_softmax(graph, score, ei[1])
        if not want:
            return self._finish(out, res, None, None)
        if adj.sparse is not None:
            where = sparse_like(adj.sparse, ei, alpha)
        elif isinstance(adj.relation, Graph):
            where = graph
        else:
            where = ei.flip(0) if self.flow == "target_to_source" else ei
        return self._finish(out, res, where, alpha)

    def _relation(self, edge_index, n_src: int, n_dst: int, edge_attr) -> tuple:
        name = type(self).__name__
        graph = relation(name, edge_index, n_src, n_dst)
        if self.add_self_loops:
            return self_loops(name, graph, edge_attr, self.fill_value)
        return graph, edge_attr

    def _edge_features(self, edge_attr):
        """lin_edge(edge_attr) as (E, H, C), or None without edge features."""
        if edge_attr is None or self.lin_edge is None:
            return None
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        return self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)

    def _settings(self) -> tuple:
        return (type(self).__name__, self.negative_slope, self.add_self_loops,
                self.fill_value)

    def _compiled_weights(self, fn, edge_index, tensors: tuple, rows: tuple, heads: int,
                          want: bool) -> tuple:
        """The attention-weights route while Dynamo traces: one op (weights_region) whose
        dropout mask comes from a seed drawn here from torch's generator (a new mask per
        call, the same one in its backward). (out, looped relation, alpha): the relation
        a tg.Graph when one was given (a constant), else an edge_index (2, E') with a
        data-dependent E', as alpha's (E', H) (H: tensors[heads].shape[1]); None, None
        without `want`."""
        seed = None
        if self.training and self.dropout > 0.0:
            seed = torch.randint(0, 2 ** 62, (), device=tensors[0].device)
        count = None    # with loops added to an edge_index: data-dependent
        if isinstance(edge_index, Graph):
            count = looped_edges(edge_index, self.add_self_loops)
        elif not self.add_self_loops and isinstance(edge_index, torch.Tensor):
            count = operator.index(edge_index.size(1))
        outs = (rows, ("edge_index", count), ("edges", heads, 2, count)) if want else (rows,)
        result = region(fn, edge_index, self._settings() + (self.dropout,), tensors + (seed,),
                        outs)
        if not want:
            return result, None, None
        out, where, alpha = result
        if isinstance(edge_index, Graph):
            where = looped_graph(edge_index, self.add_self_loops)
        return out, where, alpha

    def _weighted(self, graph: Graph, score, h):
        """(aggregated (N, H, C), attention (E, H)) from per-edge scores (E, H); the
        attention returned is the one used: after dropout in training, as PyG's."""
        dst = edge_index_like(graph, score)[1]
        alpha = edge_softmax(graph, score, dst)
        dropped = F.dropout(alpha, p=self.dropout, training=self.training)
        out = WEIGHTED_SUM(graph=graph, src={"h": h}, edge={"w": dropped.unsqueeze(-1)})
        return out, dropped

    def _finish(self, out, res, where, alpha):
        """The layer's output, with (where, alpha) when alpha is given."""
        if self.concat:
            out = out.reshape(out.size(0), self.heads * self.out_channels)
        else:
            out = out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        return out if alpha is None else (out, (where, alpha))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"heads={self.heads})")
