"""runtime: host-memory storage (numpy)."""
from __future__ import annotations

import numpy as np

from ....core.errors import ShapeError, StorageError


class HostStorage:
    tier = "host"
    device = "cpu"

    def __init__(self, array: np.ndarray):
        self._array: np.ndarray | None = array

    @classmethod
    def alloc(cls, shape, dtype) -> HostStorage:
        return cls(np.empty(shape, dtype))

    def _live(self) -> np.ndarray:
        if self._array is None:
            raise StorageError("host storage was released; restore the tensor before use")
        return self._array

    def read(self) -> np.ndarray:
        return self._live()

    view = read

    def write(self, value) -> None:
        arr = self._live()
        value = np.asarray(value)
        if value.shape != arr.shape:
            raise ShapeError(f"write: value shape {value.shape} differs from storage "
                             f"shape {arr.shape}")
        arr[...] = value

    def read_rows(self, start: int, stop: int, out=None) -> np.ndarray:
        """Rows [start, stop) as a view (`out`, a buffer to reuse, is not needed)."""
        return self._live()[start:stop]

    def take_rows(self, rows: np.ndarray, out=None) -> np.ndarray:
        """Rows at sorted distinct indices (a view when they are one run)."""
        arr = self._live()
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
            return arr[int(rows[0]):int(rows[-1]) + 1]
        from .files import aligned_empty  # (kernels read gathered pages in place)
        fits = (out is not None and out.dtype == arr.dtype and
            out.shape[1:] == arr.shape[1:] and len(out) >= len(rows))
        out = out[:len(rows)] if fits else aligned_empty((len(rows),) + arr.shape[1:],
                                                         arr.dtype)
        return np.take(arr, rows, axis=0, out=out, mode="clip")   # (ids checked by the caller)

    def write_rows(self, start: int, rows) -> None:
        arr = self._live()
        rows = np.asarray(rows)
        if rows.shape[1:] != arr.shape[1:] or start < 0 or start + len(rows) > len(arr):
            raise ShapeError(f"write_rows: rows of shape {rows.shape} at row {start} do not "
                             f"fit storage of shape {arr.shape}")
        arr[start:start + len(rows)] = rows

    def release(self) -> None:
        self._array = None

    @property
    def nbytes(self) -> int:
        return 0 if self._array is None else self._array.nbytes
