"""torch_bridge: tg.nn.RGCNConv (and FastRGCNConv, PyG's name for the same layer computed
per edge), PyG's relational GCN with the per-relation aggregation run by Tiga.

All relations aggregate in one Tiga propagate: the relation's edges j -> i of type r
become edges j -> (i, r) of a relation with N * R destinations, so aggr ("mean" default:
the mean over i's incoming edges of type r) is taken per (node, type) at once; the
(N, R, F) result is projected by each type's weight in torch and summed over the types.
With node indices for x (PyG's featureless input) the sources are the weight rows
W_r[j] themselves, read through edges (r, j) -> (i, r).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from ...core.errors import ShapeError
from ...core.graph import Graph
from .aggr import fused_names, over, over_names, resolve
from .common import (
    LayerArgumentError,
    _remember,
    below_functorch,
    check_positive,
    edge_index_like,
    glorot_,
    relation,
    snapshot,
    unchanged,
)
from .inputs import adjacency, check_flow, check_in_channels
from .opaque import region


def _parameter(*shape) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.empty(*shape))
    glorot_(p)
    return p


class RGCNConv(torch.nn.Module):
    """PyG's RGCNConv: x'_i = x_i Root + sum_r aggr_{j -> i of type r} x_j W_r + bias.

    W_r: `weight` (R, in, out); with num_bases B, W_r = sum_b comp[r, b] weight[b]
    (`weight` (B, in, out), `comp` (R, B)); with num_blocks K, W_r is block-diagonal
    (`weight` (R, K, in/K, out/K)); `root` (in_dst, out), `bias` (out,); glorot as PyG.
    Parameter names and arguments are PyG's (is_sorted, a speed hint, changes nothing).
    forward(x, edge_index, edge_type=None): x (N, in) float features, a 1-D integer
    tensor of node indices or None (featureless: x_j W_r is row j of W_r, as PyG), or a
    pair (x_src, x_dst) of those; edge_type (E,) integers in [0, R) in the relation's edge
    order (a torch.sparse adj_t's values when not given). Returns (N_dst, out).
    """

    def __init__(self, in_channels, out_channels: int, num_relations: int,
                 num_bases: int | None = None, num_blocks: int | None = None,
                 aggr="mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, flow: str = "source_to_target"):
        super().__init__()
        name = type(self).__name__
        if num_bases is not None and num_blocks is not None:
            raise LayerArgumentError(f"{name}: can not apply both basis-decomposition and "
                                     "block-diagonal-decomposition at the same time")
        n_src, n_dst = check_in_channels(name, in_channels)
        if n_src < 0 or n_dst < 0:
            raise LayerArgumentError(f"{name}: in_channels=-1 (lazy) is not supported")
        self.in_channels, self.in_channels_l = in_channels, n_src
        self.out_channels = check_positive(name, "out_channels", out_channels)
        self.num_relations = check_positive(name, "num_relations", num_relations)
        self.num_bases, self.num_blocks, self.is_sorted = num_bases, num_blocks, is_sorted
        self.flow = check_flow(name, flow)
        self.aggr = aggr if isinstance(aggr, (str, list, tuple)) else type(aggr).__name__
        try:
            self.aggr_module = resolve(aggr)
        except LayerArgumentError as exc:
            raise LayerArgumentError(f"{name}: {exc}") from exc
        if num_bases is not None:
            self.weight = _parameter(num_bases, n_src, out_channels)
            self.comp = _parameter(num_relations, num_bases)
        elif num_blocks is not None:
            if n_src % num_blocks or out_channels % num_blocks:
                raise LayerArgumentError(f"{name}: num_blocks={num_blocks} must divide "
                                         "in_channels and out_channels")
            self.weight = _parameter(num_relations, num_blocks, n_src // num_blocks,
                                     out_channels // num_blocks)
            self.register_parameter("comp", None)
        else:
            self.weight = _parameter(num_relations, n_src, out_channels)
            self.register_parameter("comp", None)
        self.root = _parameter(n_dst, out_channels) if root_weight else None
        if not root_weight:
            self.register_parameter("root", None)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        self.aggr_module.reset_parameters()
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                glorot_(p)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def _weights(self) -> torch.Tensor:
        """W_r for every relation: (R, in, out), or the blocks (R, K, in/K, out/K)."""
        if self.num_bases is None:
            return self.weight
        return (self.comp @ self.weight.view(self.num_bases, -1)).view(
            self.num_relations, self.in_channels_l, self.out_channels)

    def forward(self, x, edge_index, edge_type=None):
        """Root term plus, per relation type r, aggr over edges of type r of x_j W_r.

        Args:
            x: node features (N, in_channels), a 1-D integer tensor of node indices or None
                (featureless), or a pair (x_src, x_dst) of those.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_type: (E,) integer types in [0, num_relations), in the relation's edge order
                (a torch.sparse adj_t's values when None).

        Returns:
            Tensor (N_dst, out_channels).
        """
        name = type(self).__name__
        x_src, x_dst = x if isinstance(x, (tuple, list)) else (x, x)
        dev = self.weight.device
        if x_src is None:
            x_src = torch.arange(self.in_channels_l, device=dev)
        if x_dst is None:
            x_dst = x_src
        adj = adjacency(name, edge_index, self.flow)
        if edge_type is None:
            edge_type = adj.values
        if edge_type is None:
            raise LayerArgumentError(f"{name}: edge_type is None, expected the type of "
                                     "every edge (E,)")
        n_dst = x_dst.size(0)
        weight = self._weights()
        r, o = self.num_relations, self.out_channels
        if not x_src.is_floating_point() and self.num_blocks is not None:
            raise LayerArgumentError(f"{name}: block-diagonal decomposition not "
                                     "supported for non-continuous input features")
        # the aggregated rows: x_src's, or for node indices the stacked W_r's
        rows = x_src if x_src.is_floating_point() else weight.reshape(-1, o)
        agg = self._aggregate(adj, edge_type, rows, x_src, x_dst)
        if not x_src.is_floating_point():
            out = agg.view(n_dst, r, o).sum(dim=1)
        elif self.num_blocks is not None:
            k = self.num_blocks
            blocks = agg.view(n_dst, r, k, x_src.size(-1) // k)
            h = torch.einsum("nrbc,rbcd->nrbd", blocks, weight)
            out = h.reshape(n_dst, r, o).sum(dim=1)
        else:
            out = torch.einsum("nrf,rfo->no", agg.view(n_dst, r, x_src.size(-1)), weight)
        if self.root is not None:
            out = out + (self.root[x_dst] if not x_dst.is_floating_point() else
                         x_dst @ self.root)
        return out if self.bias is None else out + self.bias

    def _aggregate(self, adj, edge_type, rows, x_src, x_dst):
        """aggr per (destination, type) of the typed relation's source rows: (N_dst,
        R * width). One opaque op inside torch.compile for parameter-free aggregations."""
        name, r = type(self).__name__, self.num_relations
        names = fused_names(self.aggr_module)
        settings = (name, r, self.in_channels_l, names)
        if names is not None and isinstance(adj.relation, (Graph, torch.Tensor)):
            width = rows.size(-1) * len(names.split("|"))
            return region(_typed_region, adj.relation, settings,
                          (edge_type, rows, x_src, x_dst), ((3, 1, (r * width,)),))
        graph = relation(name, adj.relation, x_src.size(0), x_dst.size(0))
        typed = typed_sources(settings, graph, edge_type, x_src)
        out = over(self.aggr_module, typed, rows)
        return out.reshape(x_dst.size(0), r * out.size(-1))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"num_relations={self.num_relations})")


def typed_sources(settings: tuple, graph: Graph, edge_type, x_src) -> Graph:
    """The relation with destinations (i, r) -> i * R + r; its sources are the rows of
    x_src, or for node indices the rows r * in + x_src[j] of the stacked W_r."""
    name, r, in_l = settings[:3]
    if tuple(edge_type.shape) != (graph.num_edges,):
        raise ShapeError(f"{name}: edge_type is {tuple(edge_type.shape)}, expected "
                         f"({graph.num_edges},): one type per edge")
    if x_src.is_floating_point():
        return typed_relation(name, graph, edge_type, r)
    t = _types(name, edge_type, r)
    ei = edge_index_like(graph, x_src).to(t.device)
    src = t * in_l + x_src.to(t.device)[ei[0]]
    return relation(name, torch.stack([src, ei[1] * r + t]), r * in_l, graph.num_dst * r)


def _typed_region(edge_index, settings, edge_type, rows, x_src, x_dst):
    """RGCN's typed aggregation (opaque.region): (N_dst, R * width) rows of x_dst."""
    graph = relation(settings[0], edge_index, x_src.size(0), x_dst.size(0))
    out = over_names(settings[3], typed_sources(settings, graph, edge_type, x_src), rows)
    return out.reshape(x_dst.size(0), settings[1] * out.size(-1))


def _types(name: str, edge_type, r: int) -> torch.Tensor:
    """edge_type as int64 (detached), checked to lie in [0, r)."""
    t = edge_type.detach().to(torch.int64)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= r):
        raise LayerArgumentError(f"{name}: edge_type has values outside [0, {r})")
    return t


