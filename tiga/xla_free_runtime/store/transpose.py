"""runtime: the transposed relation of a store, built out of core once and stored beside it.

Source-field cotangents (and any propagate grouped by source) walk the relation by source.
The transposed CSR (row_ptr over sources, the destination of each edge, and each edge's id
in the stored CSR order) is built by a bounded-memory external sort keyed by source id:

1. one pass over the column chunks counts each source's out-degree, so the transposed
   row_ptr is known and the sources split into ranges ("buckets") of at most `bucket_edges`
   edges each;
2. one pass over CSR pages distributes each (source, destination, edge id) triple to its
   bucket's run file on disk;
3. each bucket is loaded, stably sorted by source in memory (within a source the edges stay
   in stored order) and appended to the transposed arrays.

Memory is one page plus one bucket plus the degree counts (8 bytes a source). The result is
a new store version: the current version's files hard-linked (copied where links fail), the
transposed arrays and a manifest naming them, committed by the same atomic pointer switch.
Its number is claimed like an ingest's (store_versions), so a writer committing meanwhile
never shares it; when the base version stops being the store's (a newer commit, which may
prune it) the build fails with a StorageError and removes what it wrote.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ...core.errors import StorageError
from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers.files import fsync_tree
from ..reports.progress import progress_bar
from . import versions as sv
from .ingest import Appender

BUCKET_EDGES = 1 << 23       # edges sorted in memory at once without a host budget
TRANSPOSE = "transpose"


def bucket_edges(index_itemsize: int) -> int:
    """Edges per in-memory sort: a quarter of the host budget left, at most BUCKET_EDGES."""
    owner = sc.budget_scope("host")
    per_edge = 3 * (2 * index_itemsize + 8)      # the triple, its sort order, the outputs
    if owner is None:
        return BUCKET_EDGES
    room = owner.budgets["host"] - owner.used["host"]
    return int(max(1 << 12, min(BUCKET_EDGES, room // (4 * per_edge))))


def out_degrees(store, step: int, bar=None) -> np.ndarray:
    """int64 out-degree per source, one column chunk range at a time (bincount over the
    chunk's own id span, so a pass costs edges + spans, not chunks x sources)."""
    counts = np.zeros(store.num_src, np.int64)
    for a in range(0, store.num_edges, step):
        ci = store._col.read_rows(a, min(a + step, store.num_edges))
        if len(ci):
            lo = int(ci.min())
            part = np.bincount(ci - lo if lo else ci)
            counts[lo:lo + len(part)] += part
        if bar is not None:
            bar.update(len(ci))
    return counts


def build(store):
    """Build the transposed relation of `store` (a committed Store) as a new version and
    return the Store of it (or of the same relation's transposed version another process
    committed meanwhile)."""
    path = store.path
    claim = sv.claim(path)
    vdir, twin = claim.vdir, None
    try:
        try:
            _link_tree(store.vdir, vdir)
            arrays = _sorted_runs(store, vdir / TRANSPOSE)
            fsync_tree(vdir)
        except OSError as exc:
            twin = _check_base(store, exc)
            if twin is None and isinstance(exc, StorageError):
                raise
            if twin is None:
                raise StorageError(f"{vdir}: building the transposed relation failed "
                                   f"({exc})") from exc
        if twin is None:
            manifest = dict(store.manifest, version=claim.number, transpose=arrays)
            with sv.locked(path):
                twin = _check_base(store, None)
                if twin is None:
                    sv.write_atomic(vdir / sv.MANIFEST, sv.with_checksum(manifest))
                    sv.switch(path, vdir.name)
    except BaseException:
        shutil.rmtree(vdir, ignore_errors=True)
        raise
    finally:
        claim.release()
    if twin is not None:
        shutil.rmtree(vdir, ignore_errors=True)
        return twin
    return type(store)(path, vdir.name)


def _check_base(store, exc):
    """None while `store`'s version is still the store's. When another process committed
    the transposed relation of the same version meanwhile, that version's Store. Else a
    StorageError: a commit replaced the version (and may have pruned its files under the
    build)."""
    path, base = store.path, store.vdir.name
    now = sv.current(path)
    if now == base:
        return None
    try:
        other = type(store)(path, now) if now is not None else None
    except StorageError:
        other = None
    if (other is not None and other.transposed is not None and
            _relation_of(other.manifest) == _relation_of(store.manifest)):
        return other
    raise StorageError(f"{path}: version {base} was replaced by {now} while its transposed "
                       "relation was built (its files may be pruned); open the store "
                       "again") from exc


def _relation_of(manifest: dict) -> dict:
    """A manifest without what a transposed build adds (the same relation, fields and
    chunk checksums: the build links the base version's files)."""
    return {k: v for k, v in manifest.items() if k not in ("version", "transpose")}


def _link_tree(src: Path, dst: Path) -> None:
    """The version's files under a new version directory (hard links: no bytes copied)."""
    def fail(exc):
        raise exc
    for root, _, files in os.walk(src, onerror=fail):
        rel = Path(root).relative_to(src)
        if rel.parts and rel.parts[0] == TRANSPOSE:
            continue
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            if rel == Path(".") and name.startswith(("manifest", ".")):
                continue
            try:
                os.link(Path(root) / name, dst / rel / name)
            except OSError:
                shutil.copy2(Path(root) / name, dst / rel / name)


def _sorted_runs(store, out: Path) -> dict:
    idx = store.index_dtype
    # (edge ids below 2**31 travel through the run files as int32: a quarter less I/O)
    triple = np.dtype([("s", idx), ("d", idx),
                       ("e", np.int32 if store.num_edges < 2 ** 31 else np.int64)])
    limit = bucket_edges(idx.itemsize)
    ch = memory.charge("host", store.num_src * 8 + 3 * limit * triple.itemsize,
                       "transpose build")
    # three passes over the edges: count per source, distribute to runs, sort the runs
    bar = progress_bar(3 * store.num_edges, "tg.store transpose (3 passes)", "edges")
    try:
        counts = out_degrees(store, limit, bar)
        out.mkdir()
        row_ptr = Appender(out / "row_ptr", np.int64, ())
        row_ptr.append(np.zeros(1, np.int64))
        total = 0
        for a in range(0, len(counts), 1 << 20):
            piece = np.cumsum(counts[a:a + (1 << 20)]) + total
            row_ptr.append(piece)
            total = int(piece[-1])
        starts = _bucket_starts(counts, limit)
        del counts
        runs = _distribute(store, out / "runs", starts, triple, limit, bar)
        col = Appender(out / "col_idx", idx, ())
        perm = Appender(out / "edge_perm", np.int64, ())
        _sort_runs(runs, triple, col, perm, bar)
        shutil.rmtree(out / "runs", ignore_errors=True)
        return {"row_ptr": row_ptr.finish(), "col_idx": col.finish(),
                "edge_perm": perm.finish()}
    finally:
        ch.credit()
        if bar is not None:
            bar.close()


def _sort_runs(runs: list, triple: np.dtype, col, perm, bar) -> None:
    """Pass 3: each run (the edges of a range of sources, in stored order) sorted by source
    and appended to the transposed column ids and edge permutation; its files removed."""
    for run in runs:
        src, dst, eid = (np.fromfile(run.with_suffix(f".{f}"), dtype=triple[f])
                         for f in "sde")
        order = np.argsort(src, kind="stable")
        col.append(dst[order])
        perm.append(eid[order])
        for f in "sde":
            os.remove(run.with_suffix(f".{f}"))
        if bar is not None:
            bar.update(len(src))


BLOCK_SHIFT = 6     # buckets start at multiples of 64 sources: a source's bucket is a lookup


def _bucket_starts(counts: np.ndarray, limit: int) -> np.ndarray:
    """First source of each bucket: contiguous ranges of whole 64-source blocks of at most
    `limit` edges (a block with more edges than that is a bucket of its own)."""
    per_block = (np.add.reduceat(counts, np.arange(0, len(counts), 1 << BLOCK_SHIFT))
        if len(counts) else np.zeros(0, np.int64))
    ends = np.cumsum(per_block)
    starts, at, n = [0], 0, len(per_block)
    while at < n:
        base = int(ends[at - 1]) if at else 0
        nxt = int(np.searchsorted(ends, base + limit, side="right"))
        at = max(nxt, at + 1)
        if at < n:
            starts.append(at << BLOCK_SHIFT)
    return np.asarray(starts, np.int64)


def _distribute(store, runs: Path, starts: np.ndarray, triple: np.dtype, limit: int,
                bar) -> list:
    """Pass 2: every edge's triple appended to its bucket's run file, in stored order."""
    runs.mkdir()
    files = [runs / f"{k:06d}" for k in range(len(starts))]
    for f in files:             # one file per field: contiguous arrays, not strided records
        for field in "sde":
            f.with_suffix(f".{field}").touch()
    blocks = (store.num_src >> BLOCK_SHIFT) + 1
    bounds = np.append(starts >> BLOCK_SHIFT, blocks)
    key = np.uint16 if len(starts) < 1 << 16 else np.int64    # (16-bit keys: a radix sort)
    bucket_of = np.repeat(np.arange(len(starts), dtype=key), np.diff(bounds))
    rows = max(1, limit // max(1, store.num_edges // max(store.num_dst, 1) + 1))
    for a in range(0, store.num_dst, rows):
        b = min(store.num_dst, a + rows)
        rp, ci, lo = store.read_rows(a, b)
        which = bucket_of[ci >> BLOCK_SHIFT]
        order = np.argsort(which, kind="stable")
        which = which[order]
        eid = order.astype(triple["e"])
        eid += lo               # (an edge's stored id is its position in the pages' order)
        fields = {"s": ci[order], "e": eid,
                  "d": np.repeat(np.arange(a, b, dtype=triple["d"]), np.diff(rp))[order]}
        cuts = np.searchsorted(which, np.arange(len(starts) + 1, dtype=which.dtype))
        for k in np.flatnonzero(np.diff(cuts)):
            for f, arr in fields.items():
                with open(files[k].with_suffix(f".{f}"), "ab") as fh:
                    arr[cuts[k]:cuts[k + 1]].tofile(fh)
        if bar is not None:
            bar.update(len(ci))
    return files
