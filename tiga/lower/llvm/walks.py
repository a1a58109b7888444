"""lower/llvm: how a propagate kernel finds the edges of a destination row (the Iter IR's
coordinate hierarchy, destination-major). The walk is named by a relation descriptor
(lower/abi.py's relation_descriptor); `walk_for` builds the code generator of one.

- `compressed-row` (csr, cat, and every walk by source): row_ptr / col_idx arrays.
- `dense`: row r owns edges [r*S, (r+1)*S), edge r*S + j reads source j.
- `triangular`: row r owns edges [r(r+1)/2, ...+r+1), edge start + j reads source j.
- `cu-seqlens`: row r lies in sequence k (binary search over cu_seqlens, O(log K)):
  sources cu[k] .. r (causal) or cu[k] .. cu[k+1]-1; the edges before sequence k come from
  an O(K) prefix table, so the walk needs two arrays of K + 2 integers, nothing per edge.
- `stencil`: row r's lattice coordinates (static shape) plus each static offset give the
  neighbour; outside points are skipped (or wrapped when periodic). Edge ids: r*K
  (periodic), or a closed form over the lattice (non-periodic: per offset, the points of
  its inside box before r; stencil_edge_start), so no array is read at all.

Walks by source (the transposed relation) are in walks_transposed.py.

A walk names the pointer slots it needs (`slots`), computes `edge_start(r)` for any
r in [0, N] (so `edge_start(end) - edge_start(begin)` counts a chunk's edges), and emits
the row's edge loop, calling `body(p, col)` with the edge id p and source index col.
"""
from __future__ import annotations

from llvmlite import ir

from ..abi import TRANSPOSED_KINDS
from .values import I1, I64, CodegenUnsupported, i64


def walk_for(descriptor) -> Walk:
    kind = descriptor[0]
    if kind == "csr":
        return CsrWalk()
    if kind == "dense":
        return DenseWalk()
    if kind == "triangular":
        return TriangularWalk()
    if kind == "cu_seqlens":
        return CuSeqlensWalk(descriptor[1])
    if kind == "stencil":
        return StencilWalk(*descriptor[1:])
    if kind in TRANSPOSED_KINDS:
        from .walks_transposed import transposed_walk  # (it imports this module)
        return transposed_walk(descriptor)
    raise CodegenUnsupported(f"relation walk {descriptor!r} has no cpu-llvm lowering")


class Walk:
    slots: tuple = ()
    hierarchy = "compressed-row"
    gathers = False          # sources are random gathers worth a software prefetch
    contiguous = True        # a row's edges are one id range walked in order

    def setup(self, kb) -> None:
        """Per-call values (loaded once in the kernel's entry)."""

    def edge_start(self, kb, r) -> ir.Value:
        """First edge id of row r (every walk with row offsets defines it)."""
        raise CodegenUnsupported(f"the {self.hierarchy} walk has no per-row edge offsets")

    def row(self, kb, r) -> tuple:
        """(e0, e1, first_src) of row r; first_src is None where col is loaded per edge."""
        e1 = self.edge_start(kb, kb.b.add(r, i64(1), flags=["nsw"]))
        return self.edge_start(kb, r), e1, i64(0)

    def col(self, kb, p, row) -> ir.Value:
        """Source index of edge p of a row (e0, e1, first_src)."""
        e0, _, first = row
        return kb.b.add(first, kb.b.sub(p, e0), flags=["nsw"])

    def ahead_col(self, kb, q) -> ir.Value:
        """Source of edge q, for the prefetch (only walks with gathers=True are asked)."""
        raise CodegenUnsupported(f"the {self.hierarchy} walk has no gathered sources")

    def edges(self, kb, r, row, body) -> None:
        """The row's edge loop, calling body(p, col) (contiguous walks only)."""
        e0, e1, _ = row
        kb.ctx.loop(e0, e1, lambda p: body(p, self.col(kb, p, row)), name="edge")

    def describe(self) -> str:
        return self.hierarchy


