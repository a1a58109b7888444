"""Test collection for the MPI tests: the test_mpi_*.py modules are collected only inside an
mpiexec job. tests/distributed/test_launch.py runs them under mpiexec with 2, 3 and 4 ranks
and passes or fails on their outcome, so the main pytest process reports them through those
launches, as passed or failed, instead of listing each one as skipped."""
from __future__ import annotations

from ._mpi import under_mpiexec

# pytest reads this module-level name; an empty list collects everything (inside mpiexec)
collect_ignore_glob = [] if under_mpiexec() else ["test_mpi_*.py"]
