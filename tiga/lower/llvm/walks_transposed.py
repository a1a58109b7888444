"""lower/llvm: walks by source (the transposed relation, source-major) without a transposed
CSR, and the sparse-source transposed CSR.

The transpose of an implicit relation is computed as its forward walk is: row r is source
r, its neighbours are the destinations that read it, and each edge's id (the user's edge
order, which edge fields and the edge-id VJP plans index) is the forward walk's formula.

- `dense_t`: the transpose of dense(S, D) is dense(D, S): source r is read by every
  destination d, edge d*S + r (walk_params = [S, D]).
- `triangular_t`: destination i reads sources 0..i, so source r is read by r..n-1 (an upper
  triangular walk), edge d(d+1)/2 + r (walk_params = [n]).
- `cu_seqlens_t`: block-diagonal, so the transpose is itself with src/dst swapped: source r
  of sequence k (binary search, as the forward) is read by r..cu[k+1]-1 (causal) or
  cu[k]..cu[k+1]-1, edges from the same O(K) tables as the forward.
- `stencil_t`: point r is read by p = r - offset for each offset with p inside (or wrapped,
  periodic): the stencil with negated offsets. Periodic edge ids are p*K + k; non-periodic
  ones are edge_start(p) (a closed form over the lattice, no row_ptr) plus the inside
  offsets of p before k.
- `csr_rows`: a CSR relation whose sources are sparse walks its transposed CSR stored over
  the sources with edges only (Graph.transpose_rows: row_ids, row_ptr, col_idx, all sized
  by the edges). Rows are every source id in order; a cursor into row_ids, found once per
  call by binary search, advances as the rows do.

These walks are not contiguous in edge ids: the kernel keeps one accumulator per row.
"""
from __future__ import annotations

from llvmlite import ir

from .values import I1, I64, i64
from .walk_base import CuSeqlensWalk, Walk, _coords, _strides, stencil_edge_start


def transposed_walk(descriptor: tuple) -> Walk:
    kind = descriptor[0]
    if kind == "dense_t":
        return DenseTransposed()
    if kind == "triangular_t":
        return TriangularTransposed()
    if kind == "cu_seqlens_t":
        return CuSeqlensTransposed(descriptor[1])
    if kind == "stencil_t":
        return StencilTransposed(*descriptor[1:])
    return CsrRows()


def _loop_range(kb, row, eid_of, body) -> None:
    """Destinations lo..hi-1 of a row, each edge's id from eid_of(d)."""
    lo, hi, _ = row
    kb.ctx.loop(lo, hi, lambda d: body(eid_of(d), d), name="edge")


class DenseTransposed(Walk):
    slots = ("walk_params",)     # int64 [num_src, num_dst]
    hierarchy = "transposed-dense"
    contiguous = False

    def setup(self, kb):
        self.num_src = kb._load_index("walk_params", i64(0), I64)
        self.num_dst = kb._load_index("walk_params", i64(1), I64)

    def row(self, kb, r):
        return i64(0), self.num_dst, None

    def edges(self, kb, r, row, body) -> None:
        b = kb.b
        _loop_range(kb, row, lambda d: b.add(b.mul(d, self.num_src, flags=["nsw"]), r,
                                             flags=["nsw"]), body)


class TriangularTransposed(Walk):
    slots = ("walk_params",)     # int64 [n]
    hierarchy = "transposed-triangular"
    contiguous = False

    def setup(self, kb):
        self.n = kb._load_index("walk_params", i64(0), I64)

    def row(self, kb, r):
        return r, self.n, None

    def edges(self, kb, r, row, body) -> None:
        b = kb.b

        def eid(d):
            tri = b.ashr(b.mul(d, b.add(d, i64(1), flags=["nsw"]), flags=["nsw"]), i64(1))
            return b.add(tri, r, flags=["nsw"])

        _loop_range(kb, row, eid, body)


class CuSeqlensTransposed(CuSeqlensWalk):
    hierarchy = "transposed-cu-seqlens"
    contiguous = False

    def row(self, kb, r):
        b = kb.b
        k = self._sequence(kb, r)
        s0 = kb._load_index("cu_ext", k, I64)
        s1 = kb._load_index("cu_ext", b.add(k, i64(1)), I64)
        self._at = (k, s0, s1)
        return (r if self.causal else s0), s1, None

    def edges(self, kb, r, row, body) -> None:
        b = kb.b
        k, s0, s1 = self._at
        base = b.add(kb._load_index("seq_edges", k, I64), b.sub(r, s0), flags=["nsw"])

        def eid(d):
            i = b.sub(d, s0, flags=["nsw"])
            if self.causal:
                within = b.ashr(b.mul(i, b.add(i, i64(1)), flags=["nsw"]), i64(1))
            else:
                within = b.mul(i, b.sub(s1, s0), flags=["nsw"])
            return b.add(base, within, flags=["nsw"])

        _loop_range(kb, row, eid, body)

    edge_start = Walk.edge_start    # (walks by source have no per-row edge offsets)


