"""runtime/distributed: DistributedGraph, one rank's share of a relation, and partition().

Every rank calls `partition` with the same graph; each keeps its halo plan (built once) and
three local relations over the renumbered CSR (halo.py): `full` (owned rows over owned +
ghost sources), `interior` (rows that read no ghost, over owned sources only) and
`boundary` (the rest). A program traced on a DistributedGraph sees a plain CSR relation
with num_src == num_dst == the owned rows: fields are local, the exchange is the runtime's.
A store-backed partition made under a host budget too small for the rank's local CSR keeps
it in a rank-private store instead, and the three relations are paged (paged.py).
"""
from __future__ import annotations

import copy
import hashlib

import numpy as np

from ...core.errors import DistributedError, GraphValidationError, ShapeError, UnsupportedError
from ...core.graph import Graph
from ...core.types import Dim, GraphType
from ..memory import scope as sc
from .comm import Comm, init, mpi
from .exchange import aligned_empty, reverse_add
from .generated import check_radius, checked_positions, generated_params, radius_plan
from .halo import HaloPlan, build_plan
from .paged import LocalStore, paged_store_plan, should_page
from .partition import owners
from .stored import check_store_method, read_tensor_rows, store_ownership, store_plan

INTERIOR_CHUNK_EDGES = 1 << 16   # interior edges per launch between MPI progress tests