class CsrWalk(Walk):
    slots = ("row_ptr", "col_idx")
    gathers = True

    def edge_start(self, kb, r):
        return kb._load_index("row_ptr", r, I64)

    def row(self, kb, r):
        e1 = self.edge_start(kb, kb.b.add(r, i64(1), flags=["nsw"]))
        return self.edge_start(kb, r), e1, None

    def col(self, kb, p, row):
        return kb._load_index("col_idx", p, kb.index_t)

    def ahead_col(self, kb, q):
        return kb._load_index("col_idx", q, kb.index_t)


class DenseWalk(Walk):
    slots = ("walk_params",)     # int64 [num_src]
    hierarchy = "dense"

    def setup(self, kb):
        self.num_src = kb._load_index("walk_params", i64(0), I64)

    def edge_start(self, kb, r):
        return kb.b.mul(r, self.num_src, flags=["nsw"])


class TriangularWalk(Walk):
    hierarchy = "triangular"

    def edge_start(self, kb, r):
        b = kb.b
        return b.ashr(b.mul(r, b.add(r, i64(1), flags=["nsw"]), flags=["nsw"]), i64(1))


class CuSeqlensWalk(Walk):
    # cu_ext: cu_seqlens with its last entry repeated (K + 2 entries), seq_edges: edges
    # before each sequence (K + 1 entries), walk_params: int64 [K]
    slots = ("walk_params", "cu_ext", "seq_edges")
    hierarchy = "cu-seqlens"

    def __init__(self, causal: bool):
        self.causal = causal

    def setup(self, kb):
        self.num_seqs = kb._load_index("walk_params", i64(0), I64)

    def _sequence(self, kb, r):
        """k with cu[k] <= r < cu[k+1] (the last sequence for r = N); 0 when K = 0."""
        b, ctx = kb.b, kb.ctx
        lo = ctx.alloca(I64, 1)
        hi = ctx.alloca(I64, 1)
        last = b.sub(self.num_seqs, i64(1))
        b.store(i64(0), lo)
        b.store(b.select(b.icmp_signed("<", last, i64(0)), i64(0), last), hi)
        head = ctx.fn.append_basic_block("seq.head")
        body = ctx.fn.append_basic_block("seq.body")
        done = ctx.fn.append_basic_block("seq.done")
        b.branch(head)
        b.position_at_end(head)
        lv, hv = b.load(lo, typ=I64), b.load(hi, typ=I64)
        b.cbranch(b.icmp_signed("<", lv, hv), body, done)
        b.position_at_end(body)
        mid = b.ashr(b.add(b.add(lv, hv), i64(1)), i64(1))      # upper middle: lo < mid <= hi
        start = kb._load_index("cu_ext", mid, I64)
        fits = b.icmp_signed("<=", start, r)
        b.store(b.select(fits, mid, lv), lo)
        b.store(b.select(fits, hv, b.sub(mid, i64(1))), hi)
        b.branch(head)
        b.position_at_end(done)
        return b.load(lo, typ=I64)

    def _start(self, kb, r, k):
        b = kb.b
        s0 = kb._load_index("cu_ext", k, I64)
        d = b.sub(r, s0, flags=["nsw"])
        if self.causal:
            within = b.ashr(b.mul(d, b.add(d, i64(1)), flags=["nsw"]), i64(1))
        else:
            length = b.sub(kb._load_index("cu_ext", b.add(k, i64(1)), I64), s0)
            within = b.mul(d, length, flags=["nsw"])
        return b.add(kb._load_index("seq_edges", k, I64), within, flags=["nsw"]), s0

    def edge_start(self, kb, r):
        return self._start(kb, r, self._sequence(kb, r))[0]

    def row(self, kb, r):
        b = kb.b
        k = self._sequence(kb, r)
        e0, s0 = self._start(kb, r, k)
        if self.causal:
            e1 = b.add(e0, b.add(b.sub(r, s0), i64(1)), flags=["nsw"])
        else:
            e1 = b.add(e0, b.sub(kb._load_index("cu_ext", b.add(k, i64(1)), I64), s0),
                       flags=["nsw"])
        return e0, e1, s0


