"""runtime/memory/tiers: the disk tier's direct path: chunk files read, written and mapped."""
from __future__ import annotations

import mmap
import os
import sys

import numpy as np

from ....core.dtypes import as_dtype, bfloat16
from ....core.errors import StorageError
from . import chunk_checks
from .files import (
    aligned_empty,
    cached_bytes,
    map_files,
    read_chunk_file,
    read_part,
    write_file,
)

try:
    import google_crc32c  # zarr's crc32c codec uses it; the direct reader checks with it
except ImportError:          # pragma: no cover (installed with zarr 3)
    google_crc32c = None

SPARE_CHUNKS = 3               # chunk buffers a reading thread keeps for reuse (_spare)
_RAW = {bfloat16.name: np.dtype(np.uint16)}   # dtypes zarr lacks are stored as their bits


class DirectChunks:
    """DiskStorage's methods that read, write and map its chunk files directly (Tiga's
    layout: raw little-endian rows and a crc32c trailer a file), past zarr."""

    def _chunk_view(self, k: int, key) -> np.ndarray:
        """Chunk k decoded (its rows), in this thread's scratch chunk, or the one a range
        read keeps (see _read_direct); valid until this thread's next read."""
        gen, partial = getattr(self._kept, "chunks", (None, ()))
        kept = dict(partial).get(k) if gen == self._generation else None
        row_shape = self.shape[1:]
        raw = np.dtype(_RAW.get(as_dtype(self.dtype).name, self.dtype))
        nbytes = self.chunk_rows * int(np.prod(row_shape, dtype=np.int64)) * raw.itemsize
        if kept is None:
            kept = getattr(self._kept, "scratch", None)
            if kept is None or len(kept) != nbytes:
                kept = self._kept.scratch = aligned_empty((nbytes,), np.uint8, 4096)
            self._read_chunk(k, kept, key=key)
        return kept.view(self.dtype).reshape((self.chunk_rows,) + row_shape)

    def _part_view(self, k: int, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of chunk k, read alone into this thread's part buffer (unchecked:
        the caller owes the chunk's check to its run); valid until its next part read."""
        row_shape = self.shape[1:]
        raw = np.dtype(_RAW.get(as_dtype(self.dtype).name, self.dtype))
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * raw.itemsize
        buf = getattr(self._kept, "part", None)
        if buf is None or len(buf) < (r1 - r0) * row_bytes:
            buf = self._kept.part = np.empty((r1 - r0) * row_bytes, np.uint8)
        dst = buf[:(r1 - r0) * row_bytes]
        self._read_part(k, (r0 - k * self.chunk_rows) * row_bytes, dst)
        return dst.view(self.dtype).reshape((r1 - r0,) + row_shape)

    def _read_direct(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [lo, hi) read from the chunk files straight into the result (whole chunks
        inside the range) or through a scratch chunk (the partial ends), each chunk's
        crc32c checked. Same files and checks as zarr's decode without its event loop and
        copies; file reads and the checksum release the GIL, so a prefetch thread overlaps.
        The range's edge chunks stay decoded for the reading thread (two chunks): a sweep of
        ranges that share a chunk with the next one (pages of a banded graph) decodes every
        chunk once. Inside a run's chunk_checks, a partial end of at most half a chunk is
        read alone, its chunk's check owed to the run (chunk_checks.py): a larger part (pages
        smaller than a chunk) is read with its chunk, which is then checked at once."""
        raw = _RAW.get(as_dtype(self.dtype).name, self.dtype)
        row_shape = self.shape[1:] if self.shape else ()
        out = aligned_empty((hi - lo,) + row_shape, raw) if out is None else out.view(raw)
        flat = out.reshape(-1).view(np.uint8)
        row_bytes = flat.nbytes // max(hi - lo, 1)
        cr, last = self.chunk_rows, (hi - 1) // self.chunk_rows
        checks = chunk_checks.current()
        gen, partial = getattr(self._kept, "chunks", (None, ()))
        kept = dict(partial) if gen == self._generation else {}
        for k in range(lo // cr, last + 1):
            a, b = max(lo, k * cr), min(hi, (k + 1) * cr)
            dst = flat[(a - lo) * row_bytes:(b - lo) * row_bytes]
            chunk = kept.get(k)
            if chunk is None and a == k * cr and b == (k + 1) * cr:
                self._read_chunk(k, dst, key=slice(lo, hi))
                if k == last and checks is None:
                    kept[k] = self._spare(cr * row_bytes)
                    np.copyto(kept[k], dst)
                continue
            if chunk is None and checks is not None and 2 * (b - a) <= cr:   # a few rows
                self._read_part(k, (a - k * cr) * row_bytes, dst)
                checks.owe(self, k)
                continue
            if chunk is None:
                chunk = kept[k] = self._spare(cr * row_bytes)
                self._read_chunk(k, chunk, key=slice(lo, hi))
            dst[...] = chunk[(a - k * cr) * row_bytes:(b - k * cr) * row_bytes]
        ends = {lo // cr, last}
        keep = tuple((k, v) for k, v in kept.items() if k in ends)[-2:]
        self._kept.chunks = (self._generation, keep)
        self._recycle(keep, [v for _, v in partial] + list(kept.values()))
        return out

    def _recycle(self, keep: tuple, used: list) -> None:
        """The chunk buffers a range read held and no longer keeps become this thread's
        spares (at most SPARE_CHUNKS)."""
        spare = getattr(self._kept, "spare", [])
        held = {id(v) for _, v in keep} | {id(v) for v in spare}
        for v in used:
            if id(v) not in held:
                spare.append(v)
                held.add(id(v))
        self._kept.spare = spare[-SPARE_CHUNKS:]

    def _spare(self, nbytes: int) -> np.ndarray:
        """A chunk-sized buffer this thread used before and no longer keeps (its pages are
        already faulted in), else a fresh one."""
        spare = getattr(self._kept, "spare", [])
        while spare:
            buf = spare.pop()
            if len(buf) == nbytes:
                return buf
        return aligned_empty((nbytes,), np.uint8, 4096)     # (a cold chunk is read direct)

    def _read_chunk(self, k: int, target: np.ndarray, key) -> None:
        f, checks = self._chunk_file(k), chunk_checks.current()
        fmap = checks.mapping(self, k, target.nbytes) if checks is not None else None
        if fmap is not None:
            self.load_mapped(k, fmap)          # (read in, checked and recorded through it)
            np.copyto(target.reshape(-1).view(np.uint8),
                      np.asarray(fmap)[k * target.nbytes:(k + 1) * target.nbytes])
            return
        try:
            got, crc = read_chunk_file(f, target, checks is not None and checks.direct)
        except FileNotFoundError as exc:
            raise StorageError(f"{f}: chunk file missing (existence check); the array at "
                               f"{self.path} is incomplete") from exc
        except OSError as exc:
            raise StorageError(f"{f}: read failed ({exc})") from exc
        if (got != target.nbytes or len(crc) != 4 or
                google_crc32c.value(target) != int.from_bytes(crc, "little")):
            raise StorageError(f"{f}: checksum check (crc32c) failed reading rows "
                               f"{_fmt(key)} (stored chunk of {got + len(crc)} bytes, "
                               f"expected {target.nbytes + 4} with a matching checksum)")
        self._check_expected(k, int.from_bytes(crc, "little"), f)
        if checks is not None:
            checks.checked(self, k)

    def _read_part(self, k: int, offset: int, dst: np.ndarray) -> None:
        """Bytes [offset, offset + len(dst)) of chunk k's rows into `dst`, unchecked: the
        caller owes the chunk's check to its run."""
        f = self._chunk_file(k)
        checks = chunk_checks.current()
        try:
            got = read_part(f, offset, dst, checks is not None and checks.direct)
        except FileNotFoundError as exc:
            raise StorageError(f"{f}: chunk file missing (existence check); the array at "
                               f"{self.path} is incomplete") from exc
        except OSError as exc:
            raise StorageError(f"{f}: read failed ({exc})") from exc
        if got != dst.nbytes:
            raise StorageError(f"{f}: size check failed: {got} of the {dst.nbytes} bytes at "
                               f"{offset} read (a truncated chunk)")

    def check_chunk(self, k: int) -> None:
        """Read chunk k whole and check it (crc32c, the manifest's record): a run's owed
        check (chunk_checks.py)."""
        row_bytes = (int(np.prod(self.shape[1:], dtype=np.int64)) *
            np.dtype(_RAW.get(as_dtype(self.dtype).name, self.dtype)).itemsize)
        buf = self._spare(self.chunk_rows * row_bytes)
        self._read_chunk(k, buf, key=slice(k * self.chunk_rows, (k + 1) * self.chunk_rows))
        self._recycle((), [buf])

    def mapped(self) -> tuple | None:
        """(every row, the chunk bodies' FileMap) of a read-only array, mapped from the
        page cache rather than read into buffers (files.map_files), or None (written here,
        another layout, a chunk file missing, no mmap). The mapping is kept with this
        storage while its chunk files show no change (inode, size, modification and change
        times, looked at on every call), so a chunk an earlier run checked that stayed
        mapped is not checked again (load_mapped); a changed file is mapped anew. Nothing
        is read or checked here: load_mapped(k) each chunk before its rows are trusted."""
        if not self.can_map():
            return None
        paths = self._chunk_files(slice(0, self.shape[0]))
        try:
            seen = [(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                    for st in map(os.stat, paths)]
        except OSError:
            return None             # (the read path says which file, and why)
        if self._mapping is None or self._mapping[2] != seen:
            self._mapping = None
            fmap = map_files(paths, self._body_bytes())
            if fmap is None:
                return None
            flat = np.asarray(fmap)          # (holds the mapping)
            rows = flat[:self.nbytes].view(self.dtype).reshape(self.shape)
            fmap.derived["checked"] = set()  # chunks checked through this mapping
            self._mapping = (rows, fmap, seen)
        rows, fmap, _ = self._mapping
        # a checked chunk whose pages all stayed mapped holds the bytes checked; one that
        # lost a page may have been read again from the disk since: checked again
        # (decided now, before this run's kernels fault anything back in)
        fmap.derived["checked"].intersection_update(
            np.flatnonzero(fmap.resident(len(paths))).tolist())
        return rows, fmap

    def can_map(self) -> bool:
        """Whether mapped() can map this array: rows, read-only (nothing written while a run
        maps it), the direct layout, whole memory pages a chunk, on Linux."""
        return (self._direct and not self.writable and bool(self.shape and self.shape[0]) and
            self._array is not None and sys.platform == "linux" and
            self._body_bytes() % mmap.PAGESIZE == 0)

    def cached_fraction(self) -> float:
        """The share of this array's chunk bodies the page cache holds now (all of it, as
        far as this asks, when the last run checked every chunk through this storage's
        mapping: mapped() finds out whether they stayed)."""
        if (self._mapping is not None and
                len(self._mapping[1].derived["checked"]) == self.num_chunks):
            return 1.0
        body = self._body_bytes()
        paths = self._chunk_files(slice(0, self.shape[0])) if self.shape else []
        return cached_bytes(paths, body) / (body * len(paths)) if paths and body else 0.0

    def _body_bytes(self) -> int:
        raw = np.dtype(_RAW.get(as_dtype(self.dtype).name, self.dtype))
        return self.chunk_rows * int(np.prod(self.shape[1:], dtype=np.int64)) * raw.itemsize

    def load_mapped(self, k: int, fmap) -> None:
        """Chunk k of `fmap` (mapped()'s) read in (what the cache lacks) and checked as a
        chunk read is (_check_body), unless an earlier run checked it through the same
        mapping and mapped() found all its pages still mapped; recorded in the run's
        chunk_checks."""
        verified = fmap.derived["checked"]
        body = fmap.nbytes // self.num_chunks
        if k not in verified:
            f = self._chunk_file(k)
            try:
                fmap.populate(k * body, (k + 1) * body)
            except OSError as exc:
                raise StorageError(f"{f}: read failed ({exc}); a chunk file cut short "
                                   "while the run read it") from exc
            self._check_body(k, np.asarray(fmap)[k * body:(k + 1) * body], f)
            verified.add(k)
        checks = chunk_checks.current()
        if checks is not None:
            checks.checked(self, k)

    def _check_body(self, k: int, body: np.ndarray, f) -> None:
        """Chunk k's body against its file's trailer, and that against the manifest, as
        _read_chunk checks a chunk it read."""
        crc, stored = google_crc32c.value(body), self._stored_crc(f)
        if crc != stored:
            raise StorageError(f"{f}: checksum check (crc32c) failed reading rows "
                               f"[{k * self.chunk_rows}:{(k + 1) * self.chunk_rows}) (the "
                               f"chunk's {len(body)} bytes give {crc:08x}, its trailer "
                               f"holds {stored:08x})")
        self._check_expected(k, stored, f)

    def _aligned(self, start: int, n: int) -> bool:
        """Rows [start, start + n) are whole chunks (the last one may end the array)."""
        cr = self.chunk_rows
        return n > 0 and start % cr == 0 and ((start + n) % cr == 0 or
                                              start + n == self.shape[0])

    def _write_direct(self, start: int, rows: np.ndarray) -> None:
        """Whole chunks written as zarr encodes them (raw little-endian rows, the tail
        chunk padded with the fill value 0, then the crc32c of the bytes), each through a
        temporary file renamed over the chunk: a reader sees the old chunk or the new one.
        zarr's own write path costs ~15 ms a 4 MiB chunk (its event loop and copies)."""
        self._generation += 1
        raw = np.ascontiguousarray(self._raw(np.ascontiguousarray(rows, self.dtype)))
        flat = raw.reshape(-1).view(np.uint8)
        row_bytes = flat.nbytes // len(rows)
        cr = self.chunk_rows
        chunk_bytes = cr * row_bytes
        for k in range(start // cr, (start + len(rows) - 1) // cr + 1):
            a = (k * cr - start) * row_bytes
            body = flat[a:a + chunk_bytes]
            if len(body) < chunk_bytes:         # the array's last chunk: padded
                body = np.concatenate([body, np.zeros(chunk_bytes - len(body), np.uint8)])
            f = self._chunk_file(k)
            tmp = f.with_name(f".{f.name}.tmp")
            crc = google_crc32c.value(body)
            try:
                tmp.parent.mkdir(parents=True, exist_ok=True)
                write_file(tmp, body, crc.to_bytes(4, "little"))
                os.replace(tmp, f)
            except OSError as exc:
                raise StorageError(f"{f}: write failed ({exc})") from exc
            self._written[k] = crc


def _fmt(key) -> str:
    return f"[{key.start}:{key.stop})"
