"""tg.nn.NeighborLoader: mini-batches of a large graph by neighbour sampling (API.md section 12).

Each batch starts from `batch_size` seed nodes and, hop by hop, samples at most
`num_neighbors[h]` incoming edges of every node the previous hop added (the relation is
destination-oriented CSR: a row lists the sources whose messages reach that node, so the
sampled subgraph carries exactly the messages the seeds' outputs need). As PyG's
NeighborLoader gives it, a batch has the seeds first in its node order (`n_id`), the global
ids of its sampled edges (`e_id`), `batch_size`, the nodes and edges each hop added
(`num_sampled_nodes`, `num_sampled_edges`), `edge_index` in local ids (row 0 source,
row 1 target: what tg.nn layers take) and the node and edge fields sliced to it.

Sampling is vectorised per hop over the CSR (numpy, no Python loop per node): a row whose
degree is at most its fan-out gives all its edges; the others draw one random key per
candidate edge and keep the fan-out smallest keys of each row (one sort of (row, key) pairs),
which is uniform sampling without replacement. Random numbers depend only on the degrees
of the rows sampled, so a paged store (tg.Graph of kind "paged") and the same graph in
memory give the same batches under the same seed. A paged graph is never read whole: each
hop reads the row_ptr entries of its frontier and the col_idx entries of the edges it
sampled, through the store's chunked row reads (each touched chunk once).

The sampling functions are plain numpy; only the batches hold torch tensors.
"""
from __future__ import annotations

import math
import operator
import threading

import numpy as np
import torch

from ...core.errors import StorageError
from ...core.graph import Graph
from .common import LayerArgumentError

KEY_BITS = 32                      # random key bits per candidate edge (rows in the high bits)
_SEED_BOUND = 2 ** 62
# PyG's loader hands these to torch's DataLoader; sampling here runs in the calling process,
# so they are accepted and have no effect
DATALOADER_KWARGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                     "worker_init_fn", "timeout")


# ---- rows of the relation ------------------------------------------------------------------

class MemoryRows:
    """Rows of an in-memory relation: its CSR, and the user edge ids of CSR positions."""

    def __init__(self, graph: Graph):
        graph.ensure_valid()
        row_ptr, col_idx = graph.resolve_csr()
        self.row_ptr = np.asarray(row_ptr, dtype=np.int64)
        self.col_idx = np.asarray(col_idx)
        self.edge_perm = None if graph.edge_perm is None else np.asarray(graph.edge_perm)
        self.num_nodes, self.num_edges = graph.num_dst, len(self.col_idx)

    def rows(self, nodes: np.ndarray) -> tuple:
        """(first edge, degree) of each node's row (int64)."""
        start = self.row_ptr[nodes]
        return start, self.row_ptr[nodes + 1] - start

    def cols(self, positions: np.ndarray) -> np.ndarray:
        """The source node of the edges at CSR `positions` (int64)."""
        return self.col_idx[positions].astype(np.int64, copy=False)

    def edge_ids(self, positions: np.ndarray) -> np.ndarray:
        """The user's edge ids of CSR `positions` (the edge_index column, for a graph built
        from one; the CSR position itself otherwise)."""
        if self.edge_perm is None:
            return positions
        return self.edge_perm[positions].astype(np.int64, copy=False)