class StencilTransposed(Walk):
    hierarchy = "transposed-stencil"
    contiguous = False

    def __init__(self, shape: tuple, offsets: tuple, periodic: bool):
        self.shape, self.offsets, self.periodic = tuple(shape), tuple(offsets), periodic
        self.strides = _strides(self.shape)
        # non-periodic: p = r - offset, so walking offsets by descending linear offset (ties in
        # offset order) visits the edges in ascending edge id, the transposed CSR's order
        lin = [sum(o * s for o, s in zip(off, self.strides)) for off in self.offsets]
        order = range(len(self.offsets))
        self.order = tuple(order) if periodic else tuple(sorted(order, key=lambda k: -lin[k]))

    def row(self, kb, r):
        b = kb.b
        self._x = _coords(b, r, self.shape, self.strides)
        if self.periodic:
            return i64(0), i64(len(self.offsets)), None
        count = i64(0)
        for off in self.offsets:
            count = b.add(count, b.zext(self._source_of(b, self._x, off)[1], I64))
        return i64(0), count, None

    def edges(self, kb, r, row, body) -> None:
        b, ctx = kb.b, kb.ctx
        for k in self.order:
            p, inside = self._source_of(b, self._x, self.offsets[k])
            take = ctx.fn.append_basic_block("stencil_t.edge")
            nxt = ctx.fn.append_basic_block("stencil_t.next")
            b.cbranch(inside, take, nxt)
            b.position_at_end(take)
            body(self._eid(b, p, k), self._linear(b, p))
            b.branch(nxt)
            b.position_at_end(nxt)

    def _source_of(self, b, x, off):
        """The destination p = x - off reading x, and whether it exists."""
        p, inside = [], ir.Constant(I1, 1)
        for c, o, n in zip(x, off, self.shape):
            q = b.sub(c, i64(o), flags=["nsw"])
            if self.periodic:
                q = b.srem(b.add(q, i64(n * (abs(o) // max(n, 1) + 1))), i64(n))
            else:
                inside = b.and_(inside, b.and_(b.icmp_signed(">=", q, i64(0)),
                                               b.icmp_signed("<", q, i64(n))))
            p.append(q)
        return p, inside

    def _linear(self, b, p) -> ir.Value:
        col = i64(0)
        for q, s in zip(p, self.strides):
            col = b.add(col, b.mul(q, i64(s)) if s != 1 else q)
        return col

    def _eid(self, b, p, k) -> ir.Value:
        if self.periodic:
            return b.add(b.mul(self._linear(b, p), i64(len(self.offsets))), i64(k))
        eid = stencil_edge_start(b, p, self.shape, self.offsets)
        for j in range(k):    # p's inside neighbours before offset k
            ok = ir.Constant(I1, 1)
            for q, o, n in zip(p, self.offsets[j], self.shape):
                c = b.add(q, i64(o))
                ok = b.and_(ok, b.and_(b.icmp_signed(">=", c, i64(0)),
                                       b.icmp_signed("<", c, i64(n))))
            eid = b.add(eid, b.zext(ok, I64))
        return eid


class CsrRows(Walk):
    # row_ids (sources with edges, ascending), row_ptr over them, walk_params = [len(row_ids)]
    slots = ("row_ptr", "col_idx", "row_ids", "walk_params")
    hierarchy = "compressed-row"
    contiguous = True
    gathers = True

    def setup(self, kb):
        b = kb.b
        self.count = kb._load_index("walk_params", i64(0), I64)
        self.cursor = kb.ctx.alloca(I64, 1)
        b.store(self._lower_bound(kb, kb.begin), self.cursor)

    def _lower_bound(self, kb, r) -> ir.Value:
        """The first k with row_ids[k] >= r (count when none)."""
        b, ctx = kb.b, kb.ctx
        lo, hi = ctx.alloca(I64, 1), ctx.alloca(I64, 1)
        b.store(i64(0), lo)
        b.store(self.count, hi)
        head = ctx.fn.append_basic_block("rows.head")
        body = ctx.fn.append_basic_block("rows.body")
        done = ctx.fn.append_basic_block("rows.done")
        b.branch(head)
        b.position_at_end(head)
        lv, hv = b.load(lo, typ=I64), b.load(hi, typ=I64)
        b.cbranch(b.icmp_signed("<", lv, hv), body, done)
        b.position_at_end(body)
        mid = b.ashr(b.add(lv, hv), i64(1))
        less = b.icmp_signed("<", kb._load_index("row_ids", mid, I64), r)
        b.store(b.select(less, b.add(mid, i64(1)), lv), lo)
        b.store(b.select(less, hv, mid), hi)
        b.branch(head)
        b.position_at_end(done)
        return b.load(lo, typ=I64)

    def edge_start(self, kb, r):
        return kb._load_index("row_ptr", self._lower_bound(kb, r), I64)

    def row(self, kb, r):
        b = kb.b
        c = b.load(self.cursor, typ=I64)
        ok = b.icmp_signed("<", c, self.count)
        at = b.select(ok, c, i64(0))
        hit = b.and_(ok, b.icmp_signed("==", kb._load_index("row_ids", at, I64), r))
        e0 = kb._load_index("row_ptr", at, I64)
        # (row_ptr has count + 1 >= 1 entries: no row k + 1 to read when count is 0)
        e1 = kb._load_index("row_ptr", b.select(ok, b.add(c, i64(1)), i64(0)), I64)
        b.store(b.add(c, b.zext(hit, I64)), self.cursor)
        return b.select(hit, e0, i64(0)), b.select(hit, e1, i64(0)), None

    def col(self, kb, p, row):
        return kb._load_index("col_idx", p, kb.index_t)

    def ahead_col(self, kb, q):
        return kb._load_index("col_idx", q, kb.index_t)
