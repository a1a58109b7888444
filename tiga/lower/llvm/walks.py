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

Walks by source (the transposed relation) are in walks_transposed.py; the Walk interface
and what both directions share (the cu-seqlens sequence search, lattice coordinates, a
stencil's edge ids) in walk_base.py.

A walk names the pointer slots it needs (`slots`), computes `edge_start(r)` for any
r in [0, N] (so `edge_start(end) - edge_start(begin)` counts a chunk's edges), and emits
the row's edge loop, calling `body(p, col)` with the edge id p and source index col.
"""
from __future__ import annotations

from llvmlite import ir

from ..abi import TRANSPOSED_KINDS
from .values import I1, I64, CodegenUnsupported, i64
from .walk_base import CuSeqlensWalk, Walk, _coords, _strides, stencil_edge_start
from .walks_transposed import transposed_walk


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
        return transposed_walk(descriptor)
    raise CodegenUnsupported(f"relation walk {descriptor!r} has no cpu-llvm lowering")


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

    lane_folds = True        # edges(..., lanes=True) names each offset's index k

    def _interior(self, b, coords):
        """Whether every offset of the point at `coords` lands inside the lattice (then no
        offset is skipped or wrapped)."""
        inside = ir.Constant(I1, 1)
        for axis, (x, n) in enumerate(zip(coords, self.shape)):
            lo = max(0, -min((off[axis] for off in self.offsets), default=0))
            hi = n - max(0, max((off[axis] for off in self.offsets), default=0))
            if lo > 0:
                inside = b.and_(inside, b.icmp_signed(">=", x, i64(lo)))
            inside = b.and_(inside, b.icmp_signed("<", x, i64(hi)))
        return inside

    def _point(self, b, r) -> list:
        """Coordinates of point r (every axis reduced)."""
        coords, rest = [], r
        for n, s in zip(self.shape, self.strides):
            q = b.sdiv(rest, i64(s)) if s != 1 else rest
            coords.append(b.srem(q, i64(n)) if n != 0 else q)
        return coords

    def row_runs(self, kb, begin, end, single, run) -> None:
        """Rows [begin, end) in order: each run of interior points along the last axis as
        run(r0, r1) (one line's, at most to `end`), every other point as single(r)."""
        b, ctx = kb.b, kb.ctx
        last = max(0, self.shape[-1] - max(0, max(off[-1] for off in self.offsets)))
        cursor = ctx.alloca(I64, 1)
        b.store(begin, cursor)
        head, body, runs, one, done = (ctx.fn.append_basic_block(f"stencil.{x}") for x in
                                       ("rows", "point", "run", "single", "rows.done"))
        b.branch(head)
        b.position_at_end(head)
        r = b.load(cursor, typ=I64)
        b.cbranch(b.icmp_signed("<", r, end), body, done)
        b.position_at_end(body)
        coords = self._point(b, r)
        b.cbranch(self._interior(b, coords), runs, one)
        b.position_at_end(runs)
        stop = b.add(r, b.sub(i64(last), coords[-1]), flags=["nsw"])
        stop = b.select(b.icmp_signed("<", stop, end), stop, end)
        run(r, stop)
        b.store(stop, cursor)
        b.branch(head)
        b.position_at_end(one)
        single(r)
        b.store(b.add(r, i64(1), flags=["nsw"]), cursor)
        b.branch(head)
        b.position_at_end(done)

    def edges(self, kb, r, row, body, lanes: bool = False) -> None:
        """The row's offsets in order, body(p, col) (body(p, col, k) with `lanes`, k the
        offset's index, so a reassociable fold may spread them over accumulators). A point
        whose every neighbour is inside (the bulk of a lattice) takes a branch-free copy of
        the loop: edge ids e0 + k and sources r + (the offset's constant stride sum)."""
        b, ctx = kb.b, kb.ctx
        e0 = row[0]
        coords = self._point(b, r)
        call = body if lanes else (lambda p, col, k: body(p, col))
        fast = ctx.fn.append_basic_block("stencil.interior")
        slow = ctx.fn.append_basic_block("stencil.boundary")
        done = ctx.fn.append_basic_block("stencil.done")
        b.cbranch(self._interior(b, coords), fast, slow)
        b.position_at_end(fast)
        for k, off in enumerate(self.offsets):
            delta = sum(o * s for o, s in zip(off, self.strides))
            p = b.add(e0, i64(k), flags=["nsw"]) if k else e0
            call(p, b.add(r, i64(delta), flags=["nsw"]) if delta else r, k)
        b.branch(done)
        b.position_at_end(slow)
        counter = ctx.alloca(I64, 1)
        b.store(e0, counter)
        for k, off in enumerate(self.offsets):
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
            call(p, col, k)
            b.store(b.add(p, i64(1), flags=["nsw"]), counter)
            b.branch(nxt)
            b.position_at_end(nxt)
        b.branch(done)
        b.position_at_end(done)
