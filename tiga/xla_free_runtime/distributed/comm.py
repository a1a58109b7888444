"""runtime/distributed: the MPI communicator (mpi4py, imported lazily) and bounded waits.

Only this package imports mpi4py, and only when a distributed function runs: `import tiga`
never loads MPI. Every wait on another rank is bounded by TIGA_DIST_TIMEOUT seconds
(default 60): a rank that died, raised, or runs a different program turns into a
`DistributedError` on the ranks that wait for it, never into a hang.
"""
from __future__ import annotations

import functools
import hashlib
import os
import time

import numpy as np

from ...core.errors import DistributedError, UnsupportedError

DEFAULT_TIMEOUT = 60.0


def mpi():
    """The mpi4py.MPI module, or UnsupportedError saying how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise UnsupportedError(
            "tg.distributed needs mpi4py, which is not installed",
            hint="pip install 'tiga[dist]' (mpi4py + the mpich wheel), or build mpi4py "
                 "against your cluster's MPI; then run with mpiexec -n P python -m mpi4py "
                 "script.py") from exc
    return MPI


def timeout() -> float:
    """TIGA_DIST_TIMEOUT in seconds (a positive number), default 60."""
    raw = os.environ.get("TIGA_DIST_TIMEOUT", "")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DistributedError(f"TIGA_DIST_TIMEOUT: must be a positive number of seconds, "
                               f"found {raw!r}")
    return value


class Comm:
    """A communicator: `rank`, `size`, and the few collectives Tiga needs, all bounded."""

    def __init__(self, raw):
        self.raw = raw
        self.rank = raw.Get_rank()
        self.size = raw.Get_size()

    def __repr__(self) -> str:
        return f"Comm(rank={self.rank}, size={self.size})"

    def dup(self) -> Comm:
        """A private copy: Tiga's halo messages never match the user's own MPI traffic."""
        return Comm(self.raw.Dup())

    def wait(self, requests: list, what: str) -> None:
        """Complete `requests` or raise DistributedError after TIGA_DIST_TIMEOUT seconds."""
        if not requests:
            return
        MPI = mpi()
        limit = timeout()
        deadline = time.monotonic() + limit
        spins = 0
        while not MPI.Request.Testall(requests):
            spins += 1
            if spins > 64:
                # ranks may outnumber cores: give the core to the rank we wait for (a real
                # yield; with a core per rank it returns at once), then sleep briefly
                if spins < 2048:
                    _yield()
                else:
                    time.sleep(1e-4)
            if time.monotonic() > deadline:
                _cancel(requests)
                raise DistributedError(
                    f"rank {self.rank}: {what} did not complete within TIGA_DIST_TIMEOUT="
                    f"{limit:g} s: another rank failed, exited, or runs a different program "
                    "or graph")

    def allgather_array(self, value: np.ndarray, what: str) -> np.ndarray:
        """Every rank's `value` (same shape and dtype on each), stacked by rank; bounded."""
        value = np.ascontiguousarray(value)
        out = np.empty((self.size,) + value.shape, value.dtype)
        MPI = mpi()
        req = self.raw.Iallgather([value.reshape(-1).view(np.uint8), MPI.BYTE],
                                  [out.reshape(-1).view(np.uint8), MPI.BYTE])
        self.wait([req], what)
        return out

    def agree(self, token: str, what: str) -> None:
        """Every rank passes the same `token`, else DistributedError naming who differs."""
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        mine = np.frombuffer(digest, np.int64).copy()
        every = self.allgather_array(mine, f"the agreement on {what}")[:, 0]
        differ = np.flatnonzero(every != every[0])
        if len(differ):
            raise DistributedError(
                f"rank {self.rank}: ranks disagree on {what}: ranks "
                f"{sorted(set(range(self.size)) - set(differ.tolist()))} vs "
                f"{differ.tolist()} (every rank must call it with the same program, field "
                "shapes and graph)")

    def any(self, flag: bool, what: str) -> bool:
        """True on every rank when `flag` is true on any rank (bounded)."""
        flags = self.allgather_array(np.array([bool(flag)], np.bool_), what)
        return bool(flags.any())

    def sum(self, value: np.ndarray, what: str) -> np.ndarray:
        """The elementwise sum of `value` over ranks, on every rank (bounded, rank order)."""
        return self.allgather_array(np.asarray(value), what).sum(axis=0)


_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def _cancel(requests) -> None:
    for r in requests:
        try:
            r.Cancel()
        except Exception:   # noqa: BLE001  (a send may not be cancellable: leave it)
            pass


@functools.cache     # one world communicator per process
def init() -> Comm:
    """MPI's world communicator (MPI is initialised by mpi4py on first use)."""
    return Comm(mpi().COMM_WORLD)


__all__ = ["Comm", "init", "mpi", "timeout", "DEFAULT_TIMEOUT"]
