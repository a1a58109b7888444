"""torch_bridge: what the tg.nn layers share: reading their relation argument, PyG's self
loops, argument checks, and the small Tiga aggregations they run on torch tensors.

Only the aggregations over a relation run in Tiga (MessagePassing calls on torch tensors,
whose backward is Tiga's compiled VJP); dense projections stay in torch.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import math
import secrets
import weakref
from collections import OrderedDict

import numpy as np
import torch

from ...core.errors import LayerArgumentError, ShapeError
from ...core.graph import Graph
from ...core.reducers import max as max_r
from ...core.reducers import mean as mean_r
from ...core.reducers import min as min_r
from ...core.reducers import prod as prod_r
from ...core.reducers import sum as sum_r
from ...trace.message_passing import MessagePassing
from ...xla_free_runtime.caches.relations import memo
from ..transforms import plain

REDUCERS = {"add": sum_r, "sum": sum_r, "mean": mean_r, "max": max_r, "min": min_r,
            "mul": prod_r}


def check_aggr(aggr, layer: str, choices=("add", "sum", "mean", "max", "min")) -> str:
    """PyG's aggregation name `aggr` if Tiga has its reducer, else a LayerArgumentError."""
    if not isinstance(aggr, str) or aggr not in choices:
        raise LayerArgumentError(f"{layer}: aggr is {aggr!r}, expected one of {choices}")
    return aggr


