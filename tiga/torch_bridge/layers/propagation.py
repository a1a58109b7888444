"""torch_bridge: tg.nn.SGConv, APPNP, TAGConv and GCN2Conv, PyG's layers that repeat the
GCN-normalised hop A_hat h (hops.py: each hop one Tiga propagate); their projections
stay in torch.

Inputs as GCNConv's: x (N, F) or a static-graph x (B, N, F); edge_index a tg.Graph, a
(2, E) integer tensor (int32 or int64) or a torch.sparse adj_t whose values are the edge
weights; flow="target_to_source" reads edge_index's rows swapped.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import LayerArgumentError, check_positive, glorot_
from .hops import NormCache, check_k, edge_weight_of, hop, normalized, with_weights
from .inputs import (
    adjacency,
    batch_first,
    check_flow,
    check_in_channels,
    make_linear,
    nodes_first,
)
from .opaque import region


def _check_x(layer: str, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise LayerArgumentError(f"{layer}: x is {found}, expected a 2-D tensor (nodes, "
                                 "features) or a 3-D static-graph tensor (batch, nodes, "
                                 "features)")


def _hops_region(edge_index, settings, edge_weight, h):
    """h after K hops (settings: K, add_self_loops, normalize): node rows out."""
    k, loops, normalize = settings
    norm = normalized("SGConv", edge_index, edge_weight, h, add_self_loops=loops,
                      normalize=normalize)
    for _ in range(k):
        h = hop(norm, h)
    return h


class SGConv(torch.nn.Module):
    """PyG's SGConv (simplified graph convolution): x' = lin(A_hat^K x), A_hat = D^-1/2
    (A + I) D^-1/2 (GCNConv's normalisation and remaining self loops).

    Parameter names (`lin.weight`, `lin.bias`) and arguments are PyG's; in_channels=-1 is
    lazy. forward(x, edge_index, edge_weight=None). cached=True (PyG: transductive only)
    keeps A_hat^K x of the first call; unlike PyG, which returns it for any later input, a
    call with another relation or other x values raises a LayerArgumentError
    (reset_parameters() drops the cache).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        self.in_channels = check_in_channels("SGConv", in_channels, pair=False)[0]
        self.out_channels = check_positive("SGConv", "out_channels", out_channels)
        self.K = check_k("SGConv", K)
        self.cached, self.add_self_loops = cached, add_self_loops
        self.flow = check_flow("SGConv", flow)
        self._cache = None
        self.lin = make_linear(in_channels, out_channels, bias=bias, glorot=False)

    @property
    def _cached_x(self):
        """PyG's name for the cached A_hat^K x (nodes first), or None."""
        return None if self._cache is None else self._cache.value[0]

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        self._cache = None

    def forward(self, x, edge_index, edge_weight=None):
        """K normalized propagation steps, then the linear layer.

        Args:
            x: node features (N, in_channels) (or a static-graph batch (B, N, in_channels)).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).

        Returns:
            Tensor (N, out_channels) ((B, N, out_channels) for a 3-D x).
        """
        _check_x("SGConv", x)
        adj = adjacency("SGConv", edge_index, self.flow)
        edge_weight = edge_weight_of(adj, edge_weight, x)
        h = nodes_first(x)
        if self.cached:
            h = self._cached_hops(adj, edge_weight, h)
        else:
            h = region(_hops_region, adj.relation, (self.K, self.add_self_loops, True),
                       (edge_weight, h), ((1, 1),))
        return self.lin(batch_first(h, x))

    def _cached_hops(self, adj, edge_weight, h):
        if self._cache is None:
            with torch.no_grad():
                out = _hops_region(adj.relation, (self.K, self.add_self_loops, True),
                                   edge_weight, h)
            self._cache = NormCache("SGConv", adj.relation, edge_weight, h.size(0),
                                    (out, h.detach().clone()))
            return out
        self._cache.check(adj.relation, edge_weight, h.size(0))
        out, seen = self._cache.value
        if seen.shape != h.shape or not torch.equal(seen, h.detach()):
            raise LayerArgumentError(
                "SGConv: cached=True holds A_hat^K x of the first call's x, and this call's "
                "x differs (PyG would silently return the stale one); use cached=False, or "
                "call reset_parameters() to drop the cache")
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, K={self.K})"


def _appnp_region(edge_index, settings, edge_weight, x):
    """APPNP's K steps without dropout: node rows out."""
    k, alpha, loops, normalize = settings
    norm = normalized("APPNP", edge_index, edge_weight, x, add_self_loops=loops,
                      normalize=normalize)
    return _appnp_steps(norm, x, k, alpha, 0.0)


def _appnp_steps(norm, x, k: int, alpha: float, dropout: float):
    """x <- (1 - alpha) A_hat x + alpha h, K times; dropout drops the normalised edge
    weights, anew each step on the previous step's (PyG's compounding draw)."""
    h, w = x, norm[1]
    for _ in range(k):
        if dropout > 0:
            w = F.dropout(w, p=dropout)
        x = hop(with_weights(norm, w), x) * (1 - alpha)
        x = x + alpha * h
    return x


