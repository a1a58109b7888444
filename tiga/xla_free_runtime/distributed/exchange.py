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
    """The ghost rows of one source field, in flight until waited on. `start(peer)` posts
    one peer's transfers (a `gf_storage.transfer` of kind "halo" of the plan); with
    `start=True` every peer's are posted at once."""

    def __init__(self, dg, x, tag: int = TAG_FORWARD, start: bool = True,
                 compact: np.ndarray | None = None):
        plan = dg.plan
        self.dg, self.tag = dg, tag
        self.x = np.ascontiguousarray(x)
        self.compact = compact is not None and not self.x.ctypes.data % ALIGN
        if self.compact:
            # the owned rows the boundary rows read, then the ghosts (dg.compact): the
            # interior launches read x itself
            self.ext = aligned_empty((len(compact) + plan.n_ghost,) + self.x.shape[1:],
                                     self.x.dtype)
            np.take(self.x, compact, axis=0, out=self.ext[:len(compact)])
            self.ghost = self.ext[len(compact):]
        # owned then ghost rows in one aligned buffer: the ghosts arrive in place, and the
        # kernels read it without staging a copy per launch
        elif plan.n_ghost or self.x.ctypes.data % ALIGN:
            self.ext = aligned_empty((plan.n_owned + plan.n_ghost,) + self.x.shape[1:],
                                     self.x.dtype)
            self.ext[:plan.n_owned] = self.x
        else:
            self.ext = self.x
        if not self.compact:
            self.ghost = self.ext[plan.n_owned:]
        self.started = time.perf_counter()
        self.by_peer: dict = {}
        self.packed: dict = {}          # alive until sent
        self.bytes_in = 0
        self.bytes_out = 0
        if start:
            for q in plan.peers():
                self.start(q)

    @property
    def requests(self) -> list:
        return [r for reqs in self.by_peer.values() for r in reqs]

    def start(self, peer: int) -> list:
        """Post the receive of `peer`'s ghost rows and the send of the owned rows it reads;
        returns those requests."""
        plan, raw = self.dg.plan, self.dg.comm.raw
        reqs = []
        for q, a, b in plan.recv:
            if q == peer:
                reqs.append(raw.Irecv(_bytes(self.ghost[a:b]), source=q, tag=self.tag))
                self.bytes_in += self.ghost[a:b].nbytes
        for q, rows in plan.send:
            if q == peer:
                buf = self.packed[q] = self.x[rows]
                reqs.append(raw.Isend(_bytes(buf), dest=q, tag=self.tag))
                self.bytes_out += buf.nbytes
        self.by_peer[peer] = reqs
        return reqs

    def test(self) -> bool:
        """Drive MPI's progress (transfers advance only inside MPI calls)."""
        reqs = self.requests
        return bool(mpi().Request.Testall(reqs)) if reqs else True

    def owned(self) -> np.ndarray:
        """The owned rows (aligned): what the interior launches read."""
        return self.x if self.compact else self.ext[:self.dg.plan.n_owned]

    def extended(self) -> np.ndarray:
        """Owned rows then ghost rows: the source field of the local relation (compact:
        of dg.compact's boundary relation)."""
        return self.ext


def wait_exchanges(dg, exchanges: list, what: str) -> float:
    """Wait for every exchange (bounded); returns the seconds spent blocked."""
    t0 = time.perf_counter()
    dg.comm.wait([r for ex in exchanges for r in ex.requests], what)
    return time.perf_counter() - t0


class ReverseAdd:
    """The ghost rows of `partial` (n_owned + n_ghost rows: a launch's fresh result) on their
    way back to their owners, and the contributions peers send for this rank's rows.
    `start(peer)` posts one peer's transfers; `finish()` (after the wait) adds what arrived
    onto the owned rows, in place, and returns them as a view."""

    def __init__(self, dg, partial: np.ndarray, tag: int = TAG_REVERSE):
        self.dg, self.tag = dg, tag
        partial = np.ascontiguousarray(partial)
        if not partial.flags.writeable:
            partial = partial.copy()
        self.partial = partial
        self.bufs = {q: np.empty((len(rows),) + partial.shape[1:], partial.dtype)
                     for q, rows in dg.plan.send}
        self.by_peer: dict = {}

    @property
    def requests(self) -> list:
        return [r for reqs in self.by_peer.values() for r in reqs]

    def start(self, peer: int) -> list:
        plan, raw = self.dg.plan, self.dg.comm.raw
        reqs = []
        if peer in self.bufs:
            reqs.append(raw.Irecv(_bytes(self.bufs[peer]), source=peer, tag=self.tag))
        ghost = self.partial[plan.n_owned:]
        reqs += [raw.Isend(_bytes(ghost[a:b]), dest=q, tag=self.tag)
                 for q, a, b in plan.recv if q == peer]
        self.by_peer[peer] = reqs
        return reqs

    def finish(self) -> np.ndarray:
        plan = self.dg.plan
        out = self.partial[:plan.n_owned]
        for q, rows in plan.send:
            if q in self.by_peer:
                out[rows] += self.bufs[q]     # rows are distinct within one peer
        return out


def reverse_add(dg, partial: np.ndarray, what: str, tag: int = TAG_REVERSE) -> np.ndarray:
    """Owned rows of `partial` (n_owned + n_ghost rows) plus the ghost-row contributions the
    peers computed for them. `partial` is the caller's scratch (a launch's fresh result):
    its owned rows are added to in place and returned as a view, not copied."""
    rev = ReverseAdd(dg, partial, tag)
    for q in dg.plan.peers():
        rev.start(q)
    dg.comm.wait(rev.requests, what)
    return rev.finish()


__all__ = ["HaloExchange", "ReverseAdd", "wait_exchanges", "reverse_add", "aligned_empty"]
