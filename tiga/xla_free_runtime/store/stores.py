"""runtime: persistent graph stores: bounded-memory ingest, atomic versioned commits.

Layout of a store at `path`:

    path/CURRENT              the committed version's directory name (one line)
    path/v000001/manifest.json   counts, dtypes, fields, every chunk's crc32c, a checksum
                                 of itself; written last
    path/v000001/row_ptr      zarr v3 int64 [num_dst + 1]
    path/v000001/col_idx      zarr v3 index dtype [num_edges]
    path/v000001/fields/<name>   zarr v3 [rows, ...]

A commit writes a whole new version directory, fsyncs it, writes the manifest, and then
atomically replaces CURRENT (write a temp file, fsync, rename). Until that rename the
previous version is the store; a killed ingest leaves only an unreferenced directory.
Version numbers are claimed, and old versions pruned, under a lock (store_versions), so an
ingest and a transposed build running at once never share a number. A reader checks every
chunk against the crc32c its version's manifest records.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from pathlib import Path

import numpy as np

from ...core.dtypes import as_dtype
from ...core.errors import GraphValidationError, StorageError
from ...core.graph import store_hooks
from ..memory.tiers.disk import DiskStorage
from ..memory.tiers.files import fsync_tree, read_small
from ..reports.progress import progress_bar
from . import versions as sv
from .ingest import Appender, check_csr_chunk, check_field_rows
from .versions import MANIFEST, POINTER

FORMAT = "tiga-store/2"
# (format 1, before chunk checksums in the manifest, is still read, without that check)
FORMATS = ("tiga-store/1", FORMAT)
ROLES = ("src", "dst", "edge")


class StoreWriter:
    """`tg.store.create(...)`: appends CSR chunks and field rows into a new version; commit()
    makes it the store's version, abort() (or an exception in a with block) discards it."""

    def __init__(self, path, num_src: int, num_dst: int, index_dtype="int32",
                 overwrite: bool = False):
        self.path = sv.store_path(path, "create")
        self.num_src = _count(num_src, "num_src")
        self.num_dst = _count(num_dst, "num_dst")
        self.index_dtype = as_dtype(index_dtype).np
        if self.index_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise GraphValidationError(f"index_dtype: is {index_dtype!r}, expected 'int32' "
                                       "or 'int64'")
        if self.index_dtype == np.int32 and self.num_src > np.iinfo(np.int32).max:
            raise GraphValidationError(f"index_dtype: int32 cannot hold source ids up to "
                                       f"num_src={self.num_src}; use 'int64'")
        self._claimed = self._claim(overwrite)
        self.version, self.vdir = self._claimed.number, self._claimed.vdir
        self._row_ptr = Appender(self.vdir / "row_ptr", np.int64, ())
        self._row_ptr.append(np.zeros(1, np.int64))
        self._col = Appender(self.vdir / "col_idx", self.index_dtype, ())
        self._fields: dict = {}
        self._rows = self._edges = self._chunks = 0
        self._done = False
        self._bar = progress_bar(self.num_dst, "tg.store ingest", "rows")

    def _claim(self, overwrite: bool) -> sv.Claim:
        p = self.path
        if p.exists() and not p.is_dir():
            raise StorageError(f"{p}: exists and is not a directory; expected a store path")
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{p}: cannot create the store directory ({exc})") from exc
        current = sv.current(p)
        if current is not None and not overwrite:
            raise StorageError(f"{p}: a committed store exists (version {current}); pass "
                               "overwrite=True to write a new version")
        if current is None and any(p.iterdir()) and not sv.versions(p):
            raise StorageError(f"{p}: directory is not empty and holds no store; refusing "
                               "to write into it")
        return sv.claim(p)

    # ---- appends ---------------------------------------------------------------------------

    def append_csr_chunk(self, row_ptr_chunk, col_chunk) -> None:
        """The next destination rows: `row_ptr_chunk` local (starts at 0, one more entry
        than rows), `col_chunk` their source ids in edge order."""
        self._live()
        rp, ci = check_csr_chunk(row_ptr_chunk, col_chunk, self._chunks, self._rows,
                                 self.num_dst, self.num_src, self.index_dtype)
        self._row_ptr.append(rp[1:] + self._edges)
        self._col.append(ci)
        self._rows += len(rp) - 1
        self._edges += len(ci)
        self._chunks += 1
        if self._bar is not None:
            self._bar.update(len(rp) - 1)

    def append_field(self, name: str, rows, role: str = "src") -> None:
        """The next rows of field `name` (role "src", "dst" or "edge", in that role's
        order; edge fields in CSR edge order)."""
        self._live()
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise GraphValidationError(f"append_field: name {name!r} must be an identifier")
        if role not in ROLES:
            raise GraphValidationError(f"append_field: role of field {name!r} is {role!r}, "
                                       f"expected one of {', '.join(ROLES)}")
        found = self._fields.get(name)
        rows = check_field_rows(name, rows, role, found)
        if found is None:
            (self.vdir / "fields").mkdir(exist_ok=True)
            found = self._fields[name] = (role, Appender(
                self.vdir / "fields" / name, rows.dtype, rows.shape[1:]))
        found[1].append(rows)

    # ---- commit / abort --------------------------------------------------------------------

    def commit(self) -> int:
        """Check the counts, fsync, write the manifest, switch CURRENT; returns the version."""
        self._live()
        if self._rows != self.num_dst:
            raise GraphValidationError(f"commit: the CSR chunks cover {self._rows} destination "
                                       f"rows, expected num_dst={self.num_dst}")
        want = {"src": self.num_src, "dst": self.num_dst, "edge": self._edges}
        for name, (role, app) in self._fields.items():
            if app.rows != want[role]:
                raise GraphValidationError(f"commit: field {name!r} (role {role}) has "
                                           f"{app.rows} rows, expected {want[role]}")
        arrays = {"row_ptr": self._row_ptr.finish(), "col_idx": self._col.finish()}
        fields = {name: dict(app.finish(), role=role)
                  for name, (role, app) in self._fields.items()}
        fsync_tree(self.vdir)
        manifest = {"format": FORMAT, "version": self.version, "num_src": self.num_src,
                    "num_dst": self.num_dst, "num_edges": self._edges,
                    "index_dtype": self.index_dtype.name, "arrays": arrays, "fields": fields}
        sv.write_atomic(self.vdir / MANIFEST, sv.with_checksum(manifest))
        with sv.locked(self.path):
            sv.switch(self.path, self.vdir.name)
        self._done = True
        self._claimed.release()
        self._close_bar()
        return self.version

    def abort(self) -> None:
        """Discard this version; the committed one (if any) stays the store."""
        if not self._done:
            self._done = True
            self._close_bar()
            shutil.rmtree(self.vdir, ignore_errors=True)
            self._claimed.release()

    def _live(self) -> None:
        if self._done:
            raise StorageError(f"{self.path}: this writer already committed or aborted")

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def _count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise GraphValidationError(f"{what}: is {n!r}, expected an int >= 0")
    return int(n)


