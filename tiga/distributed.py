"""tg.distributed: MPI execution (facade; re-exports only). Run with
`mpiexec -n P python -m mpi4py script.py`."""
from __future__ import annotations

from .xla_free_runtime.distributed import Comm, DistributedGraph, init, partition

__all__ = ["Comm", "DistributedGraph", "init", "partition"]


def __dir__() -> list[str]:
    return sorted(__all__)
