"""lower/triton: walks by source (the transposed relation) of implicit relations, computed as
their forward walks are: no CSR, no transpose (lower/llvm/walks_transposed.py is the same
walk for cpu-llvm).

- ("dense_t",): the transpose of dense(S, D) is dense(D, S): row r (a source) reads
  destinations 0..D-1, edge d*S + r (walk_params = [S, D]).
- ("triangular_t",): row r is read by destinations r..n-1 (an upper triangular walk), edge
  d(d+1)/2 + r (walk_params = [n]).
- ("cu_seqlens_t", causal): block-diagonal, itself with src/dst swapped: row r of sequence k
  (binary search over cu_ext) is read by r..cu[k+1]-1 (causal) or cu[k]..cu[k+1]-1.
- ("stencil_t", shape, offsets, periodic): point r is read by p = r - offset (the stencil
  with negated offsets; outside ones masked, or wrapped when periodic). Edge ids p*K + j
  (periodic) or the edges before p (a closed form over the lattice) plus p's inside
  neighbours before offset j.
- ("csr_rows",): a stored relation whose sources are sparse (lower/schedule.py's
  sparse_sources): its transposed CSR over the sources with edges only (row_ids, row_ptr,
  col_idx, edge_perm: every array sized by the edges); row r finds its edges by a binary
  search over row_ids.

Each walk emits `e0`, `e1` (a destination range, or for stencils 0..degree) in the row and
`valid`, `col` (the destination) and `eid` per neighbour tile, as walks.py's walks do.
"""
from __future__ import annotations


def transposed_slots(relation: tuple) -> tuple:
    kind = relation[0]
    if kind == "csr_rows":
        return ("row_ptr", "col_idx", "row_ids", "walk_params")
    if kind in ("dense_t", "triangular_t"):
        return ("walk_params",)
    if kind == "cu_seqlens_t":
        return ("walk_params", "cu_ext", "seq_edges")
    return ("stencil_offsets",)


def emit_transposed_row(c, relation: tuple) -> None:
    kind = relation[0]
    if kind == "dense_t":
        c.emit("n_src = tl.load(walk_params)")
        c.emit("e0 = rr * 0")
        c.emit("e1 = tl.where(live, tl.load(walk_params + 1), e0)")
    elif kind == "triangular_t":
        c.emit("e0 = rr")
        c.emit("e1 = tl.where(live, tl.load(walk_params), e0)")
    elif kind == "csr_rows":
        _emit_rows_row(c)
    elif kind == "cu_seqlens_t":
        emit_sequence(c)
        c.emit("s1 = tl.load(cu_ext + lo + 1)")
        c.emit("seq0 = tl.load(seq_edges + lo)")
        c.emit("e0 = rr" if relation[1] else "e0 = s0")
        c.emit("e1 = tl.where(live, s1, e0)")
    else:
        _emit_stencil_row(c, relation)


def _emit_rows_row(c) -> None:
    """Row rr's edges in a transposed CSR stored over the sources with edges: the first k
    with row_ids[k] >= rr by binary search; rows without edges get none."""
    c.emit("n_ids = tl.load(walk_params)")
    c.emit("lo = rr * 0")
    c.emit("hi = lo + n_ids")
    c.emit("while lo < hi:")
    c.emit("    mid = (lo + hi) // 2")
    c.emit("    go = tl.load(row_ids + mid) < rr")
    c.emit("    lo = tl.where(go, mid + 1, lo)")
    c.emit("    hi = tl.where(go, hi, mid)")
    c.emit("ok = lo < n_ids")
    c.emit("hit = ok & (tl.load(row_ids + lo, mask=ok, other=-1) == rr)")
    c.emit("e0 = tl.where(hit, tl.load(row_ptr + lo, mask=ok, other=0), 0)")
    c.emit("e1 = tl.where(hit & live, tl.load(row_ptr + lo + 1, mask=ok, other=0), e0)")


def _emit_stencil_row(c, relation: tuple) -> None:
    _, shape, offsets, periodic = relation
    emit_coords(c, shape)
    c.emit("e0 = rr * 0")
    if periodic:
        c.emit(f"e1 = tl.where(live, e0 + {len(offsets)}, e0)")
        return
    names = [f"coord{a}" for a in range(len(shape))]
    c.emit("deg = rr * 0")
    for off in offsets:   # readers p = r - off inside the lattice
        c.emit(f"deg = deg + ({inside_test(names, shape, [-o for o in off])}).to(tl.int64)")
    c.emit("e1 = tl.where(live, deg, e0)")


def emit_sequence(c) -> None:
    """`lo`: the sequence of row rr, `s0` its first index (the cu_seqlens walks of both
    directions)."""
    # the last sequence k with cu[k] <= r (empty sequences repeat an offset: the last one
    # holding r is the one it belongs to)
    c.emit("lo = rr * 0")
    c.emit("hi = lo + tl.load(walk_params) - 1")
    c.emit("while lo < hi:")
    c.emit("    mid = (lo + hi + 1) // 2")
    c.emit("    go = tl.load(cu_ext + mid) <= rr")
    c.emit("    lo = tl.where(go, mid, lo)")
    c.emit("    hi = tl.where(go, hi, mid - 1)")
    c.emit("s0 = tl.load(cu_ext + lo)")


