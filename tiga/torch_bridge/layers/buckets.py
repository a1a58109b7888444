"""torch_bridge: batches of small graphs run at bucketed sizes (issue 40).

Every batch of a shuffled epoch has its own node and edge counts, and a call staged, lowered
and planned for one set of counts serves only those (about 8 ms of host work per batch of
128 molecules, against a 7 ms training step). A batch relation (tg.Graph.batch) therefore
runs padded to bucketed counts: one padding source row, one padding destination row, and
padding edges from the one to the other, up to sizes rounded to 16 steps per octave (at most
1/16 more rows or edges). A shuffled epoch then meets a handful of sizes, each prepared once.

The padding changes no real row: the real destination rows keep their edges, in their order,
and are followed by the padding rows; the padding edges read only the padding source rows
(zeros) and write only the padding destination rows, which are sliced off. So the real
rows' results, and their gradients, are the unpadded call's, bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from ...core.graph import Graph
from ...core.graph_batch import GraphBatch
from ...xla_free_runtime.caches.relations import memo

STEPS_PER_OCTAVE_BITS = 4    # 16 bucket sizes per power of two


def bucket(n: int) -> int:
    """The smallest bucket size >= n (16 per octave; exact below 16)."""
    step = 1 << max(int(n).bit_length() - 1 - STEPS_PER_OCTAVE_BITS, 0)
    return -(-int(n) // step) * step


def padded_relation(graph: Graph) -> tuple:
    """(relation, padded source count, destination count) of a CSR relation at bucketed
    counts (see the module docstring), memoised per relation."""
    kept = memo(graph)
    found = kept.get("bucketed")
    if found is None:
        found = kept["bucketed"] = (_padded(graph), graph.num_dst)
    rel, n_dst = found
    return rel, rel.num_src, n_dst


def _padded(graph: Graph) -> Graph:
    """`graph` with the padding rows and edges, the padding edges after the real ones in the
    user's edge order: the real edges keep their order in both walks (by destination, and
    by source through the transpose), so sums over them add in the same order."""
    src, dst = np.asarray(graph.to_edge_index())
    n_src, n_dst, n_edges = graph.num_src, graph.num_dst, len(src)
    src_pad, dst_pad, edges_pad = bucket(n_src + 1), bucket(n_dst + 1), bucket(n_edges)
    extra = edges_pad - n_edges
    return Graph.from_coo(np.concatenate([src, np.full(extra, n_src, src.dtype)]),
                          np.concatenate([dst, np.full(extra, n_dst, dst.dtype)]),
                          num_src=src_pad, num_dst=dst_pad)


def bucketed(graph) -> bool:
    """Whether calls over `graph` run padded: a stored batch of small graphs."""
    return isinstance(graph, GraphBatch) and graph.kind in ("csr", "cat")


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x (S, ...) followed by zero rows up to `rows` (differentiable: a cat)."""
    if x.size(0) == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.size(0),) + tuple(x.shape[1:]))])


def run_bucketed(graph, x_src: torch.Tensor, run, pad: bool | None = None):
    """run(relation, x_src) over `graph` (x_src nodes first), at bucketed counts where `pad`
    (None: `bucketed(graph)`): its rows of the real destinations."""
    if not (bucketed(graph) if pad is None else pad):
        return run(graph, x_src)
    rel, src_rows, n_dst = padded_relation(graph)
    return run(rel, pad_rows(x_src, src_rows))[:n_dst]


__all__ = ["bucket", "bucketed", "pad_rows", "padded_relation", "run_bucketed"]
