"""lower/llvm: the Walk interface (walks.py names each walk) and the pieces the walks by
destination (walks.py) and by source (walks_transposed.py) share: the cu-seqlens walk (its
sequence search; CuSeqlensTransposed extends it), lattice coordinates and the edge ids of
a non-periodic stencil.
"""
from __future__ import annotations

from llvmlite import ir

from .values import I1, I64, CodegenUnsupported, i64


class Walk:
    slots: tuple = ()
    hierarchy = "compressed-row"
    gathers = False          # sources are random gathers worth a software prefetch
    contiguous = True        # a row's edges are one id range walked in order
    lane_folds = False       # edges(..., lanes=True) calls body(p, col, k) (k: the edge's
                             # position in a static pattern: the fold's accumulator k % lanes)

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
