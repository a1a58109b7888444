"""torch_bridge: tg.nn.SAGEConv, tg.nn.GINConv and tg.nn.GINEConv, PyG's layers with the
neighbourhood reduction run by Tiga (the projections and GIN's network stay in torch).

Inputs as PyG's (inputs.py): x or (x_src, x_dst) with x_dst None allowed, size=, a 3-D
static-graph x (B, N, F), an edge_index, a tg.Graph or a torch.sparse adj_t, flow=.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...core.reducers import sum as sum_r
from ...trace import math as tm
from ...trace.message_passing import MessagePassing
from .aggr import fused_names, over, over_names, resolve
from .buckets import run_bucketed
from .common import LayerArgumentError, check_positive, relation, reset_children
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
from .summed import summed


def _names_region(edge_index, settings, x_src, x_dst):
    """aggr_{j -> i} x_j (fused_names' reducers, concatenated) over the relation
    (opaque.region): rows of x_dst."""
    name, names = settings
    graph = relation(name, edge_index, x_src.size(0), x_dst.size(0))
    return run_bucketed(graph, x_src, lambda g, x: over_names(names, g, x))


def aggregate(name: str, aggr, adj, x_src, x_dst, n_dst: int):
    """aggr over the relation of the source rows (nodes first: (S, ...)) for n_dst
    destinations (x_dst (N, ...) or None): one opaque op inside torch.compile where the
    aggregation is parameter-free reducers."""
    names = fused_names(aggr)
    if names is not None and x_dst is not None:
        width = x_src.size(-1) * len(names.split("|"))
        tail = tuple(x_src.shape[1:-1]) + (width,)
        return region(_names_region, adj.relation, (name, names), (x_src, x_dst),
                      ((1, 0, tail),))
    graph = relation(name, adj.relation, x_src.size(0), n_dst)
    return over(aggr, graph, x_src)


class SAGEConv(torch.nn.Module):
    """PyG's SAGEConv: x'_i = lin_l(aggr_{j -> i} x_j) + lin_r(x_i), as a torch module.

    Arguments, defaults and parameter names (`lin_l.*`, `lin_r.weight`, `lin.*` with
    project=True, `aggr_module.*` for an aggregation with parameters) are PyG's.
    aggr: a name ("mean" default, "sum"/"add", "max", "min", "mul", "var", "std",
    "softmax", "powermean", "lstm"), a list of names (MultiAggregation, concatenated;
    aggr_kwargs for its mode), a tg.nn.aggr module or a torch_geometric aggregation module
    (run in torch on the gathered rows); an empty neighbourhood aggregates to 0.
    project=True first maps the sources through relu(lin(x_j)); normalize=True
    L2-normalises each output row. in_channels=-1 (or a pair with -1): lazy, as PyG.

    forward(x, edge_index, size=None): x (N, F), (B, N, F) or a pair (x_src, x_dst) with
    x_dst None allowed (then no root term; size= gives the destinations); edge_index a
    tg.Graph, a (2, E) integer tensor [sources; targets] or a torch.sparse adj_t.
    """

    def __init__(self, in_channels, out_channels: int, aggr="mean", normalize: bool = False,
                 root_weight: bool = True, project: bool = False, bias: bool = True,
                 aggr_kwargs: dict | None = None, flow: str = "source_to_target"):
        super().__init__()
        n_src, n_dst = check_in_channels("SAGEConv", in_channels)
        self.in_channels = in_channels
        self.out_channels = check_positive("SAGEConv", "out_channels", out_channels)
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        self.flow = check_flow("SAGEConv", flow)
        aggr_kwargs = dict(aggr_kwargs or {})
        if aggr == "lstm":
            aggr_kwargs.setdefault("in_channels", n_src)
            aggr_kwargs.setdefault("out_channels", n_src)
        self.aggr = aggr if isinstance(aggr, (str, list, tuple)) else type(aggr).__name__
        try:
            self.aggr_module = resolve(aggr, **aggr_kwargs)
        except LayerArgumentError as exc:
            raise LayerArgumentError(f"SAGEConv: {exc}") from exc
        if project:
            if n_src <= 0:
                raise LayerArgumentError("'SAGEConv' does not support lazy initialization "
                                         "with `project=True`")
            self.lin = torch.nn.Linear(n_src, n_src, bias=True)
        width = n_src
        if hasattr(self.aggr_module, "get_out_channels") and n_src > 0:
            width = self.aggr_module.get_out_channels(n_src)    # a MultiAggregation
        self.lin_l = make_linear(width, out_channels, bias=bias, glorot=False)
        if root_weight:
            self.lin_r = make_linear(n_dst, out_channels, bias=False, glorot=False)

    def reset_parameters(self) -> None:
        self.aggr_module.reset_parameters()
        for lin in (getattr(self, "lin", None), self.lin_l, getattr(self, "lin_r", None)):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x, edge_index, size=None):
        """lin_l of the aggregated source rows plus lin_r of the destination rows.

        Args:
            x: node features (N, F_in), a pair (x_src, x_dst) of them for a bipartite relation
                (x_dst may be None with `size`), or a 3-D static-graph batch (B, N, F_in)
                sharing one edge_index.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, out_channels) ((B, N_dst, out_channels) for a 3-D x); L2-normalized
                rows with normalize=True.
        """
        x_src, x_dst = node_inputs("SAGEConv", x)
        adj = adjacency("SAGEConv", edge_index, self.flow)
        n_dst = adj.num_dst("SAGEConv", size, x_dst)
        check_size("SAGEConv", size, node_count(x_src), n_dst)
        if self.project:
            x_src = self.lin(x_src).relu()
        if self._projects_first():
            out = self._project_then_aggregate(adj, x_src, x_dst, n_dst)
        else:
            agg = aggregate("SAGEConv", self.aggr_module, adj, nodes_first(x_src),
                            nodes_first(x_dst), n_dst)
            out = self.lin_l(batch_first(agg, x_src))
            if self.root_weight and x_dst is not None:
                out = out + self.lin_r(x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def _projects_first(self) -> bool:
        """Whether lin_l runs before the aggregation: a sum or mean commutes with it
        (an empty neighbourhood gives 0 both ways), and projecting first makes the
        aggregation and its VJP move out_channels features instead of in_channels."""
        lin = self.lin_l
        return (not self.project and type(lin) is torch.nn.Linear
                and lin.out_features < lin.in_features
                and fused_names(self.aggr_module) in ("mean", "sum"))

    def _project_then_aggregate(self, adj, x_src, x_dst, n_dst: int):
        """aggr(x_j W_l^T) + b + x_i W_r^T, equal to PyG's lin_l(aggr(x_j)) + lin_r(x_i) up
        to rounding. Where x_src is x_dst, both projections are one matmul ([W_l; W_r]):
        the (N, F_in) rows are read once, forward and backward."""
        width = self.lin_l.out_features
        root_w = self.root_weight and x_dst is not None
        fused = root_w and x_dst is x_src
        weight = (torch.cat([self.lin_l.weight, self.lin_r.weight]) if fused
                  else self.lin_l.weight)
        y = F.linear(x_src, weight)
        # (the aggregation reads C-contiguous rows: the split half is copied once here)
        messages = y[..., :width].contiguous() if fused else y
        agg = aggregate("SAGEConv", self.aggr_module, adj, nodes_first(messages),
                        nodes_first(x_dst), n_dst)
        out = batch_first(agg, x_src)
        if self.lin_l.bias is not None:
            out = out + self.lin_l.bias
        if fused:
            return out + y[..., width:]
        return out + self.lin_r(x_dst) if root_w else out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr})")


def _eps_tensor(module, eps: float, train_eps: bool) -> None:
    module.initial_eps = eps
    if train_eps:
        module.eps = torch.nn.Parameter(torch.full((1,), float(eps)))
    else:
        module.register_buffer("eps", torch.full((1,), float(eps)))


class GINConv(torch.nn.Module):
    """PyG's GINConv: x'_i = nn((1 + eps) x_i + sum_{j -> i} x_j), as a torch module.

    `nn` is any torch module (it runs in torch on the aggregated rows); eps is a buffer, or a
    Parameter with train_eps=True, named `eps` with shape (1,) as in PyG, so PyG's state
    dict loads. forward(x, edge_index, size=None): x (N, F), (B, N, F) or a pair (x_src,
    x_dst) with x_dst None allowed (then no root term); edge_index a tg.Graph, a (2, E)
    integer tensor or a torch.sparse adj_t. Returns nn's output for N rows.
    """

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False,
                 flow: str = "source_to_target"):
        super().__init__()
        self.nn = nn
        self.flow = check_flow(type(self).__name__, flow)
        _eps_tensor(self, eps, train_eps)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)
        reset_children(self.nn)

    def forward(self, x, edge_index, size=None):
        """nn((1 + eps) x_i + sum of the neighbours' rows x_j).

        Args:
            x: node features (N, F_in), a pair (x_src, x_dst) of them for a bipartite relation
                (x_dst may be None with `size`), or a 3-D static-graph batch (B, N, F_in)
                sharing one edge_index.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, F_out), F_out the width nn gives ((B, N_dst, F_out) for a 3-D x).
        """
        name = type(self).__name__
        x_src, x_dst = node_inputs(name, x)
        adj = adjacency(name, edge_index, self.flow)
        n_dst = adj.num_dst(name, size, x_dst)
        check_size(name, size, node_count(x_src), n_dst)
        if x_dst is x_src and x_src.dim() == 2 and not torch.compiler.is_compiling():
            # (padding, sum, slice and root term as one node where they can be: summed.py)
            graph = relation(name, adj.relation, x_src.size(0), n_dst)
            out = summed(graph, x_src, self.eps)
            if out is not None:
                return self.nn(out)
        out = aggregate(name, _SUM, adj, nodes_first(x_src), nodes_first(x_dst), n_dst)
        out = batch_first(out, x_src)
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"


_SUM = resolve("sum")


class _EdgeSum(MessagePassing):
    """GINE's messages: sum_{j -> i} relu(x_j + e_ji)."""
    reducer = sum_r()

    def edge(self, src, dst, edge):
        z = src.x + edge.e
        return tm.where(tm.greater(z, 0.0), z, 0.0)


