"""torch_bridge: tg.nn.SAGEConv and tg.nn.GINConv, PyG's layers with the neighbourhood
reduction run by Tiga (the projections and GIN's network stay in torch)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import (
    check_aggr,
    check_channels,
    check_positive,
    check_size,
    node_pair,
    relation,
    reset_children,
    source_reducer,
)
from .opaque import region


def _reduce_region(edge_index, settings, x_src, x_dst):
    """aggr_{j -> i} x_j over the relation (opaque.region): (x_dst rows, x_src's width)."""
    name, aggr = settings
    graph = relation(name, edge_index, x_src.size(0), x_dst.size(0))
    return source_reducer(aggr)(graph=graph, src={"x": x_src})


class SAGEConv(torch.nn.Module):
    """PyG's SAGEConv: x'_i = lin_l(aggr_{j -> i} x_j) + lin_r(x_i), as a torch module.

    Arguments, defaults and parameter names (`lin_l.*`, `lin_r.weight`, `lin.*` with
    project=True) are PyG's. aggr: "mean" (default), "add"/"sum", "max" or "min"; an empty
    neighbourhood aggregates to 0, as in PyG. project=True first maps the sources through
    relu(lin(x_j)); normalize=True L2-normalises each output row.

    forward(x, edge_index, size=None): x (N, F) or a bipartite pair (x_src (S, F_s), x_dst (N, F_t))
    with in_channels=(F_s, F_t); edge_index a tg.Graph (S sources, N destinations) or a
    (2, E) integer tensor [sources; targets]. Returns (N, out_channels).
    """

    def __init__(self, in_channels, out_channels: int, aggr: str = "mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False,
                 bias: bool = True):
        super().__init__()
        n_src, n_dst = check_channels("SAGEConv", in_channels)
        self.in_channels = in_channels
        self.out_channels = check_positive("SAGEConv", "out_channels", out_channels)
        self.aggr = check_aggr(aggr, "SAGEConv")
        self.normalize, self.root_weight, self.project = normalize, root_weight, project
        if project:
            self.lin = torch.nn.Linear(n_src, n_src, bias=True)
        self.lin_l = torch.nn.Linear(n_src, out_channels, bias=bias)
        if root_weight:
            self.lin_r = torch.nn.Linear(n_dst, out_channels, bias=False)

    def reset_parameters(self) -> None:
        for lin in (getattr(self, "lin", None), self.lin_l, getattr(self, "lin_r", None)):
            if lin is not None:
                lin.reset_parameters()

    def forward(self, x, edge_index, size=None):
        x_src, x_dst = node_pair("SAGEConv", x)
        check_size("SAGEConv", size, x_src.size(0), x_dst.size(0))
        if self.project:
            x_src = self.lin(x_src).relu()
        out = self.lin_l(region(_reduce_region, edge_index, ("SAGEConv", self.aggr),
                                (x_src, x_dst), ((1, 0),)))
        if self.root_weight:
            out = out + self.lin_r(x_dst)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr})")


class GINConv(torch.nn.Module):
    """PyG's GINConv: x'_i = nn((1 + eps) x_i + sum_{j -> i} x_j), as a torch module.

    `nn` is any torch module (it runs in torch on the aggregated rows); eps is a buffer, or a
    Parameter with train_eps=True, named `eps` with shape (1,) as in PyG, so PyG's state
    dict loads. forward(x, edge_index, size=None): x (N, F) or a pair (x_src (S, F), x_dst (N, F));
    edge_index a tg.Graph or a (2, E) integer tensor. Returns nn's output for N rows.
    """

    def __init__(self, nn: torch.nn.Module, eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.full((1,), float(eps)))
        else:
            self.register_buffer("eps", torch.full((1,), float(eps)))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)
        reset_children(self.nn)

    def forward(self, x, edge_index, size=None):
        x_src, x_dst = node_pair("GINConv", x)
        check_size("GINConv", size, x_src.size(0), x_dst.size(0))
        out = region(_reduce_region, edge_index, ("GINConv", "add"), (x_src, x_dst),
                     ((1, 0),))
        return self.nn(out + (1 + self.eps) * x_dst)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nn={self.nn})"
