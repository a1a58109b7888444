"""core: relations (graphs): destination-oriented CSR, implicit kinds, transpose, validation.

A relation is an ordered collection of edges from `num_src` sources to `num_dst` destinations
(API.md section 2). Storage is destination-oriented CSR; duplicate edges stay separate, self
edges are ordinary and no reverse edge is ever added. The edge order seen by edge fields is the
user's order; `edge_perm[p]` names the user edge stored at CSR position p (None: identity).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from . import graph_build as gb
from . import graph_generated as geo
from . import graph_loops as gl
from . import graph_utils as gu
from . import graph_validate as gv
from .dtypes import DType, as_dtype, int32, int64
from .errors import GraphValidationError
from .types import Dim, GraphType

KINDS = ("csr", "dense", "triangular", "cu_seqlens", "cat", "stencil", "radius", "knn",
         "paged")
GENERATED_KINDS = ("radius", "knn")
IMPLICIT_DEGREES = ("dense", "triangular", "cu_seqlens", "stencil")
# tiga.trace registers how radius/knn stage on traced coordinates (core cannot import trace)
generated_hooks: dict[str, Callable | None] = {"traced": None, "bind": None}
# the runtime registers its store reader: `open(path)` -> an object with num_src, num_dst,
# num_edges, index_dtype, version, read_rows(start, stop) and read_csr() (core cannot
# import the runtime); `degrees(graph, by)` counts a paged relation's degrees by row ranges
store_hooks: dict[str, Callable | None] = {"open": None, "degrees": None}


class Graph:
    """A relation. Build one with the `from_*` constructors or an implicit kind
    (`dense`, `triangular`, `cu_seqlens`, `stencil`, `cat`); never call the class directly.

    Attributes:
        num_src (int): source entities (the rows of source fields).
        num_dst (int): destination entities (the rows of results and destination fields).
        num_edges (int | None): edges (the rows of edge fields); None for a radius or kNN
            relation until `resolve_csr()` generates it.
        kind (str): "csr", "dense", "triangular", "cu_seqlens", "cat", "stencil", "radius",
            "knn" or "paged" (a relation stored on disk).
    """

    def __init__(self, *, kind: str, num_src: int, num_dst: int, num_edges: int,
                 index_dtype: DType = int64, csr: tuple | None = None,
                 edge_perm: np.ndarray | None = None, params: dict | None = None,
                 validated: str = "full", deferred: Callable[[], None] | None = None,
                 device: str = "cpu", parts: tuple = ()):
        self.kind = kind
        self.num_src = num_src
        self.num_dst = num_dst
        self.num_edges = num_edges
        self.index_dtype = index_dtype
        self.edge_perm = edge_perm
        self.params = dict(params or {})
        self.device = device
        self.parts = parts
        self._csr = csr
        self._validated = validated
        # the full check a 'none'/'basic' graph still owes, run once by ensure_valid()
        self._deferred = deferred
        self._transposed: tuple | None = None
        self._transposed_rows: tuple | None = None

    # ---- explicit constructors -------------------------------------------------------------

    @classmethod
    def from_csr(cls, row_ptr: Any, col_idx: Any, *, num_src: int | None = None,
                 validate: str = "full", copy: bool = True) -> Graph:
        """Destination-oriented CSR: destination d reads col_idx[row_ptr[d]:row_ptr[d+1]].

        validate: 'full' checks every rule now; 'basic' only O(1) metadata (row_ptr ends);
        'none' promises validity. The last two are checked in full by ensure_valid(), which
        consumers must call before computing on the relation (transpose and degrees do).
        Integer 1-D arrays and a non-empty row_ptr are required at every level: storage
        cannot exist without them.

        copy: True (default) stores private copies, so later writes to the caller's arrays
        cannot change (or crash) the relation. False keeps numpy arrays already in the
        storage dtype (int64 row_ptr, int32/int64 col_idx, contiguous) without copying and
        marks them, and the arrays they view, read-only: a later write raises numpy's
        ValueError. Writes through other views that already exist are the caller's to
        avoid. Memory numpy cannot freeze (torch tensors, buffers) is copied either way.
        """
        return cls._csr_graph(row_ptr, col_idx, num_src, gv.check_level(validate),
                              ("row_ptr", "col_idx"), gv.read_copy_flag(copy))

    @classmethod
    def _csr_graph(cls, row_ptr: Any, col_idx: Any, num_src: Any, level: str,
                   names: tuple, copy: bool = True) -> Graph:
        device = gv.input_device(col_idx)
        rp = gv.read_index_array(row_ptr, names[0])
        ci = gv.read_index_array(col_idx, names[1])
        # own the arrays before checking them: what was checked is what the kernels read
        ci = gv.owned_index(ci, col_idx, gv.index_dtype_for(ci.dtype), copy, names[1])
        rp = gv.owned_index(rp, row_ptr, np.dtype(np.int64), copy, names[0])
        if len(rp) == 0:
            raise GraphValidationError(
                f"{names[0]}: has length 0, expected length num_dst + 1 >= 1")
        if num_src is None:
            # clamp so an unvalidated negative maximum cannot make a negative size
            num_src = gv.check_count(max(int(ci.max()) + 1, 0) if ci.size else 0, "num_src",
                                     f" (inferred as max({names[1]}) + 1)")
        else:
            num_src = gv.check_count(num_src, "num_src")
        gv.check_csr(rp, ci, num_src, level, names)
        deferred = None
        if level != "full":
            deferred = partial(gv.check_csr, rp, ci, num_src, "full", names)
        return cls(kind="csr", num_src=num_src, num_dst=len(rp) - 1, num_edges=len(ci),
                   index_dtype=as_dtype(ci.dtype), csr=(rp, ci), validated=level,
                   deferred=deferred, device=device)

    @classmethod
    def from_coo(cls, src: Any, dst: Any, *, num_src: int, num_dst: int,
                 validate: str = "full", copy: bool = True) -> Graph:
        """Edges (src[e], dst[e]) in the user's order; stored sorted (stably) by destination.

        The stored CSR is always built anew. `copy` matters only for validate='none' or
        'basic', whose deferred check reads src and dst later: True keeps private copies,
        False freezes the caller's arrays instead (see from_csr)."""
        return cls._coo_graph(src, dst, num_src, num_dst, gv.check_level(validate),
                              ("src", "dst"), ("num_src", "num_dst"), gv.read_copy_flag(copy))

    @classmethod
    def _coo_graph(cls, src: Any, dst: Any, num_src: Any, num_dst: Any, level: str,
                   names: tuple, bounds: tuple, copy: bool = True) -> Graph:
        device = gv.input_device(src)
        s = gv.read_index_array(src, names[0])
        d = gv.read_index_array(dst, names[1])
        if level != "full":   # the deferred check must read what the CSR was built from
            s = gv.owned_index(s, src, gv.index_dtype_for(s.dtype), copy, names[0])
            d = gv.owned_index(d, dst, gv.index_dtype_for(d.dtype), copy, names[1])
        num_src = gv.check_count(num_src, bounds[0])
        num_dst = gv.check_count(num_dst, bounds[1])
        gv.check_same_length(s, d, names)
        gv.check_coo(s, d, num_src, num_dst, level, names, bounds)
        idx = gv.index_dtype_for(s.dtype)
        row_ptr, col_idx, edge_perm = gb.coo_to_csr(s, d, num_dst, idx)
        deferred = None
        if level != "full":
            deferred = partial(gv.check_coo, s, d, num_src, num_dst, "full", names, bounds)
        return cls(kind="csr", num_src=num_src, num_dst=num_dst, num_edges=len(col_idx),
                   index_dtype=as_dtype(idx), csr=gb.freeze(row_ptr, col_idx),
                   edge_perm=gb.freeze(edge_perm)[0], validated=level, deferred=deferred,
                   device=device)

    @classmethod
    def from_edge_index(cls, edge_index: Any, num_nodes: int | None = None) -> Graph:
        """PyG convention: shape (2, E), row 0 = source, row 1 = target."""
        ei = gv.read_index_array(edge_index, "edge_index", ndim=2)
        if ei.shape[0] != 2:
            raise GraphValidationError(
                f"edge_index: has shape {tuple(ei.shape)}, expected shape (2, E)")
        if num_nodes is None:
            num_nodes = gv.check_count(max(int(ei.max()) + 1, 0) if ei.size else 0,
                                       "num_nodes", " (inferred as max(edge_index) + 1)")
        graph = cls._coo_graph(ei[0], ei[1], num_nodes, num_nodes, "full",
                               ("edge_index[0]", "edge_index[1]"), ("num_nodes", "num_nodes"))
        graph.device = gv.input_device(edge_index)
        return graph

    @classmethod
    def from_scipy(cls, matrix: Any, *, copy: bool = True) -> Graph:
        """A scipy.sparse matrix or array: rows = destinations, columns = sources. Duplicates
        and the stored entry order are kept. copy=False shares (and freezes) a CSR matrix's
        indptr and indices (see from_csr); other formats are converted, so never shared."""
        copy = gv.read_copy_flag(copy)
        try:
            import scipy.sparse as sp
        except ImportError:
            raise GraphValidationError(
                f"matrix: is {type(matrix).__name__}, expected a scipy.sparse matrix "
                "(scipy is not installed)") from None
        if not sp.issparse(matrix) or len(matrix.shape) != 2:
            raise GraphValidationError(
                f"matrix: is {type(matrix).__name__}, expected a 2-D scipy.sparse matrix")
        num_dst, num_src = (int(n) for n in matrix.shape)
        if matrix.format == "csr":
            return cls._csr_graph(matrix.indptr, matrix.indices, num_src, "full",
                                  ("matrix.indptr", "matrix.indices"), copy)
        coo = matrix.tocoo()
        return cls._coo_graph(coo.col, coo.row, num_src, num_dst, "full",
                              ("matrix.col", "matrix.row"), ("num_src", "num_dst"))

    # ---- implicit constructors -------------------------------------------------------------

    @classmethod
    def dense(cls, num_src: int, num_dst: int | None = None) -> Graph:
        """Every destination reads every source (dst-major, then source ascending)."""
        num_src = gv.check_count(num_src, "num_src")
        num_dst = num_src if num_dst is None else gv.check_count(num_dst, "num_dst")
        return cls(kind="dense", num_src=num_src, num_dst=num_dst, num_edges=num_src * num_dst,
                   params={"num_src": num_src, "num_dst": num_dst})

    @classmethod
    def triangular(cls, n: int, *, device: Any = "cpu") -> Graph:
        """Causal relation: destination i reads sources 0..i (diagonal included)."""
        n = gv.check_count(n, "n")
        return cls(kind="triangular", num_src=n, num_dst=n, num_edges=n * (n + 1) // 2,
                   params={"n": n}, device=str(device))

    @classmethod
    def cu_seqlens(cls, cu_seqlens: Any, causal: bool = True) -> Graph:
        """Block-diagonal sequences [cu[k], cu[k+1]); triangular (causal) or dense per block."""
        cu = gv.read_cu_seqlens(cu_seqlens)
        causal = gv.read_flag(causal, "causal")
        return cls(kind="cu_seqlens", num_src=cu[-1], num_dst=cu[-1],
                   num_edges=gb.cu_seqlens_num_edges(cu, causal),
                   params={"cu_seqlens": cu, "causal": causal},
                   device=gv.input_device(cu_seqlens))

    @classmethod
    def stencil(cls, shape: Sequence[int], offsets: Sequence[Sequence[int]], *,
                periodic: bool = False) -> Graph:
        """Lattice points in C order; point p reads p + offset for each offset in order,
        skipping neighbours outside the lattice unless `periodic` wraps them.

        Edge order (for edge fields): destination-major over the points in C order, then
        the offsets in the order given, counting only the edges that exist (periodic: edge
        p * len(offsets) + k is point p's k-th offset). src/dst fields may be passed flat,
        (points, ...), or in lattice shape, (*shape, ...): the latter are flattened in C
        order and the result comes back as (*shape, ...)."""
        shape = gv.read_shape(shape)
        offsets = gv.read_offsets(offsets, len(shape))
        periodic = gv.read_flag(periodic, "periodic")
        points = int(np.prod(shape, dtype=object))
        return cls(kind="stencil", num_src=points, num_dst=points,
                   num_edges=gb.stencil_num_edges(shape, offsets, periodic),
                   params={"shape": shape, "offsets": offsets, "periodic": periodic})

    @classmethod
    def radius(cls, positions: Any, cutoff: float, *, query: Any = None, loop: bool = False,
               max_neighbors: int | None = None) -> Graph:
        """Destination i (a query point, or a point of `positions` when query is None) reads
        every source j with `|p_j - q_i| <= cutoff` (inclusive), in ascending j. `loop=False`
        drops (i, i) when query is None. `max_neighbors` keeps each row's nearest ones (ties
        by smaller index); explain() reports how many rows were truncated."""
        if _traced(positions, query):
            return generated_hooks["bind"]("radius", positions, query, cutoff=float(
                geo.read_cutoff(cutoff)), loop=geo.read_flag(loop, "loop"),
                max_neighbors=geo.read_max_neighbors(max_neighbors))
        pos = geo.read_positions(positions, "positions")
        q = geo.read_query(query, pos)
        params = {"cutoff": geo.read_cutoff(cutoff), "loop": geo.read_flag(loop, "loop"),
                  "max_neighbors": geo.read_max_neighbors(max_neighbors)}
        return cls._generated("radius", pos, q, positions, query, params, None)

    @classmethod
    def knn(cls, positions: Any, k: int, *, query: Any = None, loop: bool = False) -> Graph:
        """Destination i reads its k nearest sources, nearest first, ties by smaller source
        index (exact). `loop=False` drops (i, i) when query is None."""
        if _traced(positions, query):
            loop = geo.read_flag(loop, "loop")
            num_src = positions.aval.shape[0] if hasattr(positions, "aval") else len(positions)
            if isinstance(num_src, int):   # k is checked now when the size is concrete
                k = geo.read_k(k, geo.candidates_per_row(num_src, query is None, loop))
            return generated_hooks["bind"]("knn", positions, query, k=k, loop=loop)
        pos = geo.read_positions(positions, "positions")
        q = geo.read_query(query, pos)
        loop = geo.read_flag(loop, "loop")
        k = geo.read_k(k, geo.candidates_per_row(len(pos), q is None, loop))
        n = len(pos) if q is None else len(q)
        return cls._generated("knn", pos, q, positions, query, {"k": k, "loop": loop}, n * k)

    @classmethod
    def _generated(cls, kind, pos, q, pos_in, query_in, params, num_edges) -> Graph:
        # private read-only copies: the caller's arrays stay writable, and writing them later
        # cannot change the relation the cell directory and kernels were built for
        pos = _private(pos)
        q = None if q is None else _private(q)
        params = dict(params, positions=pos, query=q, dims=pos.shape[1],
                      inputs=(_differentiable(pos_in, pos),
                              None if q is None else _differentiable(query_in, q)))
        n = len(pos) if q is None else len(q)
        return cls(kind=kind, num_src=len(pos), num_dst=n, num_edges=num_edges,
                   params=params, device=gv.input_device(pos_in))

    @property
    def positions(self):
        """Source coordinates of a generated relation (None for other kinds)."""
        return self.params.get("positions")

    @property
    def query_positions(self):
        """Destination coordinates of a generated relation (the sources when query=None)."""
        if self.kind not in GENERATED_KINDS:
            return None
        q = self.params.get("query")
        return self.params["positions"] if q is None else q

    @property
    def truncated_rows(self) -> int | None:
        """Rows of a radius relation that max_neighbors truncated (resolves the relation)."""
        if self.kind != "radius" or self.params.get("max_neighbors") is None:
            return None if self.kind != "radius" else 0
        self.resolve_csr()
        return self.params["_truncated"]

    @classmethod
    def cat(cls, graphs: Sequence[Graph]) -> Graph:
        """Disjoint blocks: source and destination ids are offset independently; edge order is
        block order, then each part's own edge order. Materialises CSR."""
        parts = _read_graphs(graphs)
        num_src = sum(g.num_src for g in parts)
        num_dst = sum(g.num_dst for g in parts)
        narrow = all(g.index_dtype == int32 for g in parts) and num_src <= np.iinfo(np.int32).max
        idx = np.dtype(np.int32 if parts and narrow else np.int64)
        arrays = [(*g.resolve_csr(), g.edge_perm, g.num_src) for g in parts]
        row_ptr, col_idx, edge_perm = gb.cat_csr(arrays, idx)
        level = gv.level_min(g.validated for g in parts)
        deferred = None if level == "full" else partial(_ensure_all_valid, parts)
        blocks = tuple((g.kind, g.num_src, g.num_dst, g.num_edges) for g in parts)
        return cls(kind="cat", num_src=num_src, num_dst=num_dst, num_edges=len(col_idx),
                   index_dtype=as_dtype(idx), csr=gb.freeze(row_ptr, col_idx),
                   edge_perm=gb.freeze(edge_perm)[0], params={"blocks": blocks},
                   validated=level, deferred=deferred, parts=parts)

    @classmethod
    def open(cls, path: Any) -> Graph:
        """The relation of a committed store (tg.store): kind "paged", its CSR stays on disk
        and programs read it page by page; resolve_csr() reads it whole (for checks)."""
        opener = store_hooks["open"]
        if opener is None:
            raise GraphValidationError("Graph.open: no store reader is registered (import "
                                       "tiga, not tiga.core alone)")
        reader = opener(path)
        return cls(kind="paged", num_src=reader.num_src, num_dst=reader.num_dst,
                   num_edges=reader.num_edges, index_dtype=as_dtype(reader.index_dtype),
                   params={"path": str(path), "version": reader.version, "reader": reader})

    # ---- queries ---------------------------------------------------------------------------

    @property
    def validated(self) -> str:
        """'full', 'basic' or 'none': how much of the input has been checked so far."""
        return self._validated

    def ensure_valid(self) -> Graph:
        """Run the full validation once (graphs built with validate='none' or 'basic')."""
        if self._validated != "full":
            self._deferred()
            self._validated, self._deferred = "full", None
        return self

    def resolve_csr(self) -> tuple:
        """(row_ptr int64, col_idx in the index dtype), materialised once and cached."""
        if self._csr is None:
            if self.kind in GENERATED_KINDS:
                self._csr = gb.freeze(*_generated_csr(self.kind, self.params))
                self.num_edges = len(self._csr[1])
            elif self.kind == "paged":
                self._csr = gb.freeze(*self.params["reader"].read_csr())
            else:
                self._csr = gb.freeze(*_implicit_csr(self.kind, self.params))
        return self._csr

    def degrees(self, by: str = "dst") -> np.ndarray:
        """int64 in-degree per destination (by='dst') or out-degree per source (by='src')."""
        if by not in ("dst", "src"):
            raise GraphValidationError(f"by: is {by!r}, expected 'dst' or 'src'")
        if self.kind == "paged" and self._csr is None and store_hooks.get("degrees"):
            return store_hooks["degrees"](self, by)    # the stored CSR is never read whole
        self.ensure_valid()
        if self._csr is None and self.kind in IMPLICIT_DEGREES:   # (from the formula)
            return gb.implicit_degrees(self.kind, self.params, by)
        row_ptr, col_idx = self.resolve_csr()
        if by == "dst":
            return np.diff(row_ptr)
        return np.bincount(col_idx, minlength=self.num_src).astype(np.int64, copy=False)

    def with_self_loops(self) -> Graph:
        """A + I: a plain CSR relation with one more edge i -> i for every destination
        i < min(num_src, num_dst). Existing self edges stay (a node that had one now has
        two). Edge order: the original edges keep ids 0..E-1 and loop i gets id E + i, so
        an edge field extends as concatenate([w, w_loops]), as with PyG's add_self_loops;
        in storage each loop is the last edge of its destination's row."""
        self.ensure_valid()
        row_ptr, col_idx = self.resolve_csr()
        rp, ci, perm = gu.self_loops_csr(row_ptr, col_idx, self.edge_perm,
                                         min(self.num_src, self.num_dst), self.index_dtype.np)
        return Graph(kind="csr", num_src=self.num_src, num_dst=self.num_dst,
                     num_edges=len(ci), index_dtype=self.index_dtype, csr=gb.freeze(rp, ci),
                     edge_perm=gb.freeze(perm)[0], device=self.device)

    def remove_self_loops(self) -> tuple:
        """(graph, edge_ids): this relation without its self edges i -> i, as PyG's
        remove_self_loops. The other edges keep their relative order; new edge k is old edge
        edge_ids[k] (int64), so an edge field follows as w[edge_ids]. A plain CSR relation."""
        self.ensure_valid()
        src, dst = gu.user_order(*self.resolve_csr(), self.edge_perm)
        return self._loop_edit(*gl.without_loops(src, dst))

    def add_remaining_self_loops(self) -> tuple:
        """(graph, edge_ids) as PyG's add_remaining_self_loops: one self edge i -> i for every
        node i < min(num_src, num_dst), keeping no second loop where one existed.

        Edge order (PyG's): the edges that are not loops, in their order, then the loops
        0 -> 0, 1 -> 1, ... Edge ids: a kept edge gives its old id; loop i gives the id of
        node i's existing self edge (the last one in edge order when there were several,
        whose field value PyG keeps), or -1 for a new loop. So an edge field follows as
        where(edge_ids >= 0, w[edge_ids], fill). A plain CSR relation."""
        self.ensure_valid()
        src, dst = gu.user_order(*self.resolve_csr(), self.edge_perm)
        return self._loop_edit(*gl.remaining_loops(src, dst, min(self.num_src, self.num_dst)))

    def _loop_edit(self, src: np.ndarray, dst: np.ndarray, edge_ids: np.ndarray) -> tuple:
        rp, ci, perm = gb.coo_to_csr(src, dst, self.num_dst, self.index_dtype.np)
        graph = Graph(kind="csr", num_src=self.num_src, num_dst=self.num_dst,
                      num_edges=len(ci), index_dtype=self.index_dtype, csr=gb.freeze(rp, ci),
                      edge_perm=gb.freeze(perm)[0], device=self.device)
        return graph, gb.freeze(edge_ids)[0]

    def gcn_norm(self, add_self_loops: bool = False, dtype: Any = np.float64) -> np.ndarray:
        """GCN's symmetric normalisation D^-1/2 A D^-1/2 as an edge field: edge j -> i gets
        1 / sqrt(deg(i) * deg(j)), deg being the in-degree over this relation (PyG's
        gcn_norm convention; 0 where a degree is 0), in this relation's edge order. With
        add_self_loops=True the field is for `self.with_self_loops()` (its edge order)."""
        graph = self.with_self_loops() if add_self_loops else self.ensure_valid()
        row_ptr, col_idx = graph.resolve_csr()
        return gu.gcn_norm(row_ptr, col_idx, graph.edge_perm, graph.num_src, graph.num_dst,
                           np.dtype(dtype))

    def to_edge_index(self) -> np.ndarray:
        """(2, E) int64 [source; target] in edge order: from_edge_index's inverse."""
        self.ensure_valid()
        return gu.to_edge_index(*self.resolve_csr(), self.edge_perm)

    def transpose(self) -> tuple:
        """(graph_t, perm): the source-oriented relation as plain CSR, and the permutation with
        field_t = field[perm] for an edge field in this graph's edge order. Cached. Its
        row_ptr has num_src + 1 entries; transpose_rows() is sized by the edges alone."""
        if self._transposed is None:
            row_ids, rp, ci_t, perm = self.transpose_rows()
            rp_t = gb.expand_rows(row_ids, rp, self.num_src)
            gb.freeze(rp_t)
            graph_t = Graph(kind="csr", num_src=self.num_dst, num_dst=self.num_src,
                            num_edges=self.num_edges, index_dtype=self.index_dtype,
                            csr=(rp_t, ci_t), device=self.device)
            self._transposed = (graph_t, perm)
        return self._transposed

    def transpose_rows(self) -> tuple:
        """(row_ids, row_ptr_t, col_idx_t, perm): the transposed CSR over the sources that
        have edges only (source row_ids[k] reads col_idx_t[row_ptr_t[k]:row_ptr_t[k+1]]),
        every array sized by the edges, not by num_src. Cached (read-only arrays)."""
        if self._transposed_rows is None:
            self.ensure_valid()
            row_ptr, col_idx = self.resolve_csr()
            self._transposed_rows = gb.freeze(*gb.transpose_rows(
                row_ptr, col_idx, self.edge_perm, self.index_dtype.np))
        return self._transposed_rows

    def type(self, symbolic: bool = False) -> GraphType:
        """The relation's GraphType; symbolic sizes (N, S, E) let one kernel serve every size."""
        dims = self.params.get("dims") if self.kind in GENERATED_KINDS else None
        if not symbolic:
            e = Dim("E") if self.num_edges is None else self.num_edges
            return GraphType(self.kind, self.num_src, self.num_dst, e, self.index_dtype, dims)
        n = Dim("N")
        s = n if self.num_src == self.num_dst else Dim("S")
        return GraphType(self.kind, s, n, Dim("E"), self.index_dtype, dims)

    def __repr__(self) -> str:
        return (f"Graph(kind={self.kind!r}, num_src={self.num_src}, num_dst={self.num_dst}, "
                f"num_edges={self.num_edges})")