class PagedRows:
    """Rows of a paged store (tg.Graph of kind "paged"), read as sampling needs them: the
    row_ptr entries of a hop's frontier and the col_idx entries of its sampled edges, each
    through the stored array's take_rows (each touched chunk read once, never the whole
    array). Counts what it read (`entries_read`), so a test can tell it stayed partial."""

    def __init__(self, graph: Graph):
        self.reader = graph.params["reader"]
        self.num_nodes, self.num_edges = graph.num_dst, int(graph.num_edges)
        self.num_src = graph.num_src
        self.edge_perm = None               # a store keeps its edges in CSR order
        self.entries_read = 0

    def _take(self, array, ids: np.ndarray) -> np.ndarray:
        """array[ids] for any int64 ids, reading each distinct one once."""
        if not len(ids):
            return np.empty(0, np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        self.entries_read += len(uniq)
        return np.asarray(array.take_rows(uniq)).astype(np.int64, copy=False)[inverse]

    def rows(self, nodes: np.ndarray) -> tuple:
        both = self._take(self.reader.row_ptr, np.concatenate([nodes, nodes + 1]))
        start, stop = both[:len(nodes)], both[len(nodes):]
        if np.any(stop < start) or (len(start) and (start.min() < 0
                                                   or stop.max() > self.num_edges)):
            raise StorageError(f"{self.reader.row_ptr.path}: row_ptr check failed (offsets "
                               f"of sampled rows not non-decreasing within "
                               f"[0, {self.num_edges}])")
        return start, stop - start

    def cols(self, positions: np.ndarray) -> np.ndarray:
        col = self._take(self.reader.col_idx, positions)
        if len(col) and (col.min() < 0 or col.max() >= self.num_src):
            raise StorageError(f"{self.reader.col_idx.path}: col_idx check failed (a "
                               f"sampled source outside [0, {self.num_src}))")
        return col

    def edge_ids(self, positions: np.ndarray) -> np.ndarray:
        return positions


def relation_rows(graph: Graph):
    """MemoryRows or PagedRows for `graph` (a square relation: nodes sample nodes)."""
    if graph.num_src != graph.num_dst:
        raise LayerArgumentError(
            f"NeighborLoader: the graph has {graph.num_src} sources and {graph.num_dst} "
            "destinations; neighbour sampling needs one node set (num_src == num_dst)")
    if graph.kind == "paged" and "reader" in (graph.params or {}):
        return PagedRows(graph)
    return MemoryRows(graph)


# ---- one hop -------------------------------------------------------------------------------

def _ranks(counts: np.ndarray) -> tuple:
    """(segment of each element, its rank within the segment) for segments of `counts`."""
    seg = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    return seg, np.arange(len(seg), dtype=np.int64) - first[seg]


def sample_rows(degree: np.ndarray, fanout: int, replace: bool,
                rng: np.random.Generator) -> tuple:
    """Sampled (row, offset in row) pairs of rows with these degrees, sorted by row then
    offset: every offset of a row whose degree is <= fanout (or fanout < 0); otherwise
    `fanout` distinct offsets drawn uniformly (replace=False), or `fanout` independent uniform
    draws (replace=True, rows of degree 0 give none). Vectorised: no loop over rows."""
    degree = np.asarray(degree, dtype=np.int64)
    if fanout < 0:
        return _ranks(degree)
    if replace:
        seg = np.repeat(np.arange(len(degree), dtype=np.int64),
                        np.where(degree > 0, fanout, 0))
        off = np.minimum((rng.random(len(seg)) * degree[seg]).astype(np.int64),
                         degree[seg] - 1)
        return _sorted_pairs(seg, off)
    small = degree <= fanout
    seg_a, off_a = _ranks(np.where(small, degree, 0))
    big = np.flatnonzero(~small)
    if not len(big):
        return seg_a, off_a
    # one random key per candidate edge of the rows over their fan-out; each row keeps the
    # edges of its `fanout` smallest keys (a uniform subset, since keys are i.i.d.)
    seg_b, _ = _ranks(degree[big])
    keys = rng.integers(0, 1 << KEY_BITS, size=len(seg_b), dtype=np.int64)
    order = np.argsort((seg_b << KEY_BITS) | keys)        # by row, then key
    first = np.cumsum(degree[big]) - degree[big]
    picked = order[(np.arange(len(order)) - first[seg_b]) < fanout]   # seg_b[order] == seg_b
    seg_b = seg_b[picked]
    off_b = picked - first[seg_b]
    return _sorted_pairs(np.concatenate([seg_a, big[seg_b]]), np.concatenate([off_a, off_b]))


def _sorted_pairs(seg: np.ndarray, off: np.ndarray) -> tuple:
    key = np.sort((seg << KEY_BITS) | off)
    return key >> KEY_BITS, key & ((1 << KEY_BITS) - 1)


class NodeMap:
    """Global node id -> local id of one batch, grown hop by hop (sorted arrays and
    searchsorted: no array of the graph's size)."""

    def __init__(self, seeds: np.ndarray):
        uniq, first = np.unique(seeds, return_index=True)     # a repeated seed: its first place
        self.ids, self.local = uniq, first.astype(np.int64)
        self.size = len(seeds)

    def add(self, nodes: np.ndarray) -> tuple:
        """(local id of each of `nodes`, the new ones in order of first appearance), giving
        the nodes not seen before the next local ids."""
        uniq, first, inverse = np.unique(nodes, return_index=True, return_inverse=True)
        at = np.minimum(np.searchsorted(self.ids, uniq), max(len(self.ids) - 1, 0))
        seen = (self.ids[at] == uniq) if len(self.ids) else np.zeros(len(uniq), bool)
        local = np.empty(len(uniq), np.int64)
        local[seen] = self.local[at[seen]]
        fresh = np.flatnonzero(~seen)
        fresh = fresh[np.argsort(first[fresh], kind="stable")]
        local[fresh] = self.size + np.arange(len(fresh), dtype=np.int64)
        self.size += len(fresh)
        ids = np.concatenate([self.ids, uniq[fresh]])
        loc = np.concatenate([self.local, local[fresh]])
        order = np.argsort(ids, kind="stable")
        self.ids, self.local = ids[order], loc[order]
        return local[inverse.reshape(-1)], uniq[fresh]


class DenseNodeMap:
    """NodeMap over a reused array of the graph's size (-1: not in the batch): no sorting,
    each hop a few gathers and scatters. `release()` clears the entries the batch set, so
    the next batch finds the array all -1 again."""

    def __init__(self, table: np.ndarray, seeds: np.ndarray):
        self.table, self.size = table, len(seeds)
        table[seeds[::-1]] = np.arange(len(seeds) - 1, -1, -1)   # a repeated seed: its first
        self.touched = [seeds]

    def add(self, nodes: np.ndarray) -> tuple:
        table = self.table
        fresh = nodes[table[nodes] < 0]
        # each fresh node's first place among `fresh`: written last-to-first, the first write
        # of a repeated index is the one that stays (values below -1 stay apart from -1)
        place = np.arange(len(fresh), dtype=np.int64)
        table[fresh[::-1]] = -2 - place[::-1]
        new = fresh[table[fresh] == -2 - place]
        table[new] = self.size + np.arange(len(new), dtype=np.int64)
        self.size += len(new)
        self.touched.append(new)
        return table[nodes].astype(np.int64, copy=False), new

    def release(self) -> None:
        for ids in self.touched:
            self.table[ids] = -1
        self.touched = []


DENSE_MAP_NODES = 1 << 26     # graphs up to this many nodes use DenseNodeMap (256 MiB at most)


def sample_subgraph(rows, seeds: np.ndarray, num_neighbors, replace: bool,
                    rng: np.random.Generator, table: np.ndarray | None = None) -> dict:
    """One batch's sample (numpy): n_id (seeds first, then each hop's new nodes), the local
    edge_index, e_id, and the per-hop counts. `table`: an int32 array of the graph's size
    holding -1 everywhere (DenseNodeMap's; left as it was found), else the sorted NodeMap."""
    seeds = np.asarray(seeds, dtype=np.int64)
    nodes = NodeMap(seeds) if table is None else DenseNodeMap(table, seeds)
    try:
        return _grow(rows, seeds, nodes, num_neighbors, replace, rng)
    finally:
        if table is not None:
            nodes.release()


def _grow(rows, seeds, nodes, num_neighbors, replace, rng) -> dict:
    n_id, src, dst, e_id = [seeds], [], [], []
    counts_n, counts_e = [len(seeds)], []
    frontier, lo = seeds, 0
    for fanout in num_neighbors:
        start, degree = rows.rows(frontier)
        seg, off = sample_rows(degree, fanout, replace, rng)
        positions = start[seg] + off
        local, new = nodes.add(rows.cols(positions))
        src.append(local)
        dst.append(lo + seg)
        e_id.append(rows.edge_ids(positions))
        n_id.append(new)
        counts_n.append(len(new))
        counts_e.append(len(positions))
        lo = nodes.size - len(new)
        frontier = new
    return {"n_id": np.concatenate(n_id),
            "edge_index": np.stack([np.concatenate(src or [np.empty(0, np.int64)]),
                                    np.concatenate(dst or [np.empty(0, np.int64)])]),
            "e_id": np.concatenate(e_id or [np.empty(0, np.int64)]),
            "num_sampled_nodes": counts_n, "num_sampled_edges": counts_e}


# ---- fields --------------------------------------------------------------------------------

def _take_field(value, index: np.ndarray):
    """value[index] for a torch tensor, a numpy array or a tg.Tensor (a disk tensor reads
    only the chunks holding those rows); torch tensors come back as torch tensors, the others
    as torch tensors made from the rows read."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and not value.requires_grad:
            try:        # numpy's row gather is several times faster than index_select's
                return torch.from_numpy(np.take(value.numpy(), index, axis=0))
            except (TypeError, RuntimeError):       # bfloat16 and others numpy lacks
                pass
        return value.index_select(0, torch.from_numpy(index).to(value.device))
    storage = getattr(value, "_storage", None)
    if getattr(value, "tier", None) == "disk" and hasattr(storage, "take_rows"):
        uniq, inverse = np.unique(index, return_inverse=True)
        return torch.from_numpy(np.ascontiguousarray(np.asarray(storage.take_rows(uniq))
                                                     [inverse]))
    if hasattr(value, "tier") and hasattr(value, "numpy"):
        value = value.numpy()
    return torch.from_numpy(np.ascontiguousarray(np.asarray(value)[index]))


def _rows_of(value) -> int | None:
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def _is_edge_name(name: str) -> bool:
    return "edge" in name


def _pyg_fields(data, num_nodes: int, num_edges: int) -> tuple:
    """(node fields, edge fields, other attributes) of a PyG Data object."""
    node, edge, other = {}, {}, {}
    for key, value in data.items() if hasattr(data, "items") else vars(data).items():
        if key in ("edge_index", "adj_t", "num_nodes"):
            continue
        rows = _rows_of(value)
        is_node = getattr(data, "is_node_attr", None)
        is_edge = getattr(data, "is_edge_attr", None)
        if rows is not None and is_edge is not None and is_edge(key) and rows == num_edges:
            edge[key] = value
        elif rows is not None and is_node is not None and is_node(key) and rows == num_nodes:
            node[key] = value
        elif rows is not None and is_node is None and rows in (num_nodes, num_edges):
            (edge if _is_edge_name(key) and rows == num_edges else node)[key] = value
        else:
            other[key] = value
    return node, edge, other


def _store_fields(graph: Graph) -> tuple:
    """(node fields, edge fields) kept in a paged graph's store, as disk tensors."""
    reader = (graph.params or {}).get("reader")
    fields = getattr(reader, "fields", None) or {}
    node, edge = {}, {}
    for name, meta in fields.items():
        role = meta.get("role")
        if role in ("src", "dst"):
            node[name] = reader[name]
        elif role == "edge":
            edge[name] = reader[name]
    return node, edge


# ---- the batch -----------------------------------------------------------------------------

class SampledSubgraph:
    """One mini-batch of NeighborLoader (attributes as PyG's batch Data has them): n_id,
    e_id, edge_index (local ids), batch_size, num_sampled_nodes, num_sampled_edges,
    input_id, and every node field (x, y, ...) sliced by n_id and edge field by e_id.
    `graph` is the batch's relation as a tg.Graph; the first batch_size nodes are the seeds."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())

    @property
    def num_edges(self) -> int:
        return int(self.e_id.numel())

    @property
    def graph(self) -> Graph:
        """The sampled relation as a tg.Graph over the batch's nodes (edge ids follow
        edge_index's columns, as Graph.from_edge_index keeps them)."""
        if "_graph" not in self.__dict__:
            self.__dict__["_graph"] = Graph.from_edge_index(self.edge_index,
                                                            num_nodes=self.num_nodes)
        return self.__dict__["_graph"]

    def keys(self) -> list:
        return [k for k in self.__dict__ if not k.startswith("_")]

    def __getitem__(self, key: str):
        return self.__dict__[key]

    def __contains__(self, key: str) -> bool:
        return key in self.keys()

    def to(self, device, non_blocking: bool = False) -> SampledSubgraph:
        """A copy whose tensors are on `device`."""
        return SampledSubgraph(**{
            k: (v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v)
            for k, v in self.__dict__.items() if not k.startswith("_")})

    def __repr__(self) -> str:
        parts = []
        for k in self.keys():
            v = self.__dict__[k]
            parts.append(f"{k}={list(v.shape)}" if isinstance(v, torch.Tensor) else f"{k}={v}")
        return f"SampledSubgraph({', '.join(parts)})"


# ---- the loader ----------------------------------------------------------------------------

def _check_fanouts(num_neighbors) -> list:
    if isinstance(num_neighbors, dict):
        raise LayerArgumentError("NeighborLoader: num_neighbors as a dict is for "
                                 "heterogeneous graphs, which tg.nn.NeighborLoader does not "
                                 "sample; pass a list of ints, one per hop")
    try:
        fanouts = [operator.index(k) for k in num_neighbors]
    except TypeError as exc:
        raise LayerArgumentError(f"NeighborLoader: num_neighbors is {num_neighbors!r}, "
                                 "expected a list of ints (one per hop, -1: all)") from exc
    if not fanouts or any(k < -1 for k in fanouts):
        raise LayerArgumentError(f"NeighborLoader: num_neighbors is {num_neighbors!r}, "
                                 "expected a non-empty list of ints >= -1 (-1: all)")
    return fanouts


def _as_numpy_index(value, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "tier") and hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value)