# ---- reading ---------------------------------------------------------------------------------

class Store:
    """A committed store version: counts, fields (disk tensors) and CSR row ranges."""

    def __init__(self, path, version: str | None = None):
        """The version CURRENT names (or `version`, a vNNNNNN name)."""
        self.path = sv.store_path(path, "open")
        current = version or sv.current(self.path)
        if current is None:
            raise StorageError(f"{self.path / POINTER}: not found; {self.path} holds no "
                               "committed store")
        try:
            self._load(current)
        except StorageError as exc:
            now = sv.current(self.path)
            if version is None and now != current:   # a commit pruned it while it opened
                raise StorageError(f"{self.path}: version {current} was replaced by {now} "
                                   "and pruned while it was opened; open the store "
                                   "again") from exc
            raise

    def _load(self, current: str) -> None:
        self.vdir = sv.version_dir(self.path, current)
        m = self.manifest = _read_manifest(self.vdir / MANIFEST)
        self.version = int(m["version"])
        if f"v{self.version:06d}" != current:
            raise StorageError(f"{self.vdir / MANIFEST}: version check failed: the manifest "
                               f"is version {self.version}'s, found in {current} (a manifest "
                               "copied from another version)")
        self.num_src, self.num_dst = int(m["num_src"]), int(m["num_dst"])
        self.num_edges = int(m["num_edges"])
        self.index_dtype = np.dtype(m["index_dtype"])
        self.fields = {k: {"role": v["role"], "dtype": v["dtype"], "shape": tuple(v["shape"])}
                       for k, v in m["fields"].items()}
        self._row_ptr = self._open("row_ptr", (self.num_dst + 1,), m["arrays"]["row_ptr"])
        self._col = self._open("col_idx", (self.num_edges,), m["arrays"]["col_idx"])
        ends = self._row_ptr.read_rows(0, 1)[0], self._row_ptr.read_rows(self.num_dst,
                                                                          self.num_dst + 1)[0]
        if int(ends[0]) != 0 or int(ends[1]) != self.num_edges:
            raise StorageError(f"{self._row_ptr.path}: count check failed: row_ptr runs from "
                               f"{ends[0]} to {ends[1]}, expected 0 to {self.num_edges}")
        self.transposed = Transposed(self) if "transpose" in m else None

    def transpose(self) -> Transposed:
        """The transposed relation (rows are sources), built once into a new version of
        the store when this version has none (store_transpose)."""
        if self.transposed is not None:
            return self.transposed
        from .transpose import build
        return build(self).transposed

    def _open(self, rel: str, shape: tuple, entry: dict) -> DiskStorage:
        """Array `rel` of this version, checked against its manifest `entry`: the shape
        now, every chunk's crc32c when it is read."""
        where = self.vdir / rel
        inside(where, self.vdir)
        st = DiskStorage.open(where)
        if st.shape != tuple(shape):
            raise StorageError(f"{st.path}: count check failed: shape {st.shape}, the "
                               f"manifest says {tuple(shape)}")
        if self.manifest["format"] != FORMATS[0]:
            st.expect(entry.get("crc32c"))
        return st

    def __getitem__(self, name: str):
        from ...core.types import TensorType
        from ..memory.tensor import Tensor
        if name not in self.fields:
            raise StorageError(f"store {self.path}: no field {name!r}; fields are "
                               f"{sorted(self.fields)}")
        st = self._open(f"fields/{name}", self.fields[name]["shape"],
                        self.manifest["fields"][name])
        return Tensor(st, TensorType(st.shape, as_dtype(st.dtype)))

    def read_rows(self, start: int, stop: int, out: tuple = (None, None)) -> tuple:
        """(row_ptr local to the range (starts at 0), col_idx, first edge) of destinations
        [start, stop), checked: a range whose offsets disagree is a StorageError, never read
        past. `out`: buffers to reuse for row_ptr and col_idx (see DiskStorage.read_rows)."""
        rp, lo = self.row_offsets(start, stop, out[0])
        return rp, self._col.read_rows(lo, lo + int(rp[-1]), out[1]), lo

    def row_offsets(self, start: int, stop: int, out=None) -> tuple:
        """(row_ptr local to destinations [start, stop), their first edge), checked as
        read_rows checks them (into `out` when given)."""
        return self.local_offsets(self._row_ptr.read_rows(start, stop + 1, out), start)

    def local_offsets(self, rp: np.ndarray, start: int, out=None) -> tuple:
        """(`rp`, the row_ptr entries of destinations from `start` on, made local to them
        (in place, or into `out`), their first edge), checked: offsets that decrease or
        leave [0, num_edges] are a StorageError, never read past."""
        lo, hi = int(rp[0]), int(rp[-1])
        if lo > hi or hi > self.num_edges or np.any(rp[1:] < rp[:-1]):
            raise StorageError(f"{self._row_ptr.path}: row_ptr check failed in rows "
                               f"[{start}:{start + len(rp) - 1}) (offsets not "
                               f"non-decreasing within [0, {self.num_edges}])")
        return np.subtract(rp, lo, out=rp if out is None else out[:len(rp)]), lo

    @property
    def col_idx(self) -> DiskStorage:
        """The stored column ids (every edge's source), a disk storage."""
        return self._col

    @property
    def row_ptr(self) -> DiskStorage:
        """The stored row offsets (num_dst + 1 of them), a disk storage."""
        return self._row_ptr

    @property
    def nbytes(self) -> int:
        """Bytes of the relation's arrays on disk (row_ptr and col_idx)."""
        return self._row_ptr.nbytes + self._col.nbytes

    def read_csr(self) -> tuple:
        """(row_ptr, col_idx) of the whole stored relation, read into memory."""
        rp, ci, _ = self.read_rows(0, self.num_dst)
        return rp, ci

    def page_bounds(self, page_rows: int) -> np.ndarray:
        """row_ptr at rows 0, page_rows, 2 page_rows, ... and num_dst (one pass over the
        row_ptr chunks, holding one chunk at a time)."""
        n = self.num_dst
        at = np.append(np.arange(0, n, page_rows, dtype=np.int64), n)
        out = np.empty(len(at), np.int64)
        step = self._row_ptr.chunk_rows
        for a in range(0, n + 1, step):
            sel = (at >= a) & (at < a + step)
            if sel.any():
                out[sel] = self._row_ptr.read_rows(a, a + step)[at[sel] - a]
        if np.any(np.diff(out) < 0) or out[0] != 0 or out[-1] != self.num_edges:
            raise StorageError(f"{self._row_ptr.path}: row_ptr check failed at page bounds")
        return out

    def graph(self):
        """The stored relation as a paged tg.Graph (tg.Graph.open of this store)."""
        from ...core.graph import Graph
        return Graph.open(self.path)

    def __repr__(self) -> str:
        return (f"tg.store({str(self.path)!r}, version={self.version}, num_src={self.num_src},"
                f" num_dst={self.num_dst}, num_edges={self.num_edges}, "
                f"fields={sorted(self.fields)})")


