"""runtime/distributed: MPI execution: ownership, halo plans, overlapped exchange, reverse
halo for VJPs. mpi4py is imported only when a function here talks to MPI."""
from __future__ import annotations

from .comm import Comm, init
from .graph import DistributedGraph, is_distributed, partition

__all__ = ["Comm", "init", "DistributedGraph", "is_distributed", "partition"]