_EDGE_SUM = _EdgeSum()


def _gine_region(edge_index, settings, x_src, x_dst, e):
    """GINE's aggregation over the relation (opaque.region): rows of x_dst; e (E, F)
    broadcasts over a static graph's batch axis."""
    name, n_dst = settings
    graph = relation(name, edge_index, x_src.size(0), n_dst)
    if tuple(e.shape[:1]) != (graph.num_edges,):
        raise LayerArgumentError(f"{name}: edge_attr has {e.size(0)} rows, expected "
                                 f"{graph.num_edges} (one per edge)")
    if x_src.dim() == 3:
        e = e.unsqueeze(1)
    return _EDGE_SUM(graph=graph, src={"x": x_src}, edge={"e": e})


class GINEConv(torch.nn.Module):
    """PyG's GINEConv: x'_i = nn((1 + eps) x_i + sum_{j -> i} relu(x_j + e_ji)), e_ji the
    edge attributes, through `lin` (Linear(edge_dim, F)) where edge_dim is given.

    Parameter names (`nn.*`, `eps`, `lin.*`) and the input width read from nn (its first
    Linear's in_features) are PyG's. forward(x, edge_index, edge_attr=None, size=None) as
    GINConv's; edge_attr (E, edge_dim) in the relation's edge order, or the values of a
    torch.sparse adj_t.
    """

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False,
                 edge_dim: int | None = None, flow: str = "source_to_target"):
        super().__init__()
        self.nn = nn
        self.flow = check_flow("GINEConv", flow)
        _eps_tensor(self, eps, train_eps)
        if edge_dim is not None:
            first = nn[0] if isinstance(nn, torch.nn.Sequential) else nn
            if hasattr(first, "in_features"):
                in_channels = first.in_features
            elif hasattr(first, "in_channels"):
                in_channels = first.in_channels
            else:
                raise LayerArgumentError("GINEConv: could not infer input channels from "
                                         "`nn`")
            self.lin = torch.nn.Linear(edge_dim, in_channels)
        else:
            self.lin = None

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)
        reset_children(self.nn)
        if self.lin is not None:
            self.lin.reset_parameters()

    def forward(self, x, edge_index, edge_attr=None, size=None):
        """nn((1 + eps) x_i + sum over edges of relu(x_j + e_ji)).

        Args:
            x: node features (N, F_in), a pair (x_src, x_dst) of them for a bipartite relation
                (x_dst may be None with `size`), or a 3-D static-graph batch (B, N, F_in)
                sharing one edge_index.
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: edge features (E, F_in), or (E, edge_dim) projected to F_in when
                edge_dim is set; a torch.sparse adj_t's values when None.
            size: (N_src, N_dst) when x_dst is None or the counts are not read from x.

        Returns:
            Tensor (N_dst, F_out), F_out the width nn gives.
        """
        x_src, x_dst = node_inputs("GINEConv", x)
        adj = adjacency("GINEConv", edge_index, self.flow)
        n_dst = adj.num_dst("GINEConv", size, x_dst)
        check_size("GINEConv", size, node_count(x_src), n_dst)
        if edge_attr is None:
            edge_attr = adj.values
        if edge_attr is None:
            raise LayerArgumentError("GINEConv: edge_attr is None, expected the edge "
                                     "features (E, F)")
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        if x_src.size(-1) != edge_attr.size(-1):
            raise LayerArgumentError("Node and edge feature dimensionalities do not match. "
                                     "Consider setting the 'edge_dim' attribute of "
                                     "'GINEConv'")
        src, dst = nodes_first(x_src), nodes_first(x_dst)
        settings = ("GINEConv", n_dst)
        if dst is None:
            out = _gine_region(adj.relation, settings, src, None, edge_attr)
        else:
            out = region(_gine_region, adj.relation, settings, (src, dst, edge_attr),
                         ((1, 0),))
        out = batch_first(out, x_src)
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"


__all__ = ["GINConv", "GINEConv", "SAGEConv", "aggregate"]
