"""torch_bridge: the inputs PyG's layers take besides x (N, F) and an edge_index (2, E),
brought to what the tg.nn layers aggregate over.

- node features: x, or a pair (x_src, x_dst) whose x_dst may be None (then `size=` or a
  sparse adjacency gives the destination count, else max(target) + 1, as PyG's scatter);
  a 3-D "static graph" x (B, N, F) shares one relation across the B graphs: the layers
  aggregate it nodes first, (N, B, F), and hand it back as (B, N, F);
- the relation: a tg.Graph, an edge_index (2, E) (int32 or int64), or a torch.sparse
  adjacency adj_t (COO, CSR or CSC) of shape (destinations, sources) whose values are the
  edge weights / attributes; flow="target_to_source" reads edge_index's rows swapped;
- lazy in_channels=-1: a Linear whose input width is read on the first call.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from ...core.errors import ShapeError
from ...core.graph import Graph
from .common import (
    LayerArgumentError,
    below_functorch,
    linear,
    reset_glorot,
    snapshot,
    unchanged,
)

SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
FLOWS = ("source_to_target", "target_to_source")


def check_flow(layer: str, flow: str) -> str:
    if flow not in FLOWS:
        raise LayerArgumentError(f"{layer}: flow is {flow!r}, expected one of {FLOWS}")
    return flow


def is_sparse(adj) -> bool:
    return isinstance(adj, torch.Tensor) and adj.layout in SPARSE_LAYOUTS


def node_inputs(layer: str, x, static: bool = True) -> tuple:
    """(x_src, x_dst or None) from a tensor or a pair; each (N, F), or (B, N, F) where the
    layer takes PyG's static-graph input (static=True)."""
    if isinstance(x, torch.Tensor):
        pair = (x, x)
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        pair = tuple(x)
    else:
        raise LayerArgumentError(f"{layer}: x is {type(x).__name__}, expected a 2-D torch "
                                 "tensor or a pair (x_src, x_dst) of them")
    dims = (2, 3) if static else (2,)
    for name, t in zip(("x_src", "x_dst"), pair):
        if t is None and name == "x_dst":
            continue
        if not isinstance(t, torch.Tensor) or t.dim() not in dims:
            found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            want = "a 2-D tensor (nodes, features)" + (
                " or a 3-D static-graph tensor (batch, nodes, features)" if static else "")
            raise ShapeError(f"{layer}: {name} is {found}, expected {want}")
    if pair[1] is not None and pair[1].dim() != pair[0].dim():
        raise ShapeError(f"{layer}: x_src is {pair[0].dim()}-D and x_dst "
                         f"{pair[1].dim()}-D, expected the same")
    return pair


def nodes_first(t):
    """A static-graph tensor (B, N, ...) as (N, B, ...); 2-D tensors and None unchanged."""
    return t.transpose(0, 1) if t is not None and t.dim() == 3 else t


def batch_first(t, like):
    """nodes_first's inverse where `like` (the layer's input) is a static-graph tensor."""
    return t.transpose(0, 1) if like is not None and like.dim() == 3 else t


def node_count(t) -> int:
    return t.size(-2)


class Adjacency:
    """A layer's relation argument, read: `relation` (a tg.Graph or an edge_index (2, E)
    [sources; targets] to build one from), `values` (a sparse adjacency's values, in that
    edge order, else None) and `sparse` (the sparse adjacency given, else None)."""

    __slots__ = ("relation", "values", "sparse")

    def __init__(self, relation, values=None, sparse=None):
        self.relation, self.values, self.sparse = relation, values, sparse

    def num_dst(self, layer: str, size, x_dst) -> int:
        """The destination count: x_dst's rows, size[1], the adjacency's rows, or (PyG's
        scatter) max(target) + 1."""
        if x_dst is not None:
            return node_count(x_dst)
        if size is not None and size[1] is not None:
            return int(size[1])
        if self.sparse is not None:
            return int(self.sparse.size(0))
        if isinstance(self.relation, Graph):
            return self.relation.num_dst
        targets = torch.as_tensor(self.relation)[1]
        return int(targets.max()) + 1 if targets.numel() else 0


def adjacency(layer: str, edge_index, flow: str = "source_to_target") -> Adjacency:
    """The relation argument of a layer's forward, read (see the module's docstring)."""
    if isinstance(edge_index, Graph):
        if flow == "target_to_source":
            return Adjacency(edge_index.transpose()[0])
        return Adjacency(edge_index)
    if is_sparse(edge_index):
        if flow != "source_to_target":
            raise LayerArgumentError(
                f"{layer}: flow 'target_to_source' is invalid for a torch.sparse adjacency "
                "(it is adj_t: rows are the targets); transpose it instead")
        return Adjacency(_converted(edge_index, "sparse"), _sparse_values(edge_index),
                         edge_index)
    if flow == "target_to_source":
        if isinstance(edge_index, torch.Tensor):
            return Adjacency(_converted(edge_index, "flip"))
        return Adjacency(edge_index[::-1])
    return Adjacency(edge_index)


def _sparse_values(adj):
    if adj.layout == torch.sparse_coo:
        return (adj if adj.is_coalesced() else adj.coalesce()).values()
    if adj.layout == torch.sparse_csc:
        return adj.to_sparse_csr().values()   # (CSR order: targets, then sources)
    return adj.values()


