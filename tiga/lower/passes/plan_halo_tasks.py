"""lower/passes: Task -> Task: one rank's halo plan of a propagate over a partitioned relation.

Input: the one-launch Task module of the propagate (plan_distributed_tasks over a CSR relation:
its kernel region is what every launch here runs) and this rank's share of the partition as
plain numbers: owned rows [0, n_owned) with the interior rows (those reading no ghost) first,
then the ghost rows, `recv` ((peer, first ghost, stop ghost), ...), the peers exchanged with,
and the interior row ranges launched one by one (MPI progresses only inside MPI calls, so the
runtime tests the exchange between them). Row numbers are the rank's local ones.

Grouped by destination (`reduce_by="dst"`, `overlap`):

    per source field read, per peer rank q:
        gf_storage.transfer  kind "halo", peer q, ghosts: q's rows arriving here, rows: where
                             they land ([n_owned + a, n_owned + b)); the owned rows q reads
                             are packed and sent by the same op
    (communicate-then-compute: gf_storage.join of every halo event here)
    per interior chunk k:    gf_task.launch task_kind "interior", page_rows [a, b) (reads
                             owned rows only: runs while the halo is in flight)
                             gf_storage.transfer kind "write": its rows of the result
    the boundary rows:       gf_task.launch task_kind "boundary" waiting on the halo events
                             of the peers it reads; its write
    gf_storage.join of the writes and every halo (the sends too), then the releases.

Grouped by source or edge: the halo transfers, their join, one launch over owned + ghost
rows; a source-grouped result then sends its ghost rows back (kind "halo" on the launch's
result) and adds what peers sent (kind "accumulate" onto the owned rows), the VJP's reverse
halo. The runtime's halo handlers (xla_free_runtime/distributed/run.py) run the ops.
"""
from __future__ import annotations

import dataclasses

from ..binding import HaloLayout
from ..ir.base import Region, Value
from ..ir.syntax import EVENT
from ..ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp

NAME = "distributed"


def plan_halo_tasks(base: TaskModule, layout: HaloLayout, *, reduce_by: str) -> TaskModule:
    """The halo plan of the propagate `base` runs (its one-launch Task module) on one rank,
    whose share of the partition is `layout` (binding.HaloLayout: its sizes, each peer's
    ghost rows, the interior row ranges, one launch each; the source fields exchanged, one
    exchange per distinct operand read; whether interior launches run while the halo is in
    flight, else communicate, then compute: destination-grouped only)."""
    b = _Builder(base, layout, layout.fields)
    if reduce_by == "dst":
        return _halo(b, layout.overlap)
    return _exchange(b, reduce_by)


class _Builder:
    def __init__(self, base: TaskModule, share: HaloLayout, fields: tuple):
        self.task = next(op for op in base.body.ops if isinstance(op, TaskLaunchOp))
        self.args = base.body.args
        self.share = share
        self.ops: list = []
        self.halo: list = []          # every halo event (sends included)
        self.recv: list = []          # the halo events that bring ghost rows
        self.writes: list = []
        self.results: list = []
        self.fields = [self.args[1 + i] for i in sorted(set(fields))]

    def transfers(self) -> None:
        p = self.share
        recv = {q: (a, b) for q, a, b in p.recv}
        for v in self.fields:
            for q in p.peers:
                a, b = recv.get(q, (0, 0))
                e = _event(f"h{q}_{v.name}")
                self.ops.append(TransferOp(e, v, (), "halo", "host", "host", 0,
                                           (p.n_owned + a, p.n_owned + b), q, b - a))
                self.halo.append(e)
                if b > a:
                    self.recv.append(e)

    def launch(self, k: int, n: int, rows: tuple, deps: tuple, kind: str) -> tuple:
        """A gf_task.launch over `rows`: its result values and completion event."""
        p = self.share
        outs = tuple(Value(f"{r.name}_{kind[0]}{k}", r.type) for r in self.task.body.results)
        fin = _event(f"{kind[0]}{k}_done")
        halo = [(q, b - a) for q, a, b in p.recv] if kind == "boundary" else []
        self.ops.append(dataclasses.replace(
            self.task, results=outs + (fin,), deps=deps, task_kind=kind, page=k,
            num_pages=n, page_rows=rows, rank=p.rank, num_ranks=p.num_ranks,
            halo_ranks=tuple(q for q, _ in halo), halo_ghosts=tuple(g for _, g in halo)))
        self.results.extend(outs)
        return outs, fin

    def write(self, outs: tuple, deps: tuple, k: int, rows: tuple, kind: str = "write"
              ) -> None:
        """Each result's rows stored into (kind "accumulate": added onto) the result."""
        for o in outs:
            w = _event(f"{o.name}_w")
            self.ops.append(TransferOp(w, o, deps, kind, "host", "host", k, rows))
            self.writes.append(w)

    def finish(self) -> TaskModule:
        """Join the writes and every halo transfer (sends too); release the operands."""
        done = tuple(self.writes) + tuple(self.halo)
        if done:
            end = _event("call_done")
            self.ops.append(JoinOp(end, done))
            self.ops += [ReleaseOp(v, (end,), "host") for v in self.args]
        return TaskModule(NAME, Region(self.args, tuple(self.ops), tuple(self.results)))


def _halo(b: _Builder, overlap: bool) -> TaskModule:
    """Destination-grouped: halo transfers, interior launches, boundary launch."""
    p = b.share
    b.transfers()
    first = ()
    if not overlap and b.halo:
        b.ops.append(JoinOp(_event("halo_in"), tuple(b.halo)))
        first = (b.ops[-1].event,)
    chunks = [rows for rows in p.chunks if rows[1] > rows[0]]
    boundary = p.n_owned > p.n_interior
    n = len(chunks) + boundary
    for k, rows in enumerate(chunks):
        outs, fin = b.launch(k, n, rows, first, "interior")
        b.write(outs, (fin,), k, rows)
    if boundary:
        rows = (p.n_interior, p.n_owned)
        # no source field read: the boundary rows need no ghost either
        kind = "boundary" if b.recv else "interior"
        outs, fin = b.launch(len(chunks), n, rows, tuple(b.recv) or first, kind)
        b.write(outs, (fin,), len(chunks), rows)
    return b.finish()


def _exchange(b: _Builder, by: str) -> TaskModule:
    """Grouped by source (or edge): exchange, one launch over owned + ghost rows; a source
    grouping sends the ghost rows of its result back to their owners, who add them."""
    p = b.share
    b.transfers()
    deps = ()
    if b.halo:
        b.ops.append(JoinOp(_event("halo_in"), tuple(b.halo)))
        deps = (b.ops[-1].event,)
    kind = "boundary" if b.recv else "interior"
    outs, fin = b.launch(0, 1, (0, p.n_owned), deps, kind)
    if by != "src":       # per edge: the local edges; "all": one row, this rank's part
        b.write(outs, (fin,), 0, (0, p.num_edges if by == "edge" else 1))
        return b.finish()
    recv = {q: (a, c) for q, a, c in p.recv}
    for o in outs:
        back = []
        for q in p.peers:
            a, c = recv.get(q, (0, 0))
            e = _event(f"r{q}_{o.name}")
            b.ops.append(TransferOp(e, o, (fin,), "halo", "host", "host", 0,
                                    (p.n_owned + a, p.n_owned + c), q, c - a))
            b.halo.append(e)
            back.append(e)
        b.write((o,), (fin,) + tuple(back), 0, (0, p.n_owned), "accumulate")
    return b.finish()


def _event(name: str) -> Value:
    return Value(name, EVENT)


__all__ = ["plan_halo_tasks"]