class Transposed:
    """The transposed CSR of a store version: rows are sources, columns destinations, and
    `edge_perm` maps each transposed edge to its id in the stored (by destination) order.
    Reads rows and page bounds like the Store itself."""

    def __init__(self, store: Store):
        self.path, self.vdir = store.path, store.vdir
        self.num_src, self.num_dst = store.num_dst, store.num_src
        self.num_edges, self.index_dtype = store.num_edges, store.index_dtype
        arrays = store.manifest["transpose"]
        self._row_ptr = store._open("transpose/row_ptr", (self.num_dst + 1,),
                                    arrays["row_ptr"])
        self._col = store._open("transpose/col_idx", (self.num_edges,), arrays["col_idx"])
        self.edge_perm = store._open("transpose/edge_perm", (self.num_edges,),
                                     arrays["edge_perm"])

    read_rows = Store.read_rows
    row_offsets = Store.row_offsets
    local_offsets = Store.local_offsets
    col_idx = Store.col_idx
    row_ptr = Store.row_ptr
    page_bounds = Store.page_bounds
    nbytes = Store.nbytes


def inside(where: Path, root: Path) -> None:
    """`where` resolves inside `root` (no symbolic link on its way leads out of the store)."""
    real, top = os.path.realpath(where), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        raise StorageError(f"{where}: location check failed: resolves to {real}, outside the "
                           f"store version {root}; a store's arrays must lie inside it")


