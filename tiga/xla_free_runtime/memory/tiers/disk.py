"""runtime: disk-tier storage: zarr v3 arrays chunked along rows, every chunk checksummed.

Chunks hold several MiB of whole rows, so a row range touches only the chunks it needs.
Every chunk carries a crc32c checksum (zarr's codec) and every chunk is written, even one
equal to the fill value: a flipped byte or a missing chunk file is a tg.StorageError naming
the file and the check, never a value.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

import numpy as np

from ....core.dtypes import as_dtype
from ....core.errors import ShapeError, StorageError, UnsupportedError
from . import chunk_checks
from .disk_direct import _RAW, DirectChunks, _fmt, google_crc32c
from .files import aligned_empty, open_regular, read_small

CHUNK_BYTES = 4 << 20          # target bytes per chunk: large sequential reads, small waste
META_BYTES = 1 << 20           # a zarr.json larger than this is not an array's metadata
RUN_CHUNKS = 4                 # chunks per zarr request of a gather (bounds its buffer)


def _zarr():
    try:
        import zarr
        from zarr.codecs import Crc32cCodec
    except ImportError as exc:
        raise UnsupportedError("the disk tier needs zarr>=3.1 (Python 3.11+)",
                               hint="pip install 'zarr>=3.1,<3.2', or keep tensors on "
                                    "the host tier") from exc
    if int(zarr.__version__.split(".")[0]) < 3:
        raise UnsupportedError(f"the disk tier needs zarr 3 (zarr v3 arrays), found "
                               f"zarr {zarr.__version__}", hint="pip install 'zarr>=3.1,<3.2'")
    return zarr, Crc32cCodec


def chunk_rows_for(shape: tuple, itemsize: int) -> int:
    """Rows per disk chunk of an array of `shape`: whole rows, about CHUNK_BYTES a chunk."""
    row_bytes = (int(np.prod(shape[1:], dtype=np.int64)) * itemsize if len(shape) > 1 else
        itemsize)
    return max(1, CHUNK_BYTES // max(row_bytes, 1))


class DiskStorage(DirectChunks):
    """A zarr v3 array on local disk. `owned` storages (spill files, results) delete their
    directory on release; opened ones (tg.load, stores) never touch the files."""

    tier = "disk"
    device = "cpu"

    def __init__(self, path, array, dtype: np.dtype, *, owned: bool, writable: bool,
                 scalar: bool = False):
        self.path = Path(path)
        self._array = array
        self.dtype = np.dtype(dtype)
        # zarr 3.1 cannot write 0-d arrays: a scalar is stored as one row
        self.shape = () if scalar else tuple(int(s) for s in array.shape)
        self.chunk_rows = int(array.chunks[0])
        self.owned, self.writable = owned, writable
        # per reading thread: (write generation, ((chunk, its decoded bytes), ...)), see
        # _read_direct; a write bumps the generation, so no thread reuses a stale chunk
        self._kept = threading.local()
        self._generation = 0
        self._direct = _direct_layout(Path(path), tuple(int(c) for c in array.chunks),
                                      self.shape or (1,))
        self._written: dict = {}       # chunk -> crc32c of the bytes this storage wrote
        self._expected = None          # chunk crc32c values a store's manifest records
        self._mapping = None           # (rows, FileMap, files seen), mapped()

    # ---- create / open ---------------------------------------------------------------------

    @classmethod
    def create(cls, path, shape, dtype, *, owned: bool = True,
               chunk_rows: int | None = None) -> DiskStorage:
        zarr, crc = _zarr()
        dtype = np.dtype(dtype)
        name = as_dtype(dtype).name
        raw = _RAW.get(name, dtype)
        shape = tuple(int(s) for s in shape)
        scalar = not shape
        shape = shape or (1,)
        rows = chunk_rows or max(1, min(chunk_rows_for(shape, dtype.itemsize), shape[0]))
        chunks = (rows,) + shape[1:]
        try:
            arr = zarr.create_array(store=str(path), shape=shape, chunks=chunks,
                                    dtype=raw, compressors=[crc()], fill_value=0,
                                    attributes={"tiga_dtype": name, "tiga_scalar": scalar},
                                    overwrite=True, config={"write_empty_chunks": True})
        except OSError as exc:
            raise StorageError(
                f"disk tier: cannot create a zarr array at {path}: {exc}") from exc
        return cls(path, arr, dtype, owned=owned, writable=True, scalar=scalar)

    @classmethod
    def open(cls, path, *, writable: bool = False) -> DiskStorage:
        zarr, _ = _zarr()
        path = Path(path)
        meta = path / "zarr.json"
        attrs = _read_attributes(path, meta)
        try:
            arr = zarr.open_array(str(path), mode="r+" if writable else "r")
        except Exception as exc:      # (zarr raises its own types for foreign metadata)
            raise StorageError(f"{meta}: metadata check failed ({type(exc).__name__}: "
                               f"{exc})") from exc
        name = attrs.get("tiga_dtype", str(arr.dtype))
        try:
            dtype = as_dtype(name).np
        except Exception as exc:
            raise StorageError(f"{meta}: attribute tiga_dtype is {name!r}, not a Tiga "
                               "dtype") from exc
        if np.dtype(_RAW.get(as_dtype(dtype).name, dtype)) != arr.dtype:
            raise StorageError(f"{meta}: metadata check failed: attribute tiga_dtype is "
                               f"{name!r} but the chunks hold {arr.dtype}")
        st = cls(path, arr, dtype, owned=False, writable=writable,
                 scalar=bool(attrs.get("tiga_scalar")))
        st._check_chunk_files(meta)
        return st

    def _check_chunk_files(self, meta: Path) -> None:
        """Before anything is read or allocated: every chunk the metadata declares is a
        regular file inside the array, reached through real directories (no symbolic link
        leads a read out of it), and in Tiga's layout holds exactly a chunk's bytes and its
        checksum. The count is checked against a listing first, so a shape of 2**62 rows
        is refused at once (never a loop over its chunks, never an allocation of it)."""
        n = self.num_chunks
        if n == 0:
            return
        c = self.path / "c"
        _real_dir(c, self.path)
        try:
            with os.scandir(c) as listing:
                entries = {e.name: e for e in listing}
        except OSError as exc:
            raise StorageError(f"{c}: cannot list the chunk files ({exc})") from exc
        declared = (f"{meta} declares shape {self.shape or ()} in {n} chunks of "
                    f"{self.chunk_rows} rows")
        if n > len(entries):
            k = next(k for k in range(len(entries) + 1) if str(k) not in entries)
            raise StorageError(f"{self._chunk_file(k)}: chunk file missing (existence "
                               f"check); {declared}, {c} holds {len(entries)}")
        body = self._body_bytes() + 4 if self._direct else None
        depth = max(len(self.shape), 1) - 1        # the "0" directories under c/<k>
        # (one listing, then one lstat a chunk: the directory entries' types need none)
        for k in range(n):
            e = entries.get(str(k))
            f = os.path.join(c, str(k), *["0"] * depth)
            if e is None:
                raise StorageError(f"{f}: chunk file missing (existence check); the array "
                                   f"at {self.path} is incomplete")
            if depth and not e.is_dir(follow_symlinks=False):
                _real_dir(Path(e.path), self.path)          # (raises, naming what it is)
            for j in range(1, depth):
                _real_dir(Path(os.path.join(e.path, *["0"] * j)), self.path)
            if depth == 0 and body is None and e.is_file(follow_symlinks=False):
                continue
            try:
                st = os.lstat(f)
            except FileNotFoundError as exc:
                raise StorageError(f"{f}: chunk file missing (existence check); the array "
                                   f"at {self.path} is incomplete") from exc
            except OSError as exc:
                raise StorageError(f"{f}: cannot be examined ({exc})") from exc
            if not stat.S_ISREG(st.st_mode):
                raise StorageError(f"{f}: chunk check failed: is {_kind(f, st)}; a chunk "
                                   f"must be a regular file inside {self.path}")
            if body is not None and st.st_size != body:
                raise StorageError(f"{f}: size check failed: {st.st_size} bytes, but "
                                   f"{declared} of {body - 4} bytes each (+4 for the "
                                   "checksum)")

    # ---- the tier protocol -----------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Payload bytes (rows x row bytes; checksums and metadata are not counted)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def num_chunks(self) -> int:
        rows = self.shape[0] if self.shape else 1
        return -(-rows // self.chunk_rows)

    def chunk_crcs(self) -> list:
        """The crc32c of every chunk (what this storage wrote; a chunk written through
        zarr: the checksum stored in its file), for a store's manifest."""
        out = []
        for k in range(self.num_chunks):
            crc = self._written.get(k)
            if crc is None:
                crc = self._stored_crc(self._chunk_file(k))
            out.append(crc)
        return out

    def expect(self, crcs) -> None:
        """Check every chunk read against `crcs` (a store manifest's record): a chunk copied
        from another array or version carries a valid checksum of its own, not this one."""
        if crcs is None:
            return
        if not isinstance(crcs, list) or len(crcs) != self.num_chunks:
            raise StorageError(f"{self.path}: count check failed: the manifest records "
                               f"{len(crcs) if isinstance(crcs, list) else crcs!r} chunk "
                               f"checksums, the array has {self.num_chunks} chunks")
        self._expected = crcs

    def _check_expected(self, k: int, crc: int, f) -> None:
        if self._expected is not None and self._expected[k] != crc:
            raise StorageError(f"{f}: manifest checksum check failed: chunk {k} has crc32c "
                               f"{crc:08x}, the version's manifest records "
                               f"{int(self._expected[k]):08x} (a chunk from another array "
                               "or version)")

    def _stored_crc(self, f) -> int:
        try:
            with os.fdopen(open_regular(f, what="chunk file"), "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                return int.from_bytes(fh.read(4), "little")
        except StorageError:
            raise
        except FileNotFoundError as exc:
            raise StorageError(f"{f}: chunk file missing (existence check); the array at "
                               f"{self.path} is incomplete") from exc
        except OSError as exc:
            raise StorageError(f"{f}: read failed ({exc})") from exc

    def _chunk_file(self, k: int):
        return self._chunk_files(slice(k * self.chunk_rows, k * self.chunk_rows + 1))[0]

    def _live(self):
        if self._array is None:
            raise StorageError(f"disk storage {self.path} was released")
        return self._array

    def read(self) -> np.ndarray:
        if not self.shape:
            return self._get(slice(0, 1)).reshape(())
        return self.read_rows(0, self.shape[0])

    view = read

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) as a fresh host array (or into `out`, a reused buffer of at
        least that many rows: its leading rows are returned); reads only their chunks."""
        if not self.shape:
            raise ShapeError("read_rows: a 0-d value has no rows")
        start, stop = max(0, int(start)), min(int(stop), self.shape[0])
        if stop <= start:
            return np.empty((0,) + self.shape[1:], self.dtype)
        if (out is not None and self._direct and out.dtype == self.dtype and
                out.shape[1:] == self.shape[1:] and len(out) >= stop - start):
            return self._read_direct(start, stop, out[:stop - start])
        return self._get(slice(start, stop))

    def take_rows(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows at sorted indices `rows` (into `out` as read_rows): each touched chunk is
        read once, runs of adjacent chunks in one request."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows):     # one run: no gather
            return self.read_rows(int(rows[0]), int(rows[-1]) + 1, out)
        fits = (out is not None and out.dtype == self.dtype and
            out.shape[1:] == self.shape[1:] and len(out) >= len(rows))
        out = (out[:len(rows)] if fits else
            aligned_empty((len(rows),) + self.shape[1:], self.dtype))
        if not len(rows):
            return out
        cr = self.chunk_rows
        ids = rows // cr
        # (a page of a scattered graph touches every chunk: reading a run of chunks whole
        # held the whole array in memory per reading thread, beyond any budget)
        if self._direct:          # chunk by chunk through one scratch chunk per thread
            bounds = list(np.flatnonzero(np.diff(ids)) + 1) + [len(rows)]
            local = rows - ids * cr            # each row's place in its chunk
            a, checks = 0, chunk_checks.current()
            for b in bounds:
                k, r0, r1 = int(ids[a]), int(rows[a]), int(rows[b - 1]) + 1
                at = local[a:b]
                if checks is not None and 2 * (r1 - r0) <= cr:   # a few rows: read those
                    src = self._part_view(k, r0, r1)
                    at = at - (r0 - k * cr)
                    checks.owe(self, k)
                else:
                    src = self._chunk_view(k, slice(r0, r1))
                # rows straight into `out` (no temporary; "clip": the places are in range,
                # and numpy buffers `out` for the default mode)
                np.take(src, at, axis=0, out=out[a:b], mode="clip")
                a = b
            return out
        starts = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) > 1)   # runs of chunks
        bounds = list(starts) + [len(rows)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            lo = int(ids[a]) * cr
            for c in range(lo, int(ids[b - 1] + 1) * cr, RUN_CHUNKS * cr):   # bounded runs
                i, j = np.searchsorted(rows[a:b], [c, c + RUN_CHUNKS * cr]) + a
                if j > i:
                    block = self._get(slice(c, min(c + RUN_CHUNKS * cr, self.shape[0])))
                    out[i:j] = block[rows[i:j] - c]
        return out

    def write(self, value) -> None:
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ShapeError(f"write: value shape {value.shape} differs from storage "
                             f"shape {self.shape}")
        if not self.shape:
            self._set(slice(0, 1), value.reshape(1))
            return
        step = self.chunk_rows * 4
        for a in range(0, self.shape[0], step):
            self.write_rows(a, value[a:a + step])

    def write_rows(self, start: int, rows) -> None:
        rows = np.asarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.shape[1:] or start < 0 or start + len(rows) > self.shape[0]:
            raise ShapeError(f"write_rows: rows of shape {rows.shape} at row {start} do not "
                             f"fit storage of shape {self.shape}")
        if self._direct and self.writable and self._aligned(start, len(rows)):
            self._write_direct(start, rows)
        else:
            self._set(slice(start, start + len(rows)), rows)

    def grow(self, rows: int) -> None:
        """Extend the row axis to `rows` (ingest appends whole chunks)."""
        if not self.writable:
            raise StorageError(f"disk storage {self.path} is read-only")
        self._generation += 1
        try:
            self._live().resize((rows,) + self.shape[1:])
        except OSError as exc:
            raise StorageError(f"{self.path}: resize to {rows} rows failed ({exc})") from exc
        self.shape = (rows,) + self.shape[1:]

    def release(self) -> None:
        if self._array is not None and self.owned:
            shutil.rmtree(self.path, ignore_errors=True)
        self._array = self._mapping = None
        self._generation += 1

    # ---- checked access --------------------------------------------------------------------

    def _raw(self, value: np.ndarray) -> np.ndarray:
        raw = _RAW.get(as_dtype(self.dtype).name)
        return value.view(raw) if raw is not None else value

    def _set(self, key, value) -> None:
        if not self.writable:
            raise StorageError(f"disk storage {self.path} is read-only (opened by tg.load or "
                               "a store)")
        self._generation += 1
        try:
            self._live()[key] = self._raw(np.ascontiguousarray(value, self.dtype))
        except OSError as exc:
            raise StorageError(f"{self.path}: write failed ({exc})") from exc

    def _get(self, key) -> np.ndarray:
        arr = self._live()
        if self._direct:
            got = self._read_direct(key.start, key.stop)
            raw = _RAW.get(as_dtype(self.dtype).name)
            return got.view(self.dtype) if raw is not None else got
        self._check_chunks(key)
        try:
            got = np.asarray(arr[key])
        except (ValueError, OSError, RuntimeError) as exc:
            raise StorageError(f"{self._bad_chunk(key) or self.path}: checksum check "
                               f"(crc32c) failed reading rows {_fmt(key)} ({exc})") from exc
        raw = _RAW.get(as_dtype(self.dtype).name)
        return got.view(self.dtype) if raw is not None else got

    def _chunk_files(self, key) -> list:
        lo, hi = key.start, key.stop
        if hi <= lo:
            return []
        tail = "/0" * (max(len(self.shape), 1) - 1)
        return [self.path / f"c/{k}{tail}"
                for k in range(lo // self.chunk_rows, (hi - 1) // self.chunk_rows + 1)]

    def _check_chunks(self, key) -> None:
        # zarr reads a missing chunk as the fill value: a deleted file must not become zeros
        for f in self._chunk_files(key):
            if not f.exists():
                raise StorageError(f"{f}: chunk file missing (existence check); the array "
                                   f"at {self.path} is incomplete")
            if self._expected is not None:
                k = int(f.relative_to(self.path).parts[1])
                self._check_expected(k, self._stored_crc(f), f)

    def _bad_chunk(self, key):
        for f in self._chunk_files(key):
            lo = int(f.relative_to(self.path).parts[1]) * self.chunk_rows
            try:
                self._live()[lo:lo + self.chunk_rows]
            except (ValueError, OSError, RuntimeError):
                return f
        return None


_DIRECT_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


def _direct_layout(path: Path, chunks: tuple, shape: tuple) -> bool:
    """Whether chunk files can be read directly: the layout DiskStorage.create writes (raw
    little-endian rows + a crc32c trailer, '/'-separated keys, chunks of whole rows)."""
    if sys.byteorder != "little" or google_crc32c is None or chunks[1:] != shape[1:]:
        return False
    try:
        meta = json.loads(read_small(path / "zarr.json", META_BYTES, "metadata"))
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict):
        return False
    enc = meta.get("chunk_key_encoding", {})
    return (meta.get("codecs") == _DIRECT_CODECS and enc.get("name") == "default" and
        enc.get("configuration", {}).get("separator") == "/")


def _real_dir(d: Path, root: Path) -> None:
    """`d` is a real directory (lstat: not a symbolic link) of the array at `root`."""
    try:
        st = os.lstat(d)
    except FileNotFoundError as exc:
        raise StorageError(f"{d}: chunk file missing (existence check); the array at "
                           f"{root} is incomplete") from exc
    except OSError as exc:
        raise StorageError(f"{d}: cannot be examined ({exc})") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"{d}: chunk check failed: is {_kind(d, st)}, not a directory; "
                           f"the chunks must lie inside {root}")


def _kind(p: Path, st) -> str:
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link to {os.readlink(p)!r}"
        except OSError:
            return "a symbolic link"
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file")):
        if test(st.st_mode):
            return name
    return f"a special file (mode {st.st_mode:o})"


def _read_attributes(path: Path, meta: Path) -> dict:
    """The attributes of the zarr array at `path` (any file-system error a StorageError
    naming the file: a missing array, a regular file where the array should be)."""
    try:
        doc = json.loads(read_small(meta, META_BYTES, "metadata").decode("utf-8"))
    except StorageError:
        raise
    except FileNotFoundError as exc:
        what = "is a file, not a directory" if path.is_file() else "not found"
        raise StorageError(f"{meta}: {what}; expected a zarr v3 array written by "
                           "tg.save or a store") from exc
    except NotADirectoryError as exc:
        raise StorageError(f"{meta}: not found: {path} is a file, not a directory; expected "
                           "a zarr v3 array written by tg.save or a store") from exc
    except OSError as exc:
        raise StorageError(f"{meta}: cannot be read ({exc})") from exc
    except ValueError as exc:       # (JSONDecodeError and UnicodeDecodeError)
        raise StorageError(f"{meta}: metadata check failed ({exc})") from exc
    kind = doc.get("node_type", "array") if isinstance(doc, dict) else type(doc).__name__
    attrs = doc.get("attributes", {}) if isinstance(doc, dict) else None
    if not isinstance(attrs, dict) or kind != "array":
        raise StorageError(f"{meta}: metadata check failed: describes a {kind!r}, not a "
                           "zarr v3 array")
    return attrs