class DistributedGraph:
    """This rank's rows of a relation partitioned over the ranks of `comm`."""

    tiga_distributed = True     # the runtime's dispatch mark (executor.execute)

    def __init__(self, comm: Comm, plan: HaloPlan, global_type: GraphType, method: str,
                 owner: np.ndarray, local_store: LocalStore | None = None):
        self.comm, self.plan, self.method = comm, plan, method
        self.local_store = local_store      # the paged local CSR's store, else None
        self.global_type = global_type
        self.owner = owner
        self.kind = "csr"           # "radius" over a partitioned radius relation
        self.params: dict = {}       # a radius relation's: its owned coordinates (generated.py)
        self.num_src = self.num_dst = plan.n_owned
        self.num_edges = plan.num_edges
        self.index_dtype = global_type.index_dtype
        self.edge_perm = None
        self.overlap = True          # False: communicate, then compute (benchmarks compare)
        self.broken: str | None = None
        self._agreed: set = set()
        self._all_owned = None
        self.full = self._local(0, plan.n_owned, plan.n_owned + plan.n_ghost)
        self.interior = self._local(0, plan.n_interior, plan.n_owned)
        self.boundary = self._local(plan.n_interior, plan.n_owned,
                                    plan.n_owned + plan.n_ghost)
        self.compact = self._compact_boundary()
        self.interior_chunks = self._chunks()

    # ---- what the tracer and the call checks see -------------------------------------------

    def type(self, symbolic: bool = False) -> GraphType:
        """The relation type programs see on this rank: its owned rows, both ways."""
        if symbolic:
            n = Dim("N")
            return GraphType("csr", n, n, Dim("E"), self.index_dtype, None)
        return GraphType("csr", self.num_src, self.num_dst, self.num_edges, self.index_dtype,
                         None)

    def resolve_csr(self):
        """Always a tg.UnsupportedError: the sources live on several ranks."""
        raise UnsupportedError(
            "a DistributedGraph has no single CSR: its sources live on several ranks",
            hint="call the program with graph=dg (the runtime exchanges the halo), or use "
                 "dg.full, the local relation over owned + ghost source rows")

    def ensure_valid(self) -> DistributedGraph:
        """The partition was validated when it was built: returns itself."""
        return self

    def degrees(self, by: str = "dst") -> np.ndarray:
        """int64 in-degree of each owned row (by='dst') or out-degree of each owned source
        over the whole relation (by='src': ghost counts are added at their owners)."""
        if by == "dst":
            return np.diff(self.plan.row_ptr)
        if by != "src":
            raise GraphValidationError(f"by: is {by!r}, expected 'dst' or 'src'")
        n = self.plan.n_owned + self.plan.n_ghost
        if self.local_store is not None:        # counted while the store was written
            local = self.local_store.src_degrees.copy()
        else:
            local = np.bincount(np.asarray(self.plan.col_idx, np.int64), minlength=n)
        return reverse_add(self, local.astype(np.int64), "the reverse exchange of degrees")

    @property
    def paged(self) -> bool:
        """Whether this rank's local relations are paged (read from its own store)."""
        return self.local_store is not None

    def __repr__(self) -> str:
        p = self.plan
        return (f"DistributedGraph(rank={self.comm.rank}/{self.comm.size}, method="
                f"{self.method!r}, owned={p.n_owned} ({p.n_interior} interior), ghosts="
                f"{p.n_ghost}, edges={self.num_edges}, peers={p.peers()})")

    # ---- coordinates of a partitioned radius relation --------------------------------------

    @property
    def positions(self):
        """This rank's owned coordinates in local row order (a radius relation), else None."""
        return self.params.get("inputs", (None,))[0]

    def at(self, positions) -> DistributedGraph:
        """The same partition and topology read with other owned coordinates (local row
        order): a torch tensor that requires grad or a traced value gets the gradients of
        `edge.displacement` / `edge.distance`. The topology stays the one selected at
        partition (selection is not differentiated): partition again once points move."""
        if self.kind != "radius":
            raise UnsupportedError("at: only a partitioned radius relation has coordinates",
                                   hint="partition tg.Graph.radius(...) with "
                                        "method='spatial'")
        other = copy.copy(self)
        other.params = dict(self.params, inputs=(checked_positions(self, positions), None))
        return other

    # ---- fields ------------------------------------------------------------------------------

    @property
    def owned(self) -> np.ndarray:
        """Global destination ids this rank owns, in local row order (interior first)."""
        return self.plan.owned

    def local(self, x_global):
        """This rank's rows of a global source/destination field."""
        want = self.global_type.num_dst
        shape = tuple(getattr(x_global, "shape", np.shape(x_global)))
        if not shape or shape[0] != want:
            raise ShapeError(f"x_global: expected a leading axis of {want} (the global "
                             f"rows), found shape {shape}")
        if not isinstance(x_global, np.ndarray) and hasattr(x_global, "tier"):
            # a tg.Tensor (a store's field on disk): read only the owned rows
            return read_tensor_rows(x_global, self.plan.owned)
        x = np.asarray(x_global)
        # on a cache line: the kernels read it in place, and a destination-grouped call
        # gathers only the rows the boundary reads (HaloExchange's compact buffers)
        out = aligned_empty((len(self.plan.owned),) + x.shape[1:], x.dtype)
        np.take(x, self.plan.owned, axis=0, out=out)
        return out

    def local_edges(self, w_global):
        """This rank's edges of a global edge field, in local edge order."""
        w = np.asarray(w_global)
        want = self.global_type.num_edges
        if w.ndim == 0 or w.shape[0] != want:
            raise ShapeError(f"w_global: expected a leading axis of {want} (the global "
                             f"edges), found shape {w.shape}")
        ls = self.local_store
        if ls is None:
            return w[self.plan.edge_ids]
        out = np.empty((self.num_edges,) + w.shape[1:], w.dtype)
        step = max(1, sc.page_rows())
        for a in range(0, self.num_edges, step):      # the edge ids a page at a time
            b = min(a + step, self.num_edges)
            out[a:b] = w[ls.edge_ids(a, b)]
        return out

    def gather(self, y_local, root: int | None = None):
        """The global array from every rank's local rows: on every rank (root=None) or only
        on `root` (the others get None)."""
        y = np.ascontiguousarray(np.asarray(y_local))
        if y.ndim == 0 or y.shape[0] != self.plan.n_owned:
            raise ShapeError(f"y_local: expected a leading axis of {self.plan.n_owned} (this "
                             f"rank's owned rows), found shape {y.shape}")
        if root is not None and not 0 <= root < self.comm.size:
            raise DistributedError(f"root: must be a rank in [0, {self.comm.size}), found "
                                   f"{root}")
        self.comm.agree(repr((y.shape[1:], y.dtype.str, root)), "gather's row shape/dtype")
        owned = self._owned_everywhere()
        row_bytes = int(np.prod(y.shape[1:], dtype=np.int64)) * y.dtype.itemsize
        counts = np.array([len(o) for o in owned], np.int64) * row_bytes
        stacked = np.empty((sum(len(o) for o in owned),) + y.shape[1:], y.dtype)
        MPI = mpi()
        send = [y.reshape(-1).view(np.uint8), MPI.BYTE]
        recv = [stacked.reshape(-1).view(np.uint8), (counts, None), MPI.BYTE]
        if root is None:
            req = self.comm.raw.Iallgatherv(send, recv)
        else:
            req = self.comm.raw.Igatherv(send, recv, root=root)
        self.comm.wait([req], "gather")
        if root is not None and root != self.comm.rank:
            return None
        out = np.empty((self.global_type.num_dst,) + y.shape[1:], y.dtype)
        out[np.concatenate(owned)] = stacked
        return out

    def _owned_everywhere(self) -> list:
        if self._all_owned is None:
            sizes = self.comm.allgather_array(np.array([self.plan.n_owned], np.int64),
                                              "gather's row counts")[:, 0]
            every = np.empty(int(sizes.sum()), np.int64)
            MPI = mpi()
            req = self.comm.raw.Iallgatherv([self.plan.owned, MPI.INT64_T],
                                            [every, (sizes, None), MPI.INT64_T])
            self.comm.wait([req], "gather's row ids")
            self._all_owned = np.split(every, np.cumsum(sizes)[:-1])
        return self._all_owned

    # ---- local relations ----------------------------------------------------------------------

    def _local(self, first: int, stop: int, num_src: int) -> Graph:
        p = self.plan
        if self.local_store is not None:
            return self.local_store.relation(p.row_ptr, first, stop, num_src)
        rp = p.row_ptr[first:stop + 1]
        e0, e1 = int(rp[0]), int(rp[-1])
        return Graph.from_csr(np.ascontiguousarray(rp - e0, dtype=np.int64),
                              np.ascontiguousarray(p.col_idx[e0:e1]), num_src=num_src)

    def _compact_boundary(self):
        """(owned rows the boundary rows read, the boundary relation over those rows then the
        ghosts), or None (a paged local relation). A destination-grouped call gathers just
        those owned rows beside the arriving ghosts, instead of copying every owned row
        into an owned + ghost buffer per call (the interior launches read the field as
        given)."""
        p = self.plan
        if self.local_store is not None:
            return None
        e0, e1 = int(p.row_ptr[p.n_interior]), int(p.row_ptr[p.n_owned])
        cols = np.asarray(p.col_idx[e0:e1], dtype=np.int64)
        ghost = cols >= p.n_owned
        used = np.unique(cols[~ghost])
        local = np.where(ghost, cols - p.n_owned + len(used), np.searchsorted(used, cols))
        rp = p.row_ptr[p.n_interior:p.n_owned + 1]
        relation = Graph.from_csr(np.ascontiguousarray(rp - e0, dtype=np.int64),
                                  local.astype(np.asarray(p.col_idx).dtype), num_src=len(used) +
                                  p.n_ghost, validate="none")
        return used, relation

    def _chunks(self) -> list:
        """(row range, relation) pieces of the interior rows: between two launches the
        runtime tests the halo requests, since MPI progresses only inside MPI calls."""
        rp = self.plan.row_ptr[:self.plan.n_interior + 1]
        total = int(rp[-1])
        pieces = max(1, min(8, total // INTERIOR_CHUNK_EDGES))
        if pieces == 1:
            return [((0, self.plan.n_interior), self.interior)]
        cuts = np.searchsorted(rp, np.arange(1, pieces) * total / pieces)
        bounds = np.unique(np.concatenate([[0], cuts, [self.plan.n_interior]]))
        return [((int(a), int(b)), self._local(int(a), int(b), self.plan.n_owned))
                for a, b in zip(bounds[:-1], bounds[1:])]

    def halo_lines(self, row_bytes: int | None = None) -> list:
        """Readable halo plan: ghost rows and bytes per neighbour rank."""
        p = self.plan
        lines = [f"rank {self.comm.rank}/{self.comm.size} ({self.method}): {p.n_owned} owned "
                 f"rows ({p.n_interior} interior, {p.n_owned - p.n_interior} boundary), "
                 f"{p.n_ghost} ghost rows, {self.num_edges} local edges "
                 f"({p.interior_edges} interior)"]
        if self.local_store is not None:
            lines.append(f"  local CSR paged: rank-private store {self.local_store.path} (the "
                         "interior chunks and boundary rows are row ranges of it)")
        sends = dict(p.send)
        for q in p.peers():
            got = sum(b - a for r, a, b in p.recv if r == q)
            put = len(sends.get(q, ()))
            per = ("" if row_bytes is None else
                f" ({got * row_bytes} B in, {put * row_bytes} B out per exchange)")
            lines.append(f"  peer rank {q}: receive {got} ghost rows, send {put} rows{per}")
        return lines


def partition(graph, method: str = "rows", positions=None, comm: Comm | None = None
              ) -> DistributedGraph:
    """This rank's DistributedGraph of `graph` (every rank passes the same graph).

    A `tg.Graph.radius` relation (one point set) partitions with method="spatial" over its
    own coordinates (boxes, ghosts within the cutoff: generated.py); a store-backed one
    (`tg.Graph.open`) by "rows", "edges" or "spatial" (positions: a src/dst field name of
    the store, or an array), reading only this rank's rows (stored.py); under a host budget
    (tg.scope) too small for the rank's local CSR, that CSR goes to a rank-private store in
    the spill dir and the rank's relations are paged (paged.py; `dg.paged`)."""
    if isinstance(graph, DistributedGraph):
        raise GraphValidationError("graph: is already a DistributedGraph; partition the "
                                   "global tg.Graph")
    if not isinstance(graph, Graph):
        raise GraphValidationError(f"graph: expected a tg.Graph, found "
                                   f"{type(graph).__name__}")
    if graph.num_src != graph.num_dst:
        raise UnsupportedError(
            f"graph: partitioning needs one node set (num_src == num_dst), found num_src="
            f"{graph.num_src}, num_dst={graph.num_dst}",
            hint="source fields are split with the destination rows' ownership")
    comm = (comm or init()).dup()
    if graph.kind == "radius":
        return _partition_radius(graph, method, positions, comm)
    if graph.kind == "paged":
        return _partition_store(graph, method, positions, comm)
    graph.ensure_valid()
    row_ptr, col_idx = graph.resolve_csr()
    owner = owners(row_ptr, comm.size, method, positions)
    gtype = graph.type()
    comm.agree(repr((gtype.kind, gtype.num_src, gtype.num_dst, int(graph.num_edges), method,
                     _fingerprint(row_ptr, col_idx, graph.edge_perm, owner))),
               "partition (graph and method)")
    plan = build_plan(row_ptr, col_idx, graph.edge_perm, owner, comm.rank)
    return DistributedGraph(comm, plan, gtype, method, owner)


def _partition_radius(graph: Graph, method: str, positions, comm: Comm) -> DistributedGraph:
    """Boxes by recursive coordinate bisection; each rank searches its own rows only."""
    check_radius(graph, method, positions)
    pos = graph.params["positions"]
    p = graph.params
    comm.agree(repr((graph.num_dst, pos.shape, pos.dtype.str, float(p["cutoff"]),
                     bool(p["loop"]), _fingerprint(pos))), "partition (radius relation)")
    owner = owners(np.zeros(graph.num_dst + 1, np.int64), comm.size, "spatial", pos)

    def degrees_of(mine, counts):
        every = _allgatherv(comm, counts.astype(np.int64), "the radius rows' degrees")
        order = np.argsort(owner, kind="stable")      # rank by rank, ascending id
        degree = np.empty(graph.num_dst, np.int64)
        degree[order] = every
        return degree

    plan, owned_pos = radius_plan(graph, owner, comm.rank, comm.size, degrees_of)
    total = int(comm.sum(np.array([len(plan.col_idx)], np.int64), "the radius edge count")[0])
    gtype = GraphType("csr", graph.num_src, graph.num_dst, total, graph.type().index_dtype,
                      None)
    dg = DistributedGraph(comm, plan, gtype, "spatial", owner)
    dg.kind, dg.params = "radius", generated_params(graph, owned_pos)
    return dg


def _partition_store(graph: Graph, method: str, positions, comm: Comm) -> DistributedGraph:
    """Contiguous row ranges, or spatial boxes over stored (or given) positions; each rank
    reads its own rows of the store, nothing else (stored.py). Under a host budget whose
    room cannot hold this rank's local CSR, the rank's relations are paged (paged.py)."""
    check_store_method(method, positions)
    reader = graph.params["reader"]
    own = store_ownership(reader, comm.size, method, positions)
    comm.agree(repr((graph.num_src, graph.num_dst, int(graph.num_edges), method,
                     reader.version, _fingerprint(own.owner))),
               "partition (store-backed graph, method and positions)")

    def exchange_ids(per_peer: list) -> list:
        counts = np.array([len(ids) for ids in per_peer], np.int64)
        matrix = comm.allgather_array(counts, "the halo id counts")   # [from, to]
        theirs = matrix[:, comm.rank]
        got = np.empty(int(theirs.sum()), np.int64)
        MPI = mpi()
        sent = np.concatenate(per_peer).astype(np.int64) if per_peer else np.zeros(0, np.int64)
        req = comm.raw.Ialltoallv([sent, (counts, None), MPI.INT64_T],
                                  [got, (theirs, None), MPI.INT64_T])
        comm.wait([req], "the halo id exchange")
        return np.split(got, np.cumsum(theirs)[:-1])

    local = None
    if should_page(reader, own.mine(comm.rank)):
        plan, local = paged_store_plan(reader, own, comm.rank, exchange_ids)
    else:
        plan = store_plan(reader, own, comm.rank, exchange_ids)
    owner = own.owner if own.owner is not None else own.of(plan.owned)   # own rows only
    return DistributedGraph(comm, plan, graph.type(), method, owner, local)


def _allgatherv(comm: Comm, mine: np.ndarray, what: str) -> np.ndarray:
    """Every rank's int64 vector, concatenated by rank (bounded)."""
    sizes = comm.allgather_array(np.array([len(mine)], np.int64), what)[:, 0]
    every = np.empty(int(sizes.sum()), np.int64)
    MPI = mpi()
    req = comm.raw.Iallgatherv([np.ascontiguousarray(mine), MPI.INT64_T],
                               [every, (sizes, None), MPI.INT64_T])
    comm.wait([req], what)
    return every


def _fingerprint(*arrays) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def is_distributed(value) -> bool:
    return getattr(value, "tiga_distributed", False) is True


__all__ = ["DistributedGraph", "partition", "is_distributed"]