def emit_coords(c, shape: tuple) -> None:
    """`coord0`, `coord1`, ...: the lattice coordinates of point `rr` (C order)."""
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        c.emit(f"coord{axis} = (rr // {stride}) % {shape[axis]}")
        stride *= shape[axis]


def emit_neighbours(c, shape: tuple, k: int, periodic: bool, sign: str) -> None:
    """Per lane j of a neighbour tile (offset j of `k`): `q0`, `q1`, ... = `coord*` `sign`
    the offset (a stencil's neighbours add it, its transpose's readers subtract it), wrapped
    when periodic, else `valid` drops the points outside the lattice; `col` is that point
    (C order, 0 where not valid)."""
    rank = len(shape)
    c.emit("j = start + nb")
    c.emit(f"valid = (j < {k}) & live")
    c.emit("col = (j * 0).to(tl.int64)")
    stride = 1
    for axis in range(rank - 1, -1, -1):
        n, q = shape[axis], f"q{axis}"
        c.emit(f"off = tl.load(stencil_offsets + j * {rank} + {axis}, mask=valid, other=0)")
        if periodic:   # (x +- o) mod n for any offset: Python-style modulo on int64
            c.emit(f"{q} = (coord{axis} {sign} off) % {n}")
            c.emit(f"{q} = tl.where({q} < 0, {q} + {n}, {q})")
        else:
            c.emit(f"{q} = coord{axis} {sign} off")
            c.emit(f"valid = valid & ({q} >= 0) & ({q} < {n})")
        c.emit(f"col = col + {q} * {stride}")
        stride *= n
    c.emit("col = tl.where(valid, col, 0)")


def inside_test(names: list, shape: tuple, off) -> str:
    """The Triton test that point `names` + off lies in the lattice."""
    return " & ".join(f"({x} + {o} >= 0) & ({x} + {o} < {n})"
                      for x, o, n in zip(names, off, shape)) or "True"


def emit_edge_start(c, names: list, shape: tuple, offsets: tuple, out: str) -> None:
    """`out` = the edges of a non-periodic stencil before point `names` (C order): per
    offset, the points of its inside box that come first, axis by axis."""
    c.emit(f"{out} = {names[0] if names else '0'} * 0")
    for off in offsets:
        size = [max(0, n - abs(o)) for n, o in zip(shape, off)]
        if 0 in size:
            continue
        c.emit(f"same = {names[0]} >= 0" if names else "same = True")
        for a, o in enumerate(off):
            lo, rest = max(0, -o), 1
            for m in size[a + 1:]:
                rest *= m
            c.emit(f"before = tl.minimum(tl.maximum({names[a]} - {lo}, 0), {size[a]})")
            c.emit(f"{out} = {out} + tl.where(same, before * {rest}, 0)")
            c.emit(f"same = same & ({names[a]} >= {lo}) & ({names[a]} < {lo + size[a]})")


def emit_transposed_tile(c, relation: tuple) -> None:
    kind = relation[0]
    if kind == "stencil_t":
        _emit_stencil_tile(c, relation)
        return
    c.emit("p = start + nb")
    if kind == "csr_rows":   # (stored rows: a transposed CSR's columns and permutation)
        c.emit("valid = p < e1")
        c.emit("col = tl.load(col_idx + p, mask=valid, other=0).to(tl.int64)")
        c.emit("eid = tl.load(edge_perm + p, mask=valid, other=0).to(tl.int64)")
        return
    c.emit("valid = p < e1")
    c.emit("col = tl.where(valid, p, 0)")
    if kind == "dense_t":
        c.emit("eid = tl.where(valid, p * n_src + rr, 0)")
    elif kind == "triangular_t":
        c.emit("eid = tl.where(valid, p * (p + 1) // 2 + rr, 0)")
    elif relation[1]:   # causal: destination p's row holds sources s0..p
        c.emit("eid = tl.where(valid, seq0 + (p - s0) * (p - s0 + 1) // 2 + (rr - s0), 0)")
    else:
        c.emit("eid = tl.where(valid, seq0 + (p - s0) * (s1 - s0) + (rr - s0), 0)")


def _emit_stencil_tile(c, relation: tuple) -> None:
    _, shape, offsets, periodic = relation
    k = len(offsets)
    emit_neighbours(c, shape, k, periodic, "-")   # readers p = r - offset
    if periodic:
        c.emit(f"eid = tl.where(valid, col * {k} + j, 0)")
        return
    names = [f"q{a}" for a in range(len(shape))]
    emit_edge_start(c, names, shape, offsets, "eid")
    for i, off in enumerate(offsets):   # the reader's inside neighbours before offset j
        c.emit(f"eid = eid + (({inside_test(names, shape, off)}) & (j > {i})).to(tl.int64)")
    c.emit("eid = tl.where(valid, eid, 0)")
