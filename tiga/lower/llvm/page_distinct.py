"""lower/llvm: the distinct-row remap of a page as one native kernel (issue 28 item 1).

A page of a paged propagate reads each distinct source row once: its column ids become the
sorted distinct ids (`uniq`) and each id's position among them (`inv`). numpy needs about ten
passes and as many temporary arrays for it (a count, its non-zeros, a remap table, a gather);
this kernel makes four passes over memory the caller owns and reuses:

    page_distinct(0, 0, argv), argv = [ids, n, lo, span, mark, uniq, inv, count]

    mark[0:span] = 0                                  (mark: `span` scratch entries)
    mark[ids[e] - lo] = 1            for e < n
    k = 0; for s < span: if mark[s]: mark[s] = k; uniq[k] = s + lo; k += 1
    inv[e] = mark[ids[e] - lo]       for e < n        (inv may be ids itself: in place)
    count[0] = k

`ids`, `mark` and `inv` share one integer type (int32 or int64: the relation's index dtype);
`uniq` is int64; every id lies in [lo, lo + span) (the caller's min and max). The kernel
takes the executable cache's calling convention `(begin, end, argv)`; begin and end are
unused (one call per page: the prefetch threads already run pages in parallel).
"""
from __future__ import annotations

from llvmlite import ir

from .values import I64, PTR, i64

BITS = (32, 64)


def _loop(b: ir.IRBuilder, fn: ir.Function, n, body, name: str) -> None:
    """for (i = 0; i < n; i++) body(b, i), leaving `b` after the loop."""
    before = b.block
    head, step, done = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=f"{name}.i")
    i.add_incoming(i64(0), before)
    b.cbranch(b.icmp_signed("<", i, n), step, done)
    b.position_at_end(step)
    body(b, i)
    i.add_incoming(b.add(i, i64(1)), b.block)
    b.branch(head)
    b.position_at_end(done)


def emit(symbol: str, bits: int) -> str:
    """LLVM IR text of `page_distinct` for ids of `bits` bits, named `symbol`."""
    if bits not in BITS:
        raise ValueError(f"page_distinct: ids of {bits} bits (expected one of {BITS})")
    module = ir.Module(name=symbol)
    idx = ir.IntType(bits)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, I64, PTR]), symbol)
    fn.args[2].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = fn.args[2]

    def arg(k: int, typ=PTR):
        return b.load(b.gep(argv, [i64(k)], source_etype=PTR), typ=typ)

    ids, n, lo, span = arg(0), arg(1, I64), arg(2, I64), arg(3, I64)
    mark, uniq, inv, count = arg(4), arg(5), arg(6), arg(7)

    def at(base, e, typ=idx):
        return b.gep(base, [e], source_etype=typ)

    def slot(e):           # &mark[ids[e] - lo]
        v = b.load(at(ids, e), typ=idx)
        return at(mark, b.sub(b.sext(v, I64) if bits < 64 else v, lo))

    _loop(b, fn, span, lambda b, s: b.store(ir.Constant(idx, 0), at(mark, s)), "clear")
    _loop(b, fn, n, lambda b, e: b.store(ir.Constant(idx, 1), slot(e)), "mark")
    k = b.alloca(I64, name="k")
    b.store(i64(0), k)

    def rank(b, s):
        p = at(mark, s)
        with b.if_then(b.icmp_signed("!=", b.load(p, typ=idx), ir.Constant(idx, 0))):
            r = b.load(k, typ=I64)
            b.store(b.trunc(r, idx) if bits < 64 else r, p)
            b.store(b.add(s, lo), at(uniq, r, I64))
            b.store(b.add(r, i64(1)), k)

    _loop(b, fn, span, rank, "rank")
    _loop(b, fn, n, lambda b, e: b.store(b.load(slot(e), typ=idx), at(inv, e)), "remap")
    b.store(b.load(k, typ=I64), count)
    b.ret_void()
    return str(module)


__all__ = ["emit", "BITS"]