@torch.compiler.disable(reason="tg.nn layers build their tg.Graph from edge_index eagerly")
@below_functorch
def typed_relation(name: str, graph: Graph, edge_type: torch.Tensor, r: int) -> Graph:
    """The relation's edges j -> i of type t as j -> i * r + t (N * r destinations),
    memoised per (relation object, edge_type tensor and version, r) and checked against a
    copy of the types it was built from (as relation()'s memo: an edit through .data is
    never served stale)."""
    key = (id(graph), id(edge_type), edge_type._version, r)
    found = _TYPED.get(key)
    if found is not None and found[0]() is edge_type:
        held_graph, copy, typed = found[1]
        if held_graph() is graph and unchanged(edge_type, copy):
            _TYPED.move_to_end(key)
            return typed
    t = _types(name, edge_type, r).cpu().numpy()
    ei = graph.to_edge_index()
    # types checked and the relation validated: the derived one needs no second check
    typed = Graph.from_coo(ei[0], ei[1] * r + t, num_src=graph.num_src,
                           num_dst=graph.num_dst * r, validate="none", copy=False)
    _remember(_TYPED, key, edge_type, (weakref.ref(graph), snapshot(edge_type), typed))
    return typed


# a cache (DESIGN.md: caches are the only module-level state), as common.py's relation memos
_TYPED: OrderedDict = OrderedDict()


class FastRGCNConv(RGCNConv):
    """PyG's FastRGCNConv: the same layer as RGCNConv (PyG trades memory for speed by
    forming every edge's x_j W_r; here both run the one typed aggregation above), with
    RGCNConv's parameters, state dict and outputs."""


__all__ = ["FastRGCNConv", "RGCNConv"]