def _input_nodes(input_nodes, num_nodes: int) -> np.ndarray:
    if input_nodes is None:
        return np.arange(num_nodes, dtype=np.int64)
    if isinstance(input_nodes, tuple):
        raise LayerArgumentError("NeighborLoader: input_nodes as (node_type, nodes) is for "
                                 "heterogeneous graphs; pass the node ids or a bool mask")
    nodes = _as_numpy_index(input_nodes, "input_nodes")
    if nodes.dtype == np.bool_:
        if nodes.shape != (num_nodes,):
            raise LayerArgumentError(f"NeighborLoader: input_nodes is a mask of shape "
                                     f"{nodes.shape}, expected ({num_nodes},)")
        return np.flatnonzero(nodes).astype(np.int64)
    if nodes.ndim != 1 or (nodes.size and not np.issubdtype(nodes.dtype, np.integer)):
        raise LayerArgumentError(f"NeighborLoader: input_nodes has shape {nodes.shape} and "
                                 f"dtype {nodes.dtype}, expected 1-D node ids or a bool mask")
    nodes = nodes.astype(np.int64)
    if nodes.size and (nodes.min() < 0 or nodes.max() >= num_nodes):
        raise LayerArgumentError(f"NeighborLoader: input_nodes holds ids outside "
                                 f"[0, {num_nodes})")
    return nodes