def _edge_index_of(adj) -> torch.Tensor:
    """[sources; targets] of adj_t (targets x sources), in its stored (row-major) order."""
    if adj.layout == torch.sparse_coo:
        rows, cols = (adj if adj.is_coalesced() else adj.coalesce()).indices()
    else:
        csr = adj if adj.layout == torch.sparse_csr else adj.to_sparse_csr()
        crow, cols = csr.crow_indices(), csr.col_indices()
        rows = torch.repeat_interleave(torch.arange(len(crow) - 1, device=crow.device),
                                       crow.diff())
    return torch.stack([cols, rows.to(cols.dtype)]).detach()


@torch.compiler.disable(reason="tg.nn layers read a sparse or flipped relation eagerly")
@below_functorch
def _converted(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The edge_index of a sparse adjacency ("sparse") or edge_index with its rows swapped
    ("flip"), memoised per tensor object and version (so relation()'s memo finds it)."""
    key = (id(t), t._version, kind)
    found = _CONVERTED.get(key)
    content = _content(t)
    if found is not None and found[0]() is t and len(found[2]) == len(content) and all(
            unchanged(a, b) for a, b in zip(content, found[2])):
        _CONVERTED.move_to_end(key)
        return found[1]
    out = _edge_index_of(t) if kind == "sparse" else t.detach().flip(0)
    _CONVERTED[key] = (weakref.ref(t, lambda _ref: _CONVERTED.pop(key, None)), out,
                       tuple(snapshot(c) for c in content))
    if len(_CONVERTED) > 32:
        _CONVERTED.popitem(last=False)
    return out


_CONVERTED: OrderedDict = OrderedDict()


def _content(t: torch.Tensor) -> tuple:
    """The index tensors a conversion reads (checked on a memo hit: see common.unchanged)."""
    if t.layout == torch.sparse_coo:
        return (t._indices(),)
    if t.layout == torch.sparse_csr:
        return (t.crow_indices(), t.col_indices())
    if t.layout == torch.sparse_csc:
        return (t.ccol_indices(), t.row_indices())
    return (t,)


def sparse_like(adj, edge_index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A sparse adjacency in `adj`'s layout (COO, else CSR) holding `values` (E, ...) at
    the edges [sources; targets] (PyG returns attention weights so for a sparse input)."""
    n_dst, n_src = adj.size(0), adj.size(1)
    index = torch.stack([edge_index[1], edge_index[0]])
    out = torch.sparse_coo_tensor(index, values, (n_dst, n_src) + tuple(values.shape[1:]))
    out = out.coalesce()
    if adj.layout == torch.sparse_coo:
        return out
    rows, cols = out.indices()
    crow = torch.zeros(n_dst + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n_dst), 0)
    return torch.sparse_csr_tensor(crow, cols, out.values(), out.shape)


def check_size(layer: str, size, n_src: int, n_dst) -> None:
    """PyG's optional size=(sources, destinations): here it must agree with the inputs."""
    if size is None:
        return
    if len(size) != 2:
        raise ShapeError(f"{layer}: size is {tuple(size)}, expected (sources, destinations)")
    for given, have in ((size[0], n_src), (size[1], n_dst)):
        if given is not None and have is not None and int(given) != have:
            raise ShapeError(f"{layer}: size is {tuple(size)}, but x has {n_src} source and "
                             f"{n_dst} destination rows")


# ---- lazy in_channels=-1 ----------------------------------------------------------------------

def is_lazy(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n == -1


class LazyLinear(torch.nn.LazyLinear):
    """torch's LazyLinear (weight, bias; in_features read on the first call) initialised as
    PyG's Linear once it has its shape: glorot where the layer asks for it. It keeps its
    class after that call (so reset_parameters() keeps the initialisation)."""

    cls_to_become = None

    def __init__(self, out_features: int, bias: bool = True, glorot: bool = False):
        self._glorot = glorot
        super().__init__(out_features, bias=bias)

    def reset_parameters(self) -> None:
        if self.has_uninitialized_params() or self.in_features == 0:
            return
        if self._glorot:
            reset_glorot(self)
        else:
            torch.nn.Linear.reset_parameters(self)


def make_linear(n_in: int, n_out: int, bias: bool, glorot: bool) -> torch.nn.Linear:
    """common.linear, or a LazyLinear for PyG's in_channels=-1."""
    if is_lazy(n_in):
        return LazyLinear(n_out, bias=bias, glorot=glorot)
    return linear(n_in, n_out, bias=bias, glorot=glorot)


def check_in_channels(layer: str, value, pair: bool = True) -> tuple:
    """(source, destination) input widths from an int or, where allowed, a pair; -1 (PyG's
    lazy initialisation) is kept: the widths are read on the first call."""
    def one(name, v):
        if is_lazy(v):
            return -1
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise LayerArgumentError(f"{layer}: {name} is {v!r}, expected a positive int "
                                     "or -1 (lazy)")
        return v
    if pair and isinstance(value, (tuple, list)) and len(value) == 2:
        return one("in_channels[0]", value[0]), one("in_channels[1]", value[1])
    n = one("in_channels", value)
    return n, n
