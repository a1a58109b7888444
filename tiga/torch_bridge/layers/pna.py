"""torch_bridge: tg.nn.PNAConv, PyG's principal neighbourhood aggregation layer, and the
degree-scaled multi-aggregation it reduces with.

The per-edge pre-networks (any torch modules) run in torch on the gathered rows; the
aggregators (tg.nn.aggr's: sum, mean, min, max, var, std) reduce those edge messages into
their destinations as Tiga propagates over the edges -> destinations relation; the degree
scalers and the post-networks are dense torch.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from ...core.graph import Graph
from .aggr import Aggregation, fused_names, over_names, resolve
from .common import LayerArgumentError, _remember, check_positive, relation
from .edge_nn import edge_count, edge_order_region
from .inputs import adjacency, check_flow
from .opaque import region

SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")
ACTIVATIONS = {"relu": torch.nn.ReLU, "elu": torch.nn.ELU, "leaky_relu": torch.nn.LeakyReLU,
               "gelu": torch.nn.GELU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
               "silu": torch.nn.SiLU, "swish": torch.nn.SiLU, "prelu": torch.nn.PReLU,
               "selu": torch.nn.SELU, "softplus": torch.nn.Softplus}


@torch.compiler.disable(reason="tg.nn layers build their tg.Graph from edge_index eagerly")
def edges_to_destinations(graph: Graph) -> tuple:
    """(relation whose source k is the relation's edge k and whose destinations are its
    destinations, the relation's edge_index in that edge order): per-edge messages are
    its source rows. Memoised per relation object (relations are immutable, and
    relation() hands the same object to every call on the same edge_index)."""
    found = _EDGES.get(id(graph))
    if found is not None and found[0]() is graph:
        _EDGES.move_to_end(id(graph))
        return found[1]
    ei = graph.to_edge_index()
    e = ei.shape[1]
    # derived from a validated relation: nothing to check again
    edges = Graph.from_coo(np.arange(e), ei[1], num_src=e, num_dst=graph.num_dst,
                           validate="none", copy=False)
    _remember(_EDGES, id(graph), graph, (edges, ei))
    return edges, ei


# a cache (DESIGN.md: caches are the only module-level state), as common.py's relation memos
_EDGES: OrderedDict = OrderedDict()


class DegreeScalerAggregation(Aggregation):
    """PyG's DegreeScalerAggregation: aggregators (a name, a list: concatenated) whose
    output is repeated once per scaler, scaled by the in-degree d (clamped to 1):
    identity, amplification log(d + 1) / avg_log, attenuation avg_log / log(d + 1),
    linear d / avg_lin, inverse_linear avg_lin / d; avg_lin and avg_log the mean degree
    and mean log(degree + 1) of the training histogram `deg` (buffers `avg_deg_lin`,
    `avg_deg_log`, Parameters with train_norm=True)."""

    def __init__(self, aggr, scaler, deg: torch.Tensor, train_norm: bool = False,
                 aggr_kwargs: dict | None = None):
        super().__init__()
        self.aggr = resolve(aggr, **dict(aggr_kwargs or {}))
        self.scaler = [scaler] if isinstance(scaler, str) else list(scaler)
        for s in self.scaler:
            if s not in SCALERS:
                raise LayerArgumentError(f"DegreeScalerAggregation: scaler is {s!r}, "
                                         f"expected one of {SCALERS}")
        deg = torch.as_tensor(deg).to(torch.float64)
        bins = torch.arange(deg.numel(), dtype=torch.float64)
        total = deg.sum()
        lin = float((bins * deg).sum() / total)
        log = float(((bins + 1).log() * deg).sum() / total)
        self.init_avg_deg_lin, self.init_avg_deg_log = lin, log
        if train_norm:
            self.avg_deg_lin = torch.nn.Parameter(torch.tensor([lin]))
            self.avg_deg_log = torch.nn.Parameter(torch.tensor([log]))
        else:
            self.register_buffer("avg_deg_lin", torch.tensor([lin]))
            self.register_buffer("avg_deg_log", torch.tensor([log]))

    def reset_parameters(self) -> None:
        self.aggr.reset_parameters()
        with torch.no_grad():
            self.avg_deg_lin.fill_(self.init_avg_deg_lin)
            self.avg_deg_log.fill_(self.init_avg_deg_log)

    def over(self, graph, x):
        out = self.aggr.over(graph, x)
        return self.scale(out, in_degrees(graph, out))

    def scale(self, out, deg):
        """The aggregated rows `out` (N, ...) repeated once per scaler, scaled by the
        in-degrees deg (N,)."""
        deg = deg.clamp(min=1).view((-1,) + (1,) * (out.dim() - 1))
        outs = []
        for s in self.scaler:
            if s == "identity":
                outs.append(out)
            elif s == "amplification":
                outs.append(out * (torch.log(deg + 1) / self.avg_deg_log))
            elif s == "attenuation":
                outs.append(out * (self.avg_deg_log / torch.log(deg + 1)))
            elif s == "linear":
                outs.append(out * (deg / self.avg_deg_lin))
            else:
                outs.append(out * (self.avg_deg_lin / deg))
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def in_degrees(graph: Graph, like: torch.Tensor) -> torch.Tensor:
    """The relation's in-degree per destination (edges counted with multiplicity), as
    `like`'s dtype and device."""
    return torch.from_numpy(graph.degrees("dst").astype(np.float64)).to(like)


def _pna_region(edge_index, settings, msgs, x):
    """PNA's aggregators over each node's incoming messages (per-edge rows of msgs, in the
    relation's edge order) and the in-degrees (opaque.region): rows of x."""
    name, names = settings
    graph = relation(name, edge_index, x.size(0), x.size(0))
    out = over_names(names, edges_to_destinations(graph)[0], msgs)
    return out, in_degrees(graph, out)


def _activation(act, act_kwargs):
    if isinstance(act, str):
        key = act.lower()
        if key not in ACTIVATIONS:
            raise LayerArgumentError(f"PNAConv: act is {act!r}, expected one of "
                                     f"{tuple(ACTIVATIONS)} or a torch module")
        return ACTIVATIONS[key](**dict(act_kwargs or {}))
    return torch.nn.Identity() if act is None else act


def _stack(first_in: int, width: int, layers: int, act) -> torch.nn.Sequential:
    """PyG's tower network: Linear(first_in, width), then (act, Linear(width, width))
    layers - 1 times (so the state dict indices are PyG's)."""
    modules = [torch.nn.Linear(first_in, width)]
    for _ in range(layers - 1):
        modules += [act, torch.nn.Linear(width, width)]
    return torch.nn.Sequential(*modules)


class PNAConv(torch.nn.Module):
    """PyG's PNAConv: per tower t, messages m_ji = pre_t([x_i, x_j(, E e_ji)]) reduced by
    the degree-scaled aggregators, then x'_i = lin([post_t([x_i, aggregated_i])]_t).

    Arguments and parameter names (`aggr_module.avg_deg_*`, `edge_encoder`,
    `pre_nns.<t>.<k>`, `post_nns.<t>.<k>`, `lin`) are PyG's. divide_input=True splits x's
    columns across the towers (else each tower reads all of x). forward(x, edge_index,
    edge_attr=None): x (N, in_channels), edge_attr (E, edge_dim) in the relation's edge
    order (a torch.sparse adj_t's values when not given). get_degree_histogram(loader)
    as PyG's.
    """

    def __init__(self, in_channels: int, out_channels: int, aggregators, scalers,
                 deg: torch.Tensor, edge_dim: int | None = None, towers: int = 1,
                 pre_layers: int = 1, post_layers: int = 1, divide_input: bool = False,
                 act="relu", act_kwargs: dict | None = None, train_norm: bool = False,
                 flow: str = "source_to_target"):
        super().__init__()
        self.in_channels = check_positive("PNAConv", "in_channels", in_channels)
        self.out_channels = check_positive("PNAConv", "out_channels", out_channels)
        self.towers = check_positive("PNAConv", "towers", towers)
        if divide_input and in_channels % towers:
            raise LayerArgumentError("PNAConv: in_channels must be divisible by towers "
                                     "with divide_input=True")
        if out_channels % towers:
            raise LayerArgumentError("PNAConv: out_channels must be divisible by towers")
        self.edge_dim, self.divide_input = edge_dim, divide_input
        self.flow = check_flow("PNAConv", flow)
        self.F_in = in_channels // towers if divide_input else in_channels
        self.F_out = out_channels // towers
        self.aggr_module = DegreeScalerAggregation(list(aggregators), list(scalers), deg,
                                                   train_norm)
        if edge_dim is not None:
            self.edge_encoder = torch.nn.Linear(edge_dim, self.F_in)
        else:
            self.register_module("edge_encoder", None)
        act = _activation(act, act_kwargs)
        width = (3 if edge_dim else 2) * self.F_in
        self.pre_nns = torch.nn.ModuleList(_stack(width, self.F_in, pre_layers, act)
                                           for _ in range(towers))
        combined = (len(aggregators) * len(scalers) + 1) * self.F_in
        self.post_nns = torch.nn.ModuleList(_stack(combined, self.F_out, post_layers, act)
                                            for _ in range(towers))
        self.lin = torch.nn.Linear(out_channels, out_channels)

    def reset_parameters(self) -> None:
        self.aggr_module.reset_parameters()
        for module in (self.edge_encoder, *self.pre_nns, *self.post_nns, self.lin):
            if module is None:
                continue
            for child in module.modules():
                if isinstance(child, torch.nn.Linear):
                    child.reset_parameters()

    def forward(self, x, edge_index, edge_attr=None):
        """Per tower: pre-network messages, aggregators times degree scalers, post-network; then
        lin.

        Args:
            x: node features (N, in_channels).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_attr: edge features (E, edge_dim), used when edge_dim is set.

        Returns:
            Tensor (N, out_channels).
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise LayerArgumentError(f"PNAConv: x is {found}, expected a 2-D tensor")
        adj = adjacency("PNAConv", edge_index, self.flow)
        if edge_attr is None and self.edge_encoder is not None:
            edge_attr = adj.values
        n, t = x.size(0), self.towers
        if self.divide_input:
            h = x.view(n, t, self.F_in)
        else:
            h = x.view(n, 1, self.F_in).expand(n, t, self.F_in)
        names = fused_names(self.aggr_module.aggr)
        if names is not None and isinstance(adj.relation, (Graph, torch.Tensor)):
            # inside torch.compile: opaque ops for the edge order and the aggregation,
            # the tower networks and the scalers in the traced graph
            ei = region(edge_order_region, adj.relation, ("PNAConv",), (x, x),
                        (("edge_index", edge_count(adj.relation)),))
            msgs = self._messages(h, ei, edge_attr)
            width = self.F_in * len(names.split("|"))
            agg, deg = region(_pna_region, adj.relation, ("PNAConv", names), (msgs, x),
                              ((1, 0, (t, width)), (1, 0, ())))
            agg = self.aggr_module.scale(agg, deg)
        else:
            graph = relation("PNAConv", adj.relation, n, n)
            edges, ei = edges_to_destinations(graph)
            ei = torch.tensor(ei, device=x.device)    # (the memo's array is read-only)
            agg = self.aggr_module.over(edges, self._messages(h, ei, edge_attr))
        out = torch.cat([h, agg], dim=-1)
        out = torch.cat([nn(out[:, i]) for i, nn in enumerate(self.post_nns)], dim=1)
        return self.lin(out)

    def _messages(self, h, ei, edge_attr):
        """The towers' pre-network messages (E, towers, F_in) from [x_i, x_j(, E e_ji)]."""
        t = self.towers
        parts = [h[ei[1]], h[ei[0]]]
        if self.edge_encoder is not None and edge_attr is not None:
            if edge_attr.size(0) != ei.size(1):
                raise LayerArgumentError(f"PNAConv: edge_attr has {edge_attr.size(0)} rows, "
                                         f"expected {ei.size(1)} (one per edge)")
            e = self.edge_encoder(edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr)
            parts.append(e.view(-1, 1, self.F_in).expand(-1, t, self.F_in))
        z = torch.cat(parts, dim=-1)
        return torch.stack([nn(z[:, i]) for i, nn in enumerate(self.pre_nns)], dim=1)

    @staticmethod
    def get_degree_histogram(loader) -> torch.Tensor:
        """The histogram of in-degrees over the graphs a loader yields (PyG Data or
        Batch objects with edge_index and num_nodes): entry d counts nodes of degree d."""
        hist = torch.zeros(0, dtype=torch.long)
        for data in loader:
            n = int(data.num_nodes)
            deg = torch.bincount(data.edge_index[1].long().cpu(), minlength=n)
            counts = torch.bincount(deg, minlength=1)
            if counts.numel() > hist.numel():
                hist = torch.cat([hist, hist.new_zeros(counts.numel() - hist.numel())])
            hist[:counts.numel()] += counts
        return hist

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"towers={self.towers}, edge_dim={self.edge_dim})")


__all__ = ["DegreeScalerAggregation", "PNAConv", "edges_to_destinations"]