class APPNP(torch.nn.Module):
    """PyG's APPNP (personalised PageRank propagation): h = x, then K times
    x <- (1 - alpha) A_hat x + alpha h, A_hat GCNConv's normalisation (normalize=False: the
    plain weighted sum, no loops). No parameters.

    forward(x, edge_index, edge_weight=None). dropout=p drops the normalised edge weights
    in training mode (F.dropout, p of them zeroed, the rest scaled by 1/(1-p), again at
    every step on the last step's weights, as PyG). cached=True keeps the normalisation of
    the first call (edge weights then get no gradient); a later call on another relation
    raises a LayerArgumentError (PyG silently reuses the stale one).
    `_cached_edge_index` is PyG's name for it; `_cached_adj_t` (PyG's torch_sparse cache)
    is always None: a torch.sparse adjacency is cached as an edge_index is.
    """

    _cached_adj_t = None

    def __init__(self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        self.K = check_k("APPNP", K, low=0)
        self.alpha, self.dropout = alpha, dropout
        self.cached, self.add_self_loops, self.normalize = cached, add_self_loops, normalize
        self.flow = check_flow("APPNP", flow)
        self._cache = None

    @property
    def _cached_edge_index(self):
        return None if self._cache is None else self._cache.value[:2]

    def reset_parameters(self) -> None:
        self._cache = None

    def forward(self, x, edge_index, edge_weight=None):
        """K steps of personalized propagation: x <- (1 - alpha) A_hat x + alpha x_0.

        Args:
            x: node features (N, F) (or a static-graph batch (B, N, F)).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).

        Returns:
            Tensor shaped as x: (N, F) or (B, N, F).
        """
        _check_x("APPNP", x)
        adj = adjacency("APPNP", edge_index, self.flow)
        edge_weight = edge_weight_of(adj, edge_weight, x)
        h = nodes_first(x)
        dropout = self.dropout if self.training else 0.0
        if not self.cached and dropout == 0:
            out = region(_appnp_region, adj.relation,
                         (self.K, float(self.alpha), self.add_self_loops, self.normalize),
                         (edge_weight, h), ((1, 1),))
            return batch_first(out, x)
        norm = self._norm(adj, edge_weight, h)
        return batch_first(_appnp_steps(norm, h, self.K, self.alpha, dropout), x)

    def _norm(self, adj, edge_weight, h):
        def compute():
            return normalized("APPNP", adj.relation, edge_weight, h,
                              add_self_loops=self.add_self_loops, normalize=self.normalize)
        if not self.cached:
            return compute()
        if self._cache is None:
            with torch.no_grad():
                self._cache = NormCache("APPNP", adj.relation, edge_weight, h.size(0),
                                        compute())
        else:
            self._cache.check(adj.relation, edge_weight, h.size(0))
        return self._cache.value

    def __repr__(self) -> str:
        return f"{type(self).__name__}(K={self.K}, alpha={self.alpha})"


def _tag_region(edge_index, settings, edge_weight, h):
    """TAGConv's hops A_hat^k h, k = 1..K (gcn_norm without loops): K node outputs."""
    k, normalize = settings
    norm = normalized("TAGConv", edge_index, edge_weight, h, add_self_loops=False,
                      normalize=normalize)
    outs = []
    for _ in range(k):
        h = hop(norm, h)
        outs.append(h)
    return tuple(outs)


class TAGConv(torch.nn.Module):
    """PyG's TAGConv (topology adaptive): `x' = sum_{k=0..K} lins[k](A_hat^k x) + bias`,
    A_hat = D^-1/2 A D^-1/2 without self loops (normalize=False: the weighted A).

    Parameter names (`lins.<k>.weight`, `bias`) are PyG's; in_channels=-1 is lazy.
    forward(x, edge_index, edge_weight=None); x may be a static-graph (B, N, F).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 3, bias: bool = True,
                 normalize: bool = True, flow: str = "source_to_target"):
        super().__init__()
        self.in_channels = check_in_channels("TAGConv", in_channels, pair=False)[0]
        self.out_channels = check_positive("TAGConv", "out_channels", out_channels)
        self.K = check_k("TAGConv", K, low=0)
        self.normalize = normalize
        self.flow = check_flow("TAGConv", flow)
        self.lins = torch.nn.ModuleList(make_linear(in_channels, out_channels, bias=False,
                                                    glorot=False) for _ in range(K + 1))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        for lin in self.lins:
            lin.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_weight=None):
        """Sum over hops k = 0..K of `lins[k](A_hat^k x)`, plus bias.

        Args:
            x: node features (N, in_channels) (or a static-graph batch (B, N, in_channels)).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).

        Returns:
            Tensor (N, out_channels) ((B, N, out_channels) for a 3-D x).
        """
        _check_x("TAGConv", x)
        adj = adjacency("TAGConv", edge_index, self.flow)
        edge_weight = edge_weight_of(adj, edge_weight, x)
        out = self.lins[0](x)
        if self.K > 0:
            hops = region(_tag_region, adj.relation, (self.K, self.normalize),
                          (edge_weight, nodes_first(x)), ((1, 1),) * self.K)
            hops = hops if isinstance(hops, tuple) else (hops,)
            for lin, h in zip(self.lins[1:], hops):
                out = out + lin(batch_first(h, x))
        return out if self.bias is None else out + self.bias

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, K={self.K})"


def _gcn2_region(edge_index, settings, edge_weight, h):
    loops, normalize = settings
    return hop(normalized("GCN2Conv", edge_index, edge_weight, h, add_self_loops=loops,
                          normalize=normalize), h)


class GCN2Conv(torch.nn.Module):
    """PyG's GCN2Conv (GCNII): with p = (1 - alpha) A_hat x + alpha x_0,
    x' = (1 - beta) p + beta p W1 (shared_weights=True), else
    x' = (1 - beta) (1 - alpha) A_hat x + beta ((1 - alpha) A_hat x) W1
         + (1 - beta) alpha x_0 + beta (alpha x_0) W2,
    beta = log(theta / layer + 1) where theta and layer are given (else 1). A_hat as
    GCNConv's. Parameter names (`weight1`, `weight2`: (channels, channels), glorot) are
    PyG's.

    forward(x, x_0, edge_index, edge_weight=None): x and x_0 (N, channels) (x_0's first N
    rows are used, as PyG). cached=True as APPNP's.
    """

    _cached_adj_t = None

    def __init__(self, channels: int, alpha: float, theta: float | None = None,
                 layer: int | None = None, shared_weights: bool = True, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True,
                 flow: str = "source_to_target"):
        super().__init__()
        self.channels = check_positive("GCN2Conv", "channels", channels)
        self.alpha = alpha
        self.beta = 1.0
        if theta is not None or layer is not None:
            if theta is None or layer is None:
                raise LayerArgumentError("GCN2Conv: give both theta and layer, or neither")
            self.beta = math.log(theta / layer + 1)
        self.cached, self.add_self_loops, self.normalize = cached, add_self_loops, normalize
        self.flow = check_flow("GCN2Conv", flow)
        self._cache = None
        self.weight1 = torch.nn.Parameter(torch.empty(channels, channels))
        if shared_weights:
            self.register_parameter("weight2", None)
        else:
            self.weight2 = torch.nn.Parameter(torch.empty(channels, channels))
        self.reset_parameters()

    @property
    def _cached_edge_index(self):
        return None if self._cache is None else self._cache.value[:2]

    def reset_parameters(self) -> None:
        glorot_(self.weight1)
        if self.weight2 is not None:
            glorot_(self.weight2)
        self._cache = None

    def forward(self, x, x_0, edge_index, edge_weight=None):
        """One GCNII layer: propagation with an initial residual and an identity map.

        Args:
            x: node features (N, channels).
            x_0: the initial features (N', channels), N' >= N (its first N rows are used).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).

        Returns:
            Tensor (N, channels).
        """
        for name, t in (("x", x), ("x_0", x_0)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise LayerArgumentError(f"GCN2Conv: {name} is {found}, expected a 2-D "
                                         "tensor (nodes, channels)")
        adj = adjacency("GCN2Conv", edge_index, self.flow)
        edge_weight = edge_weight_of(adj, edge_weight, x)
        settings = (self.add_self_loops, self.normalize)
        if self.cached:
            if self._cache is None:
                with torch.no_grad():
                    norm = normalized("GCN2Conv", adj.relation, edge_weight, x,
                                      add_self_loops=settings[0], normalize=settings[1])
                self._cache = NormCache("GCN2Conv", adj.relation, edge_weight, x.size(0),
                                        norm)
            else:
                self._cache.check(adj.relation, edge_weight, x.size(0))
            h = hop(self._cache.value, x)
        else:
            h = region(_gcn2_region, adj.relation, settings, (edge_weight, x), ((1, 1),))
        h = h * (1 - self.alpha)
        x_0 = self.alpha * x_0[:h.size(0)]
        b = self.beta
        if self.weight2 is None:
            out = h + x_0
            return torch.addmm(out, out, self.weight1, beta=1.0 - b, alpha=b)
        return (torch.addmm(h, h, self.weight1, beta=1.0 - b, alpha=b) +
                torch.addmm(x_0, x_0, self.weight2, beta=1.0 - b, alpha=b))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.channels}, alpha={self.alpha}, "
                f"beta={self.beta})")


__all__ = ["APPNP", "GCN2Conv", "SGConv", "TAGConv"]