class StencilWalk(Walk):
    hierarchy = "stencil"
    contiguous = False
    slots = ()

    def __init__(self, shape: tuple, offsets: tuple, periodic: bool):
        self.shape, self.offsets, self.periodic = tuple(shape), tuple(offsets), periodic
        self.strides = _strides(self.shape)

    def edge_start(self, kb, r):
        if self.periodic:
            return kb.b.mul(r, i64(len(self.offsets)), flags=["nsw"])
        return stencil_edge_start(kb.b, _coords(kb.b, r, self.shape, self.strides),
                                  self.shape, self.offsets)

    def row(self, kb, r):
        b = kb.b
        e0 = self.edge_start(kb, r)
        if self.periodic:
            return e0, b.add(e0, i64(len(self.offsets)), flags=["nsw"]), None
        coords = _coords(b, r, self.shape, self.strides)
        e1 = e0
        for off in self.offsets:   # (the row's degree: its inside neighbours)
            ok = ir.Constant(I1, 1)
            for x, o, n in zip(coords, off, self.shape):
                c = b.add(x, i64(o), flags=["nsw"])
                ok = b.and_(ok, b.and_(b.icmp_signed(">=", c, i64(0)),
                                       b.icmp_signed("<", c, i64(n))))
            e1 = b.add(e1, b.zext(ok, I64))
        return e0, e1, None

    def edges(self, kb, r, row, body) -> None:
        b, ctx = kb.b, kb.ctx
        e0 = row[0]
        coords, rest = [], r
        for n, s in zip(self.shape, self.strides):
            q = b.sdiv(rest, i64(s)) if s != 1 else rest
            coords.append(b.srem(q, i64(n)) if n != 0 else q)
        counter = ctx.alloca(I64, 1)
        b.store(e0, counter)
        for off in self.offsets:
            col, inside = i64(0), ir.Constant(I1, 1)
            for x, o, n, s in zip(coords, off, self.shape, self.strides):
                c = b.add(x, i64(o), flags=["nsw"])
                if self.periodic:
                    # (x + o) mod n for any static o: shift into [0, 2n) first
                    c = b.srem(b.add(c, i64(n * (abs(o) // max(n, 1) + 1))), i64(n))
                else:
                    ok = b.and_(b.icmp_signed(">=", c, i64(0)), b.icmp_signed("<", c, i64(n)))
                    inside = b.and_(inside, ok)
                col = b.add(col, b.mul(c, i64(s)) if s != 1 else c)
            take = ctx.fn.append_basic_block("stencil.edge")
            nxt = ctx.fn.append_basic_block("stencil.next")
            b.cbranch(inside, take, nxt)
            b.position_at_end(take)
            p = b.load(counter, typ=I64)
            body(p, col)
            b.store(b.add(p, i64(1), flags=["nsw"]), counter)
            b.branch(nxt)
            b.position_at_end(nxt)


def _strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _coords(b, r, shape: tuple, strides: tuple) -> list:
    """Lattice coordinates of point r; the first is not reduced, so r = N gives (n0, 0..)."""
    out = []
    for axis, (n, s) in enumerate(zip(shape, strides)):
        q = b.sdiv(r, i64(s)) if s != 1 else r
        out.append(b.srem(q, i64(n)) if axis > 0 else q)
    return out


def stencil_edge_start(b, coords: list, shape: tuple, offsets: tuple) -> ir.Value:
    """Edges of a non-periodic stencil before point `coords` (C order): per offset, the
    points of its inside box [lo, hi) that come first, counted axis by axis (the points that
    agree on the earlier axes, lie in the box there and are smaller on this one)."""
    total = i64(0)
    for off in offsets:
        lo = [max(0, -o) for o in off]
        size = [max(0, n - abs(o)) for n, o in zip(shape, off)]
        if 0 in size:
            continue
        same = ir.Constant(I1, 1)
        for axis, x in enumerate(coords):
            rest = 1
            for m in size[axis + 1:]:
                rest *= m
            before = b.sub(x, i64(lo[axis]))
            before = b.select(b.icmp_signed("<", before, i64(0)), i64(0), before)
            before = b.select(b.icmp_signed(">", before, i64(size[axis])), i64(size[axis]),
                              before)
            term = b.mul(before, i64(rest)) if rest != 1 else before
            total = b.add(total, b.select(same, term, i64(0)))
            inside = b.and_(b.icmp_signed(">=", x, i64(lo[axis])),
                            b.icmp_signed("<", x, i64(lo[axis] + size[axis])))
            same = b.and_(same, inside)
    return total
