"""runtime: store ingest helpers: per-chunk validation and chunk-aligned appenders.

An Appender buffers at most one zarr chunk of rows and writes only whole chunks (the tail at
finish), so ingest memory is one caller chunk plus one buffer per array.
"""
from __future__ import annotations

import numpy as np

from ...core.dtypes import as_dtype
from ...core.errors import GraphValidationError
from ..memory.tiers.disk import DiskStorage, chunk_rows_for


class Appender:
    """Rows appended to a growing zarr array, written a whole chunk at a time."""

    def __init__(self, path, dtype, row_shape: tuple):
        self.dtype, self.row_shape = np.dtype(dtype), tuple(row_shape)
        self.chunk = chunk_rows_for((1,) + self.row_shape, self.dtype.itemsize)
        self.disk = DiskStorage.create(path, (0,) + self.row_shape, self.dtype, owned=False,
                                       chunk_rows=self.chunk)
        self.buf = np.empty((self.chunk,) + self.row_shape, self.dtype)
        self.fill = 0          # rows in buf
        self.rows = 0          # rows appended (written + buffered)
        self.rows_written = 0

    def append(self, rows: np.ndarray) -> None:
        k = 0
        while k < len(rows):
            take = min(self.chunk - self.fill, len(rows) - k)
            self.buf[self.fill:self.fill + take] = rows[k:k + take]
            self.fill += take
            k += take
            if self.fill == self.chunk:
                self._flush()
        self.rows += len(rows)

    def _flush(self) -> None:
        if not self.fill:
            return
        start = self.rows_written
        if start + self.fill > self.disk.shape[0]:
            # the array's shape lives in its metadata file: grown by doubling, so a long
            # ingest rewrites it a few dozen times, not once per chunk
            self.disk.grow(max(start + self.fill, 2 * self.disk.shape[0]))
        self.disk.write_rows(start, self.buf[:self.fill])
        self.rows_written += self.fill
        self.fill = 0

    def finish(self) -> dict:
        """Write the tail; the array's shape, dtype and every chunk's crc32c (the manifest
        records them, so a chunk copied from elsewhere is caught on read)."""
        if self.disk.shape[0] != self.rows:
            # (sized to the rows appended before the tail is written: the tail chunk then
            # ends the array and is written whole, its checksum known)
            self.disk.grow(self.rows)
        self._flush()
        self.buf = None
        return {"shape": list(self.disk.shape), "dtype": as_dtype(self.dtype).name,
                "crc32c": self.disk.chunk_crcs()}


def _index_array(x, what: str, where: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise GraphValidationError(f"{where}: {what} must be a 1-D integer array, found "
                                   f"shape {a.shape} dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def check_csr_chunk(row_ptr_chunk, col_chunk, k: int, rows_before: int, num_dst: int,
                    num_src: int, index_dtype) -> tuple:
    """(row_ptr int64, col in the index dtype) of chunk k, or GraphValidationError naming
    the chunk, the position and the rule."""
    where = f"append_csr_chunk: chunk {k}"
    rp = _index_array(row_ptr_chunk, "row_ptr_chunk", where)
    ci = _index_array(col_chunk, "col_chunk", where)
    if len(rp) == 0:
        raise GraphValidationError(f"{where}: row_ptr_chunk is empty, expected rows + 1 "
                                   "entries starting at 0")
    if rp[0] != 0:
        raise GraphValidationError(f"{where}: row_ptr_chunk[0] is {rp[0]}, expected 0 (a "
                                   "chunk's row_ptr is local)")
    bad = np.flatnonzero(rp[1:] < rp[:-1])
    if len(bad):
        i = int(bad[0]) + 1
        raise GraphValidationError(f"{where}: row_ptr_chunk[{i}] = {rp[i]} is less than "
                                   f"row_ptr_chunk[{i - 1}] = {rp[i - 1]} (must not decrease)")
    if rp[-1] != len(ci):
        raise GraphValidationError(f"{where}: row_ptr_chunk[-1] is {rp[-1]}, expected "
                                   f"len(col_chunk) = {len(ci)}")
    if rows_before + len(rp) - 1 > num_dst:
        raise GraphValidationError(f"{where}: brings the rows to {rows_before + len(rp) - 1},"
                                   f" more than num_dst = {num_dst}")
    if len(ci):
        bad = np.flatnonzero((ci < 0) | (ci >= num_src))
        if len(bad):
            i = int(bad[0])
            raise GraphValidationError(f"{where}: col_chunk[{i}] = {ci[i]} is outside "
                                       f"[0, num_src = {num_src})")
    return rp, ci.astype(index_dtype, copy=False)


def check_field_rows(name: str, rows, role: str, found) -> np.ndarray:
    where = f"append_field({name!r})"
    a = np.asarray(rows)
    if a.ndim < 1:
        raise GraphValidationError(f"{where}: rows must have a leading row axis, found a "
                                   "0-d value")
    as_dtype(a.dtype)     # a DTypeError names an unsupported dtype
    if found is not None:
        role0, app = found
        if role0 != role:
            raise GraphValidationError(f"{where}: role is {role!r}, earlier rows had role "
                                       f"{role0!r}")
        if a.shape[1:] != app.row_shape or a.dtype != app.dtype:
            raise GraphValidationError(
                f"{where}: rows of shape {a.shape[1:]} dtype {a.dtype} differ from earlier "
                f"rows of shape {app.row_shape} dtype {app.dtype}")
    return a