def _read_manifest(path: Path) -> dict:
    try:
        m = json.loads(read_small(path, sv.SMALL_BYTES, "manifest").decode("utf-8"))
    except FileNotFoundError as exc:
        raise StorageError(f"{path}: not found (the version was never committed)") from exc
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{path}: cannot be read ({exc})") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StorageError(f"{path}: manifest check failed (not valid JSON: {exc})") from exc
    crc = m.pop("checksum", None) if isinstance(m, dict) else None
    if crc != zlib.crc32(json.dumps(m, sort_keys=True).encode()):
        raise StorageError(f"{path}: manifest checksum check failed (stored {crc})")
    if m.get("format") not in FORMATS:
        raise StorageError(f"{path}: format is {m.get('format')!r}, expected {FORMAT!r}")
    return m


def create(path, num_src: int, num_dst: int, index_dtype="int32",
           overwrite: bool = False) -> StoreWriter:
    """Start a new store version at `path` (see StoreWriter)."""
    return StoreWriter(path, num_src, num_dst, index_dtype, overwrite)


def open(path) -> Store:  # noqa: A001  (tg.store.open, API.md section 7)
    """The committed version of the store at `path`."""
    return Store(path)


store_hooks["open"] = Store
__all__ = ["create", "open", "Store", "StoreWriter"]


def __dir__() -> list[str]:
    # (this module is tg.store / tg.memory: its listing is the public API, not its helpers)
    return sorted(__all__)
