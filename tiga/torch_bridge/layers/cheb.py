"""torch_bridge: tg.nn.ChebConv, PyG's Chebyshev spectral convolution, each application of
the scaled Laplacian one Tiga propagate (the per-edge Laplacian weights and the
projections stay in torch)."""
from __future__ import annotations

import torch

from ...core.errors import ShapeError
from .common import WEIGHTED_SUM, LayerArgumentError, check_positive, edge_index_like, relation
from .hops import check_k, edge_weight_of
from .inputs import adjacency, check_in_channels, make_linear
from .opaque import region

NORMALIZATIONS = (None, "sym", "rw")


def _scaled_laplacian(edge_index, normalization, edge_weight, batch, lam, x) -> tuple:
    """(relation without loops, off-diagonal weights c, diagonal d): L_hat = 2 L / lambda
    - I as PyG's ChebConv forms it: self loops removed, then L of get_laplacian (degree
    by source, over the remaining edges), scaled by 2 / lambda_max (an infinite entry set
    to 0), then -1 on the diagonal. lam: a scalar, or one value per graph of `batch`
    (read at each edge's source)."""
    n = x.size(0)
    graph = relation("ChebConv", edge_index, n, n)
    w = edge_weight
    if w is None:
        w = torch.ones(graph.num_edges, dtype=x.dtype, device=x.device)
    elif tuple(w.shape) != (graph.num_edges,):
        raise ShapeError(f"ChebConv: edge_weight is {tuple(w.shape)}, expected a tensor of "
                         f"shape ({graph.num_edges},): one weight per edge")
    bare, keep = graph.remove_self_loops()
    w = w[torch.tensor(keep, device=w.device)]
    ei = edge_index_like(bare, x)
    src, dst = ei[0], ei[1]
    deg = w.new_zeros(n).index_add(0, src, w)
    if normalization == "sym":
        dis = deg.pow(-0.5)
        dis = dis.masked_fill(dis == float("inf"), 0.0)
        off, diag = -(dis[src] * w * dis[dst]), torch.ones_like(deg)
    elif normalization == "rw":
        inv = 1.0 / deg
        off, diag = -(inv.masked_fill(inv == float("inf"), 0.0)[src] * w), torch.ones_like(deg)
    else:
        off, diag = -w, deg
    if batch is not None and lam.numel() > 1:
        lam_edge, lam_node = lam[batch[src]], lam[batch]
    else:
        lam_edge = lam_node = lam.reshape(())
    off = (2.0 * off) / lam_edge
    diag = (2.0 * diag) / lam_node
    off = off.masked_fill(off == float("inf"), 0.0)
    diag = diag.masked_fill(diag == float("inf"), 0.0) - 1.0
    return bare, off, diag


def _cheb_region(edge_index, settings, edge_weight, batch, lam, x):
    """T_0 .. T_{K-1} of x (T_1 = L_hat x, T_k = 2 L_hat T_{k-1} - T_{k-2}): node rows."""
    k, normalization = settings
    graph, off, diag = _scaled_laplacian(edge_index, normalization, edge_weight, batch, lam,
                                         x)

    def apply(h):
        return (WEIGHTED_SUM(graph=graph, src={"h": h}, edge={"w": off.unsqueeze(-1)}) +
                diag.unsqueeze(-1) * h)

    outs = [x]
    if k > 1:
        outs.append(apply(x))
    for _ in range(2, k):
        outs.append(2.0 * apply(outs[-1]) - outs[-2])
    return tuple(outs)


class ChebConv(torch.nn.Module):
    """PyG's ChebConv: `x' = sum_{k<K} lins[k](T_k) + bias`, T_0 = x, T_1 = L_hat x,
    T_k = 2 L_hat T_{k-1} - T_{k-2}, L_hat = 2 L / lambda_max - I with L the graph
    Laplacian (normalization "sym": I - D^-1/2 A D^-1/2, "rw": I - D^-1 A, None: D - A;
    self loops dropped, D the weighted degree by source, as PyG's get_laplacian).

    Parameter names (`lins.<k>.weight`, glorot; `bias`) are PyG's; in_channels=-1 is lazy.
    forward(x, edge_index, edge_weight=None, batch=None, lambda_max=None): lambda_max a
    float or tensor, one per graph of `batch` (PyG's batched graphs); default 2.0, which
    only "sym" may assume (else a LayerArgumentError, a ValueError as PyG's).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int,
                 normalization: str | None = "sym", bias: bool = True):
        super().__init__()
        self.in_channels = check_in_channels("ChebConv", in_channels, pair=False)[0]
        self.out_channels = check_positive("ChebConv", "out_channels", out_channels)
        self.K = check_k("ChebConv", K)
        if normalization not in NORMALIZATIONS:
            raise LayerArgumentError(f"ChebConv: normalization is {normalization!r}, "
                                     f"expected one of {NORMALIZATIONS} (Invalid "
                                     "normalization)")
        self.normalization = normalization
        self.lins = torch.nn.ModuleList(make_linear(in_channels, out_channels, bias=False,
                                                    glorot=True) for _ in range(K))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        for lin in self.lins:
            lin.reset_parameters()
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x, edge_index, edge_weight=None, batch=None, lambda_max=None):
        """Sum over k < K of `lins[k](T_k(L_hat) x)`, the Chebyshev basis of the scaled Laplacian.

        Args:
            x: node features (N, in_channels).
            edge_index: the relation: a (2, E) integer tensor of (source, destination) rows
                (int32 or int64), or a torch.sparse adjacency adj_t (N_dst, N_src; CSR or COO),
                whose values are read as edge weights or features where the layer takes them.
            edge_weight: optional (E,) edge weights (1 when None).
            batch: optional graph id per node (N,) for a batch of graphs (one lambda_max each).
            lambda_max: the largest eigenvalue (a float, or one per graph of batch); 2.0 when
                None, which only normalization='sym' may assume.

        Returns:
            Tensor (N, out_channels).
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(f"ChebConv: x is {found}, expected a 2-D tensor (nodes, "
                             "features)")
        if self.normalization != "sym" and lambda_max is None:
            raise LayerArgumentError("ChebConv: you need to pass `lambda_max` to `forward()` "
                                     "in case the normalization is non-symmetric")
        if lambda_max is None:
            lambda_max = 2.0
        lam = torch.as_tensor(lambda_max, dtype=x.dtype, device=x.device)
        adj = adjacency("ChebConv", edge_index)
        edge_weight = edge_weight_of(adj, edge_weight, x)
        ts = region(_cheb_region, adj.relation, (self.K, self.normalization),
                    (edge_weight, batch, lam, x), ((3, 3),) * self.K)
        ts = ts if isinstance(ts, tuple) else (ts,)
        out = sum(lin(t) for lin, t in zip(self.lins, ts))
        return out if self.bias is None else out + self.bias

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, K={self.K}, "
                f"normalization={self.normalization})")


__all__ = ["ChebConv"]
