"""torch_bridge: tg.nn.global_add_pool, global_mean_pool, global_max_pool and
global_softmax_pool: per-graph readouts of a batch of small graphs (API.md section 12), each
one Tiga segment reduction (a propagate over the relation node -> its graph), forward and
backward compiled.

`batch` is what PyG's take (a graph id per node, a torch tensor or numpy array; None: one
graph), or a tg.GraphBatch (tg.Graph.batch) or a PyG Batch, whose `batch` is read. The
node -> graph relation is built once per batch object (memoised by identity and version).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import numpy as np
import torch

from ...core.graph import Graph
from ...core.graph_batch import GraphBatch
from .aggr import MaxAggregation, MeanAggregation, SoftmaxAggregation, SumAggregation
from .buckets import run_bucketed
from .common import LayerArgumentError, snapshot, unchanged
from .summed import summed


def _vector(batch):
    """The graph-id vector of `batch` (a tensor or array), or batch's ptr for a GraphBatch."""
    if isinstance(batch, GraphBatch):
        return None, batch.ptr
    if not isinstance(batch, (torch.Tensor, np.ndarray)) and hasattr(batch, "batch"):
        batch = batch.batch      # a PyG Batch
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if not isinstance(batch, torch.Tensor) or batch.dim() != 1 or batch.is_floating_point():
        found = tuple(batch.shape) if isinstance(batch, torch.Tensor) else type(batch).__name__
        raise LayerArgumentError(f"global pooling: batch is {found}, expected a 1-D integer "
                                 "tensor (a graph id per node), a tg.GraphBatch or a PyG "
                                 "Batch")
    return batch, None


@torch.compiler.disable(reason="tg.nn pooling builds its node -> graph relation eagerly")
def pool_relation(batch, num_nodes: int, size: int | None) -> Graph:
    """The relation node -> graph of `batch` (num_nodes sources, size graphs: by default
    the largest id + 1, or a GraphBatch's graph count), memoised per batch object."""
    vector, ptr = _vector(batch)
    owner = batch if ptr is not None else vector
    key = (id(owner), getattr(owner, "_version", 0), num_nodes, size)
    found = _MEMO.get(key)
    if found is not None and found[0]() is owner and (
            vector is None or unchanged(vector, found[2])):
        _MEMO.move_to_end(key)
        return found[1]
    if ptr is None:
        ids = vector.detach().cpu().numpy().astype(np.int64, copy=False)
        if len(ids) != num_nodes:
            raise LayerArgumentError(f"global pooling: batch has {len(ids)} entries, but x "
                                     f"has {num_nodes} nodes")
        groups = size if size is not None else (int(ids.max()) + 1 if len(ids) else 0)
        graph = Graph.from_coo(np.arange(num_nodes), ids, num_src=num_nodes, num_dst=groups)
    else:
        if int(ptr[-1]) != num_nodes:
            raise LayerArgumentError(f"global pooling: the batch has {int(ptr[-1])} nodes, "
                                     f"but x has {num_nodes}")
        rows = ptr if size is None or size == len(ptr) - 1 else np.concatenate(
            [ptr, np.full(max(size - len(ptr) + 1, 0), ptr[-1])])[:size + 1]
        graph = Graph.from_csr(rows, np.arange(num_nodes), num_src=num_nodes)
    _MEMO[key] = (weakref.ref(owner, lambda _ref: _MEMO.pop(key, None)), graph,
                  None if vector is None else snapshot(vector))
    if len(_MEMO) > 32:
        _MEMO.popitem(last=False)
    return graph


_MEMO: OrderedDict = OrderedDict()


def _pool(aggr, x, batch, size, whole):
    """aggr over each graph's nodes (x's node axis: -2, or 0 for a 1-D x)."""
    if batch is None:
        return whole(x, -1 if x.dim() == 1 else -2)
    flat = x.dim() == 1
    nodes = x.unsqueeze(-1) if flat else x.movedim(-2, 0)
    graph = pool_relation(batch, nodes.size(0), size)
    pad = isinstance(batch, GraphBatch)
    fused = aggr is _SUM and not flat and not torch.compiler.is_compiling()
    out = summed(graph, nodes, pad=pad) if fused else None
    if out is not None:     # (padding, sum and slice as one node: summed.py)
        return out.movedim(0, -2)
    # (a tg.Graph.batch's readout runs at bucketed sizes, as its layers do: buckets.py)
    out = run_bucketed(graph, nodes, aggr.over, pad=pad)
    return out.squeeze(-1) if flat else out.movedim(0, -2)


_SUM, _MEAN, _MAX = SumAggregation(), MeanAggregation(), MaxAggregation()


def global_add_pool(x, batch=None, size: int | None = None):
    """PyG's global_add_pool: per graph, the sum of its nodes' rows (x (N, F) -> (B, F));
    batch None: all nodes one graph (keepdim)."""
    return _pool(_SUM, x, batch, size, lambda t, d: t.sum(dim=d, keepdim=True))


def global_mean_pool(x, batch=None, size: int | None = None):
    """PyG's global_mean_pool: per graph, the mean of its nodes' rows (0 for a graph without
    nodes)."""
    return _pool(_MEAN, x, batch, size, lambda t, d: t.mean(dim=d, keepdim=True))


def global_max_pool(x, batch=None, size: int | None = None):
    """PyG's global_max_pool: per graph, the feature-wise maximum of its nodes' rows (0 for
    a graph without nodes)."""
    return _pool(_MAX, x, batch, size, lambda t, d: t.max(dim=d, keepdim=True)[0])


def global_softmax_pool(x, batch=None, size: int | None = None, t: float = 1.0):
    """Per graph and feature, sum_i softmax_i(t x_i) x_i over the graph's nodes (PyG's
    SoftmaxAggregation as a readout): one online-softmax propagate."""
    def whole(v, d):
        return (torch.softmax(t * v, dim=d) * v).sum(dim=d, keepdim=True)
    return _pool(SoftmaxAggregation(t=t), x, batch, size, whole)


__all__ = ["global_add_pool", "global_max_pool", "global_mean_pool", "global_softmax_pool",
           "pool_relation"]