def check_positive(layer: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LayerArgumentError(f"{layer}: {name} is {value!r}, expected a positive int")
    return value


def node_pair(layer: str, x) -> tuple:
    """(x_src, x_dst) from a 2-D tensor or a pair of them (bipartite, PyG's convention)."""
    if isinstance(x, torch.Tensor):
        pair = (x, x)
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        pair = tuple(x)
    else:
        raise LayerArgumentError(f"{layer}: x is {type(x).__name__}, expected a 2-D torch "
                                 "tensor or a pair (x_src, x_dst) of them")
    for name, t in zip(("x_src", "x_dst"), pair):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ShapeError(f"{layer}: {name} is {found}, expected a 2-D tensor "
                             "(nodes, features)")
    return pair


# Building a relation reads edge_index's values and memoises by object (Dynamo cannot trace
# it). Inside torch.compile the layers call it inside their opaque tiga::layer op
# (opaque.py); what cannot be one (a numpy edge_index, a tensor GAT fill_value) reaches it
# here, behind this graph break
_OUTSIDE_DYNAMO = "tg.nn layers build their tg.Graph from edge_index eagerly"


def below_functorch(fn):
    """`fn(...)` on the values of its tensor arguments (an edge_index, edge types), with
    torch.func's transforms off: inside torch.func.grad / vmap / jvp every torch op's result
    is wrapped for the transform (a wrapper has no storage to read), and a relation is
    built from the values. A relation argument batched by vmap raises, saying what to batch
    instead."""
    params = [("edge_index" if p == "t" else p) for p in inspect.signature(fn).parameters]

    @functools.wraps(fn)
    def inner(*args):
        if torch._C._functorch.peek_interpreter_stack() is None:
            return fn(*args)
        layer = f"{args[0]}: " if isinstance(args[0], str) else ""
        args = [plain(a, layer + p) if isinstance(a, torch.Tensor) else a
                for a, p in zip(args, params + ["argument"] * len(args))]
        with torch._C._DisableFuncTorch():
            return fn(*args)
    return inner


@torch.compiler.disable(reason=_OUTSIDE_DYNAMO)
@below_functorch
def relation(layer: str, edge_index, num_src: int, num_dst: int) -> Graph:
    """A tg.Graph from the layer's relation argument: a tg.Graph (checked against the node
    counts) or a PyG edge_index (2, E) integer tensor/array, row 0 sources, row 1 targets.

    The relation built from a tensor is memoised per tensor object, its in-place version
    counter and the node counts, so a model that passes the same edge_index to every layer
    and every step builds (and validates) it once. A memo hit is checked against a copy of
    the values it was built from (one comparison, far cheaper than a build): a change that
    leaves the version counter alone (through .data or .numpy()) builds the relation
    anew, never serving a stale one."""
    if isinstance(edge_index, Graph):
        if (edge_index.num_src, edge_index.num_dst) != (num_src, num_dst):
            raise ShapeError(
                f"{layer}: edge_index is a relation of {edge_index.num_src} sources and "
                f"{edge_index.num_dst} destinations, but x has {num_src} source and "
                f"{num_dst} destination rows")
        return edge_index
    if not isinstance(edge_index, torch.Tensor):
        return _build_relation(layer, edge_index, num_src, num_dst)
    key = (id(edge_index), edge_index._version, num_src, num_dst)
    found = _RELATIONS.get(key)
    if found is not None and found[0]() is edge_index and unchanged(edge_index, found[1][1]):
        _RELATIONS.move_to_end(key)
        return found[1][0]
    graph = _build_relation(layer, edge_index.detach(), num_src, num_dst)
    _remember(_RELATIONS, key, edge_index, (graph, snapshot(edge_index)))
    return graph


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A copy of a memo key tensor's values, to check a later hit against."""
    return t.detach().clone()


def unchanged(t: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether `t` still holds the values `copy` was taken from (an in-place change through
    .data or .numpy() keeps the version counter, so identity and version are not enough).
    A contiguous CPU tensor is compared with libc's memcmp (about 3x torch.equal: 4 ms for
    an ogbn-arxiv edge_index on a 2-core VM), anything else with torch.equal."""
    if t.shape != copy.shape or t.dtype != copy.dtype:
        return False
    t = t.detach()
    flat = t.device.type == "cpu" and t.is_contiguous() and copy.is_contiguous()
    if _MEMCMP is not None and flat:
        size = t.numel() * t.element_size()
        return size == 0 or _MEMCMP(t.data_ptr(), copy.data_ptr(), size) == 0
    return torch.equal(t, copy)


def _libc_memcmp():
    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):    # no C library to load (Windows)
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


_MEMCMP = _libc_memcmp()


def _build_relation(layer: str, edge_index, num_src: int, num_dst: int) -> Graph:
    if num_src == num_dst:
        return Graph.from_edge_index(edge_index, num_nodes=num_src)
    arr = np.asarray(edge_index.cpu() if isinstance(edge_index, torch.Tensor) else edge_index)
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise ShapeError(f"{layer}: edge_index has shape {tuple(arr.shape)}, expected (2, E)")
    return Graph.from_coo(arr[0], arr[1], num_src=num_src, num_dst=num_dst)


@torch.compiler.disable(reason=_OUTSIDE_DYNAMO)
def loop_edit(graph: Graph, edit: str) -> tuple:
    """(graph, edge_ids) of graph.add_remaining_self_loops() (edit "remaining") or of PyG's
    GAT loops, remove then add (edit "replace": (graph, ids of the kept edges, number of
    loops)), memoised per relation object (relations are immutable)."""
    key = (id(graph), edit)
    found = _LOOPED.get(key)
    if found is not None and found[0]() is graph:
        _LOOPED.move_to_end(key)
        return found[1]
    if edit == "remaining":
        result = graph.add_remaining_self_loops()
    else:
        bare, keep = graph.remove_self_loops()
        looped, _ = bare.add_remaining_self_loops()
        result = (looped, keep, bare)
    _remember(_LOOPED, key, graph, result)
    return result


# small LRU memos keyed by object identity, checked through a weak reference (an id can be
# reused once its object is gone); an entry leaves when its object dies, so a training loop
# over fresh mini-batch graphs holds no dead relation
_MEMO_SIZE = 32
_RELATIONS: OrderedDict = OrderedDict()
_LOOPED: OrderedDict = OrderedDict()


def _remember(memo: OrderedDict, key, owner, value) -> None:
    memo[key] = (weakref.ref(owner, lambda _ref: memo.pop(key, None)), value)
    if len(memo) > _MEMO_SIZE:
        memo.popitem(last=False)


class Keyed(torch.nn.Module):
    """A layer a compiled region finds by an integer key (opaque.region's settings are
    Python constants): its edge network or cache stays on the layer, and a copy (deepcopy,
    pickle: both go through __setstate__) gets a key of its own."""

    def _new_key(self) -> None:
        key = secrets.randbits(62)
        _KEYED[key] = weakref.ref(self, lambda _ref: _KEYED.pop(key, None))
        self._key = key

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self._new_key()


def keyed(key: int):
    """The live layer of a key (compiled regions hold keys, not layers)."""
    layer = _KEYED[key]()
    if layer is None:
        raise LayerArgumentError(f"tg.nn: layer key {key} belongs to a layer that no longer "
                                 "exists (a compiled model outlived its module)")
    return layer


_KEYED: dict = {}


def edge_index_like(graph: Graph, like) -> torch.Tensor:
    """The relation's (2, E) int64 edge_index in its edge order, on `like`'s device."""
    return torch.tensor(graph.to_edge_index(), device=like.device)


def follow(field: torch.Tensor, edge_ids: np.ndarray, fill: torch.Tensor) -> torch.Tensor:
    """An edge field carried to a relation made by a loop edit: field[edge_ids], and `fill`
    (one row per new edge, or broadcastable) where edge_ids is -1."""
    ids = torch.tensor(edge_ids, device=field.device)
    new = ids < 0
    if not bool(new.any()):
        return field[ids]
    # gather from a padded copy, so that an empty field still has a row to read
    padded = torch.cat([field, field.new_zeros((1,) + tuple(field.shape[1:]))])
    picked = padded[torch.where(new, len(field), ids)]
    mask = new.view((-1,) + (1,) * (field.dim() - 1))
    return torch.where(mask, fill.to(field.dtype).expand_as(picked), picked)


def glorot_(t: torch.Tensor) -> None:
    """PyG's glorot init: uniform(-a, a), a = sqrt(6 / (fan_in + fan_out)) of the last two
    axes (the values differ from PyG's draws; a state dict loaded after makes them equal)."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


def reset_children(module: torch.nn.Module) -> None:
    """PyG's reset(nn): reset_parameters() of every submodule that has one."""
    for child in module.modules():
        if child is not module and hasattr(child, "reset_parameters"):
            child.reset_parameters()
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()


def reset_glorot(*tensors) -> None:
    """glorot_ on each tensor given, skipping None; a Linear as PyG's Linear with
    weight_initializer='glorot': glorot weight, bias uniform in +-1/sqrt(in_features)."""
    for t in tensors:
        if isinstance(t, torch.nn.Linear):
            glorot_(t.weight)
            if t.bias is not None:
                bound = 1.0 / math.sqrt(t.in_features) if t.in_features else 0.0
                torch.nn.init.uniform_(t.bias, -bound, bound)
        elif t is not None:
            glorot_(t)


def linear(n_in: int, n_out: int, bias: bool, glorot: bool) -> torch.nn.Linear:
    """torch.nn.Linear with PyG Linear's parameter names and initialisation (glorot where
    PyG asks for it, see reset_glorot; torch's kaiming-uniform otherwise, as PyG's)."""
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    if glorot:
        reset_glorot(lin)
    return lin


# ---- Tiga aggregations shared by the layers ---------------------------------------------------

class EdgeReduce(MessagePassing):
    """Per destination: reduce an edge field `v` (degrees, softmax maxima and sums)."""

    def __init__(self, reducer):
        super().__init__()
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return edge.v


class SourceReduce(MessagePassing):
    """Per destination: reduce the source rows `x` (SAGE, GIN, precomputed messages)."""

    def __init__(self, reducer):
        super().__init__()
        self.reducer = reducer

    def edge(self, src, dst, edge):
        return src.x


class WeightedSum(MessagePassing):
    """Per destination: sum over edges of w(edge) * h(source), w broadcasting against h."""

    def __init__(self):
        super().__init__()
        self.reducer = sum_r()

    def edge(self, src, dst, edge):
        return edge.w * src.h


# one instance per reducer: a call's compiled program is cached per (function, owner)
_EDGE_REDUCE = {name: EdgeReduce(make()) for name, make in REDUCERS.items()}
WEIGHTED_SUM = WeightedSum()


def edge_reduce(graph: Graph, values: torch.Tensor, aggr: str) -> torch.Tensor:
    """Per destination: the `aggr` reduction (a REDUCERS name) of the edge field `values`."""
    return _EDGE_REDUCE[aggr](graph=graph, edge={"v": values})


def source_reducer(aggr: str) -> SourceReduce:
    return _SOURCE_REDUCE[aggr]


class ScaledSum(MessagePassing):
    """Per destination: sum over edges of x(source) * s(destination)."""

    def __init__(self):
        super().__init__()
        self.reducer = sum_r()

    def edge(self, src, dst, edge):
        return src.x * dst.s


_SCALED_SUM = ScaledSum()


def mean_of_sources(graph: Graph, x: torch.Tensor) -> torch.Tensor:
    """mean_j x_j per destination (0 without edges), as sum_j x_j * (1 / max(deg, 1)).

    The mean reducer's VJP divides the cotangent by the degrees outside the kernel (two
    (N, F) host passes, about 0.4 s of an ogbn-arxiv-size SAGE step); with the inverse
    degree as a destination field the VJP is one propagate reading it per edge. Results
    differ from sum / degree by rounding (a few ulp). Stored CSR relations of float32/64
    host rows only; anything else runs the mean reducer."""
    if (x.dtype not in (torch.float32, torch.float64) or x.device.type != "cpu"
            or getattr(graph, "kind", None) not in ("csr", "cat")
            or getattr(graph, "tiga_distributed", False) is True):
        return _SOURCE_REDUCE["mean"](graph=graph, src={"x": x})
    scale = inverse_degrees(graph, x.dtype).view((-1,) + (1,) * (x.dim() - 1))
    return _SCALED_SUM(graph=graph, src={"x": x}, dst={"s": scale})


def inverse_degrees(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """1 / max(in-degree, 1) per destination, memoised per relation and dtype."""
    kept = memo(graph)
    key = ("inverse_degrees", dtype)
    found = kept.get(key)
    if found is None:
        deg = np.maximum(graph.degrees(by="dst"), 1)
        found = kept[key] = torch.from_numpy(1.0 / deg).to(dtype)
    return found


_SOURCE_REDUCE = {name: SourceReduce(make()) for name, make in REDUCERS.items()}