def _implicit_csr(kind: str, params: dict) -> tuple:
    if kind == "dense":
        return gb.dense_csr(params["num_src"], params["num_dst"])
    if kind == "triangular":
        return gb.triangular_csr(params["n"])
    if kind == "cu_seqlens":
        return gb.cu_seqlens_csr(params["cu_seqlens"], params["causal"])
    if kind == "stencil":
        return gb.stencil_csr(params["shape"], params["offsets"], params["periodic"])
    raise GraphValidationError(f"kind: {kind!r} has no implicit CSR form")


def _generated_csr(kind: str, params: dict) -> tuple:
    pos, q = params["positions"], params["query"]
    if kind == "knn":
        return geo.knn_csr(pos, q, params["k"], params["loop"])
    row_ptr, col_idx, truncated = geo.radius_csr(pos, q, params["cutoff"], params["loop"],
                                                 params["max_neighbors"])
    params["_truncated"] = truncated
    return row_ptr, col_idx


def _traced(*values) -> bool:
    hook = generated_hooks["traced"]
    return hook is not None and any(hook(v) for v in values if v is not None)


def _private(arr: np.ndarray) -> np.ndarray:
    out = arr.copy()
    out.flags.writeable = False
    return out


def _differentiable(given: Any, checked: np.ndarray) -> Any:
    """What the hidden position field of a propagate reads: the caller's own object when it
    can carry gradients (torch tensor, tg.Tensor), else the checked numpy array."""
    if (hasattr(given, "requires_grad") and getattr(given, "dtype", None) is not None and
            str(given.dtype).endswith(str(checked.dtype))):
        return given
    if type(given).__name__ == "Tensor" and type(given).__module__.startswith("tiga"):
        return given
    return checked


def _read_graphs(graphs: Any) -> tuple:
    if isinstance(graphs, Graph):
        raise GraphValidationError("graphs: is a single Graph, expected a sequence of Graphs")
    try:
        parts = tuple(graphs)
    except TypeError:
        raise GraphValidationError(
            f"graphs: is {type(graphs).__name__}, expected a sequence of Graphs") from None
    for i, g in enumerate(parts):
        if not isinstance(g, Graph):
            raise GraphValidationError(
                f"graphs: entry at position {i} is {type(g).__name__}, expected a Graph")
    return parts


def _ensure_all_valid(parts: tuple) -> None:
    for g in parts:
        g.ensure_valid()
