"""runtime: the tier protocol every storage implements."""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Storage(Protocol):
    """A physical instance of a logical value on one tier."""

    tier: str  # "host" | "device" | "disk"
    device: str

    def read(self) -> np.ndarray:
        """The value as a host ndarray (a view when the tier is host)."""

    def write(self, value: np.ndarray) -> None:
        """Replace the contents (same shape and dtype)."""

    def view(self) -> np.ndarray:
        """A zero-copy view where the tier allows it."""

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) on the host (a view on the host tier, only the chunks needed
        on the disk tier)."""

    def write_rows(self, start: int, rows: np.ndarray) -> None:
        """Overwrite rows [start, start + len(rows))."""

    def release(self) -> None:
        """Give the buffer back; later reads fail until restored."""

    @property
    def nbytes(self) -> int:
        """Bytes held on this tier."""