class NeighborLoader:
    """Mini-batches of neighbour-sampled subgraphs, as PyG's NeighborLoader gives them.

    `graph`: a tg.Graph (in memory, or of kind "paged": read from its store as sampling
    needs it, never whole), a PyG `Data` object (its node and edge fields are sliced into
    each batch), or a store from tg.store.open. Node fields of a tg.Graph are passed as
    keywords (`x=`, `y=`, any name; a name containing "edge" is an edge field, sliced by
    e_id): torch tensors, numpy arrays or tg.Tensors (a disk tensor reads only the rows a
    batch needs). A paged graph's store fields come along by their role (not with
    `store_fields=False`).

    `num_neighbors[h]`: edges sampled per node at hop h (-1: all). `input_nodes`: the seed
    nodes (ids or a bool mask; None: every node), split into batches of `batch_size`
    (shuffled per epoch when `shuffle`; the last one smaller unless `drop_last`).
    `replace`: sample with replacement. Randomness: `seed` (epoch e of a loader draws from
    (seed, e): two loaders with one seed give the same epochs, and each epoch differs from
    the previous), else `generator` (torch.Generator or numpy Generator) or, with neither,
    torch's global generator (so torch.manual_seed makes it reproducible, as in PyG).
    """

    def __init__(self, graph, num_neighbors, batch_size: int = 1, shuffle: bool = False,
                 input_nodes=None, replace: bool = False, seed: int | None = None,
                 generator=None, drop_last: bool = False, store_fields: bool = True,
                 **fields):
        self.num_neighbors = _check_fanouts(num_neighbors)
        if isinstance(batch_size, bool) or operator.index(batch_size) < 1:
            raise LayerArgumentError(f"NeighborLoader: batch_size is {batch_size!r}, "
                                     "expected an int >= 1")
        self.batch_size = operator.index(batch_size)
        self.shuffle, self.replace, self.drop_last = bool(shuffle), bool(replace), drop_last
        if seed is not None:
            seed = operator.index(seed)
        self.seed, self.generator, self.epoch = seed, generator, 0
        self._pyg = None
        node, edge, self._other = {}, {}, {}
        if hasattr(graph, "read_rows") and hasattr(graph, "graph"):     # tg.store.open(...)
            graph = graph.graph()
        if not isinstance(graph, Graph):
            if not hasattr(graph, "edge_index"):
                raise LayerArgumentError(f"NeighborLoader: graph is a {type(graph).__name__},"
                                         " expected a tg.Graph, a PyG Data object or a store")
            self._pyg = graph
            num_nodes = graph.num_nodes
            graph = Graph.from_edge_index(graph.edge_index, num_nodes=num_nodes)
            node, edge, self._other = _pyg_fields(self._pyg, graph.num_dst,
                                                  int(graph.num_edges))
        elif graph.kind == "paged" and store_fields:
            node, edge = _store_fields(graph)
        self.graph = graph
        self.rows = relation_rows(graph)
        for name, value in fields.items():
            if value is None or name in DATALOADER_KWARGS:
                continue
            rows = _rows_of(value)
            want = self.rows.num_edges if _is_edge_name(name) else self.rows.num_nodes
            if rows != want:
                raise LayerArgumentError(
                    f"NeighborLoader: field {name}= has {rows} rows, expected {want} (one per "
                    f"{'edge' if _is_edge_name(name) else 'node'}; a name containing 'edge' is "
                    "an edge field)")
            (edge if _is_edge_name(name) else node)[name] = value
        self.node_fields, self.edge_fields = node, edge
        self.input_nodes = _input_nodes(input_nodes, self.rows.num_nodes)
        self._table, self._table_lock = None, threading.Lock()

    def __len__(self) -> int:
        n = len(self.input_nodes)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _epoch_entropy(self) -> list:
        if self.seed is not None:
            entropy = [self.seed, self.epoch]
        elif isinstance(self.generator, np.random.Generator):
            entropy = [int(self.generator.integers(_SEED_BOUND))]
        else:               # a torch.Generator, or torch's global one (torch.manual_seed)
            entropy = [int(torch.randint(_SEED_BOUND, (), generator=self.generator))]
        self.epoch += 1
        return entropy

    def __iter__(self):
        entropy = self._epoch_entropy()
        order = np.arange(len(self.input_nodes), dtype=np.int64)
        if self.shuffle:
            order = np.random.default_rng(entropy + [0]).permutation(len(order))
        for b in range(len(self)):
            input_id = order[b * self.batch_size:(b + 1) * self.batch_size]
            rng = np.random.default_rng(entropy + [b + 1])
            yield self._batch(input_id, rng)

    def sample(self, seeds, rng: np.random.Generator | int | None = None):
        """One batch grown from the node ids `seeds` (input_id: None), e.g. for inference;
        `rng`: a numpy Generator or a seed (None: fresh entropy)."""
        seeds = _input_nodes(seeds, self.rows.num_nodes)
        return self._batch(None, np.random.default_rng(rng), seeds)

    def _batch(self, input_id, rng: np.random.Generator, seeds=None):
        if seeds is None:
            seeds = self.input_nodes[input_id]
        table = None
        if self.rows.num_nodes <= DENSE_MAP_NODES and self._table_lock.acquire(blocking=False):
            if self._table is None:        # (another thread sampling meanwhile: the sorted map)
                self._table = np.full(self.rows.num_nodes, -1, np.int32)
            table = self._table
        try:
            out = sample_subgraph(self.rows, seeds, self.num_neighbors, self.replace, rng,
                                  table)
        finally:
            if table is not None:
                self._table_lock.release()
        n_id, e_id = out["n_id"], out["e_id"]
        attrs = {name: _take_field(v, n_id) for name, v in self.node_fields.items()}
        attrs.update({name: _take_field(v, e_id) for name, v in self.edge_fields.items()})
        attrs.update(self._other)
        attrs.update(
            edge_index=torch.from_numpy(out["edge_index"]), n_id=torch.from_numpy(n_id),
            e_id=torch.from_numpy(e_id), batch_size=len(seeds),
            num_sampled_nodes=out["num_sampled_nodes"],
            num_sampled_edges=out["num_sampled_edges"],
            input_id=None if input_id is None else torch.from_numpy(input_id))
        if self._pyg is not None:        # a PyG batch for a PyG graph, as PyG's loader gives
            data = type(self._pyg)()
            for key, value in attrs.items():
                if value is not None:
                    data[key] = value
            data.num_nodes = len(n_id)
            return data
        return SampledSubgraph(**attrs)

    def __repr__(self) -> str:
        return (f"NeighborLoader(num_nodes={self.rows.num_nodes}, "
                f"num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, batches={len(self)})")
