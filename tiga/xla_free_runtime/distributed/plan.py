"""runtime/distributed: the per-call plan of a propagate over a DistributedGraph, as Task IR.

The plan is the one-launch Task IR of the propagate (the same lowering as any program, the
kernel region every launch runs; the executor's Lowering gives it, `lower.page`), expanded
over this rank's halo plan. Row numbers are the rank's local ones: owned rows [0, n_owned)
(interior rows first), then the ghost rows.

Grouped by destination (`halo_module`, overlapped):

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

Grouped by source or edge (`exchange_module`): the halo transfers, their join, one launch
over owned + ghost rows; a source-grouped result then sends its ghost rows back (kind
"halo" on the launch's result) and adds what peers sent (kind "accumulate" onto the owned
rows), the VJP's reverse halo.

Built once per (equation, graph, schedule) and cached on the graph; verified when
tg.config.check. `run.py` walks the ops.
"""
from __future__ import annotations

import dataclasses

from ...core.config import config
from ...lower.ir.base import Region, Value
from ...lower.ir.syntax import EVENT
from ...lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp

NAME = "distributed"


def read_fields(eqn) -> set:
    """Positions (among the field operands) the edge function reads."""
    return eqn.params["edge_fn"].read_inputs()


def exchanged(eqn) -> dict:
    """{field position: position whose exchange supplies it}: one exchange per distinct
    source operand read (the same value on every rank: decided by the equation alone)."""
    read, first, out = read_fields(eqn), {}, {}
    for i, (a, role) in enumerate(zip(eqn.inputs[1:], eqn.params["roles"])):
        if role == "src" and i in read:
            out[i] = first.setdefault(id(a), i)
    return out


def task_module(eqn, dg, lower) -> TaskModule:
    """The plan of `eqn` over `dg` (cached on the graph per equation and schedule); `lower`:
    the executor's Lowering, whose one-page Task module (`lower.page`) the plan unrolls."""
    plans = dg.task_plans.get(eqn)
    if plans is None:
        plans = dg.task_plans[eqn] = {}
    key = dg.overlap if eqn.params["reduce_by"] == "dst" else None
    module = plans.get(key)
    if module is None:
        build = halo_module if key is not None else exchange_module
        module = plans[key] = build(eqn, dg, lower)
        if config.check:
            module.verify()
    return module


class _Builder:
    def __init__(self, eqn, dg, lower):
        base = lower.page(eqn, NAME)
        self.task = next(op for op in base.body.ops if isinstance(op, TaskLaunchOp))
        self.args = base.body.args
        self.dg, self.plan = dg, dg.plan
        self.ops: list = []
        self.halo: list = []          # every halo event (sends included)
        self.recv: list = []          # the halo events that bring ghost rows
        self.writes: list = []
        self.results: list = []
        self.fields = [self.args[1 + i] for i in sorted(set(exchanged(eqn).values()))]

    def transfers(self) -> None:
        p = self.plan
        recv = {q: (a, b) for q, a, b in p.recv}
        for v in self.fields:
            for q in p.peers():
                a, b = recv.get(q, (0, 0))
                e = _event(f"h{q}_{v.name}")
                self.ops.append(TransferOp(e, v, (), "halo", "host", "host", 0,
                                           (p.n_owned + a, p.n_owned + b), q, b - a))
                self.halo.append(e)
                if b > a:
                    self.recv.append(e)

    def launch(self, k: int, n: int, rows: tuple, deps: tuple, kind: str,
               out_rows: tuple | None = None) -> tuple:
        """A gf_task.launch over `rows` and the write of its result rows (`out_rows`)."""
        p, comm = self.plan, self.dg.comm
        outs = tuple(Value(f"{r.name}_{kind[0]}{k}", r.type) for r in self.task.body.results)
        fin = _event(f"{kind[0]}{k}_done")
        halo = [(q, b - a) for q, a, b in p.recv] if kind == "boundary" else []
        self.ops.append(dataclasses.replace(
            self.task, results=outs + (fin,), deps=deps, task_kind=kind, page=k,
            num_pages=n, page_rows=rows, rank=comm.rank, num_ranks=comm.size,
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


def halo_module(eqn, dg, lower) -> TaskModule:
    """Destination-grouped: halo transfers, interior launches, boundary launch."""
    b = _Builder(eqn, dg, lower)
    p = dg.plan
    b.transfers()
    first = ()
    if not dg.overlap and b.halo:
        b.ops.append(JoinOp(_event("halo_in"), tuple(b.halo)))
        first = (b.ops[-1].event,)
    chunks = [rows for rows, _ in dg.interior_chunks if rows[1] > rows[0]]
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


def exchange_module(eqn, dg, lower) -> TaskModule:
    """Grouped by source (or edge): exchange, one launch over owned + ghost rows; a source
    grouping sends the ghost rows of its result back to their owners, who add them."""
    b = _Builder(eqn, dg, lower)
    p = dg.plan
    b.transfers()
    deps = ()
    if b.halo:
        b.ops.append(JoinOp(_event("halo_in"), tuple(b.halo)))
        deps = (b.ops[-1].event,)
    kind = "boundary" if b.recv else "interior"
    outs, fin = b.launch(0, 1, (0, p.n_owned), deps, kind)
    by = eqn.params["reduce_by"]
    if by != "src":       # per edge: the local edges; "all": one row, this rank's part
        b.write(outs, (fin,), 0, (0, p.num_edges if by == "edge" else 1))
        return b.finish()
    recv = {q: (a, c) for q, a, c in p.recv}
    for o in outs:
        back = []
        for q in p.peers():
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


__all__ = ["task_module", "halo_module", "exchange_module", "exchanged", "read_fields"]
