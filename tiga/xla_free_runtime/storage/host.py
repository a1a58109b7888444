"""runtime: host-memory storage (numpy)."""
from __future__ import annotations

import numpy as np

from ...core.errors import ShapeError, StorageError


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

    def release(self) -> None:
        self._array = None

    @property
    def nbytes(self) -> int:
        return 0 if self._array is None else self._array.nbytes
