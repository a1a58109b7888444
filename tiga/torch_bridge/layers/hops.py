"""torch_bridge: what the propagation layers (SGConv, APPNP, TAGConv, GCN2Conv) share:
PyG's gcn_norm'd relation (GCNConv's own routine, gcn.py) and the hop A_hat h, each hop one
Tiga propagate, plus the normalisation cache their cached=True keeps.

A hop is sum_{j -> i} dis(j) w(j -> i) dis(i) h_j over the relation with its loops (dis:
D^-1/2 of the weighted in-degree; without normalisation w(j -> i) h_j), so the normalised
weight is never materialised and the edge weights keep their gradient.
"""
from __future__ import annotations

import torch

from ...core.errors import ShapeError, TigaError
from .common import LayerArgumentError
from .gcn import _aggregate, _Cache, _normalized


def edge_weight_of(adj, edge_weight, like):
    """The edge weights given, else a torch.sparse adjacency's values (PyG reads them as
    the weights), else None."""
    if edge_weight is None and adj.values is not None:
        return adj.values.to(like.dtype)
    return edge_weight


def normalized(layer: str, edge_index, edge_weight, h, improved: bool = False,
               add_self_loops: bool = True, normalize: bool = True) -> tuple:
    """(relation, weights, D^-1/2 or None) for h's node count (h nodes first): PyG's
    gcn_norm, with the loops and fill values GCNConv documents. An argument error names
    `layer` (GCNConv's routine names GCNConv)."""
    try:
        return _normalized(edge_index, (improved, add_self_loops, normalize), edge_weight, h)
    except TigaError as exc:
        if "GCNConv" not in str(exc):
            raise
        raise _renamed(exc, layer) from None


def _renamed(exc: Exception, layer: str) -> Exception:
    """The same error with GCNConv's name replaced by the layer's."""
    try:
        return type(exc)(str(exc).replace("GCNConv", layer))
    except TypeError:   # an error type whose constructor takes more: keep it as it is
        return exc


def hop(norm: tuple, h: torch.Tensor) -> torch.Tensor:
    """A_hat h (h nodes first: (N, ...)): one Tiga propagate."""
    return _aggregate(*norm, h)


def with_weights(norm: tuple, w: torch.Tensor) -> tuple:
    """The normalisation with other edge weights (APPNP's dropped ones): dropping w drops
    dis(j) w dis(i) with the same mask and scale."""
    return (norm[0], w, norm[2])


class NormCache:
    """cached=True's store on a layer: what was computed on the first call (`value`) and
    the relation and edge weights it came from. A later call on another relation raises
    (PyG silently reuses the stale value); the same edges as another tensor, in another
    order or as a torch.sparse adjacency are the same relation (GCNConv's rule)."""

    def __init__(self, layer: str, edge_index, edge_weight, n: int, value):
        self.layer, self.value = layer, value
        self._held = _Cache(edge_index, edge_weight, n, None)

    def check(self, edge_index, edge_weight, n: int) -> None:
        try:
            self._held.check(edge_index, edge_weight, n)
        except (LayerArgumentError, ShapeError) as exc:
            raise _renamed(exc, self.layer) from None


def check_k(layer: str, k, low: int = 1) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < low:
        raise LayerArgumentError(f"{layer}: K is {k!r}, expected an int >= {low}")
    return k


__all__ = ["NormCache", "check_k", "edge_weight_of", "hop", "normalized", "with_weights"]
