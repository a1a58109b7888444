"""runtime/distributed: halo transfers on numpy buffers (mpi4py Isend/Irecv, nonblocking).

Forward (`HaloExchange`): each rank packs the owned rows its peers read, posts the sends and
the receives of its own ghost rows, and may compute while they are in flight. Reverse
(`reverse_add`): a result over owned + ghost rows (a source-grouped propagate, e.g. the
VJP's source cotangents) sends its ghost rows back to their owners, who add them.
Messages go as bytes, so every dtype (bfloat16 included) travels unchanged. Peers post in
the same order on every rank and MPI does not overtake on one (peer, tag): no sequence
numbers are needed.
"""
from __future__ import annotations

import time

import numpy as np

from .comm import mpi

TAG_FORWARD = 11
TAG_REVERSE = 12
ALIGN = 64      # the compiled kernels copy a gathered field that is not cache-line aligned


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-order array whose data starts on a cache line."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def _bytes(arr: np.ndarray):
    return [arr.reshape(-1).view(np.uint8), mpi().BYTE]


class HaloExchange:
    """The ghost rows of one source field, in flight until `finish()`."""

    def __init__(self, dg, x, tag: int = TAG_FORWARD):
        plan, raw = dg.plan, dg.comm.raw
        self.dg = dg
        self.x = np.ascontiguousarray(x)
        # owned then ghost rows in one aligned buffer: the ghosts arrive in place, and the
        # kernels read it without staging a copy per launch
        if plan.n_ghost or self.x.ctypes.data % ALIGN:
            self.ext = aligned_empty((plan.n_owned + plan.n_ghost,) + self.x.shape[1:],
                                     self.x.dtype)
            self.ext[:plan.n_owned] = self.x
        else:
            self.ext = self.x
        self.ghost = self.ext[plan.n_owned:]
        self.started = time.perf_counter()
        self.requests = [raw.Irecv(_bytes(self.ghost[a:b]), source=q, tag=tag)
                         for q, a, b in plan.recv]
        self.packed = [self.x[rows] for _, rows in plan.send]   # alive until sent
        self.requests += [raw.Isend(_bytes(buf), dest=q, tag=tag)
                          for (q, _), buf in zip(plan.send, self.packed)]
        self.bytes_in = self.ghost.nbytes
        self.bytes_out = sum(b.nbytes for b in self.packed)

    def test(self) -> bool:
        """Drive MPI's progress (transfers advance only inside MPI calls)."""
        return bool(mpi().Request.Testall(self.requests)) if self.requests else True

    def owned(self) -> np.ndarray:
        """The owned rows (aligned): what the interior launches read."""
        return self.ext[:self.dg.plan.n_owned]

    def extended(self) -> np.ndarray:
        """Owned rows then ghost rows: the source field of the local relation."""
        return self.ext


def wait_exchanges(dg, exchanges: list, what: str) -> float:
    """Wait for every exchange (bounded); returns the seconds spent blocked."""
    t0 = time.perf_counter()
    dg.comm.wait([r for ex in exchanges for r in ex.requests], what)
    return time.perf_counter() - t0


def reverse_add(dg, partial: np.ndarray, what: str, tag: int = TAG_REVERSE) -> np.ndarray:
    """Owned rows of `partial` (n_owned + n_ghost rows) plus the ghost-row contributions the
    peers computed for them. `partial` is the caller's scratch (a launch's fresh result):
    its owned rows are added to in place and returned as a view, not copied."""
    plan, raw = dg.plan, dg.comm.raw
    partial = np.ascontiguousarray(partial)
    if not partial.flags.writeable:
        partial = partial.copy()
    out = partial[:plan.n_owned]
    if not plan.peers():
        return out
    bufs = [np.empty((len(rows),) + partial.shape[1:], partial.dtype) for _, rows in plan.send]
    reqs = [raw.Irecv(_bytes(buf), source=q, tag=tag) for (q, _), buf in zip(plan.send, bufs)]
    ghost = partial[plan.n_owned:]
    reqs += [raw.Isend(_bytes(ghost[a:b]), dest=q, tag=tag) for q, a, b in plan.recv]
    dg.comm.wait(reqs, what)
    for (_, rows), buf in zip(plan.send, bufs):
        out[rows] += buf     # rows are distinct within one peer
    return out


__all__ = ["HaloExchange", "wait_exchanges", "reverse_add", "aligned_empty"]
