"""Shared by the MPI tests: are we one rank of an mpiexec job (env only: no MPI import)."""
from __future__ import annotations

import os

import pytest

MPI_ENV = ("PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def under_mpiexec() -> bool:
    return any(k in os.environ for k in MPI_ENV)


needs_mpiexec = pytest.mark.skipif(
    not under_mpiexec(), reason="runs under mpiexec (tests/distributed/test_launch.py "
                                "launches it with 2 and 3 or 4 ranks)")
