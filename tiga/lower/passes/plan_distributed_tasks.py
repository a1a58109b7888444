"""lower/passes: Kernel -> Task/Storage: readiness events, tasks, releases.

The plan is for one page and one rank (the whole relation, on the host): every argument
(and constant relation) is transferred as one page, each top-level kernel launch becomes a
`gf_task.launch` that waits on the events of the values it reads, every value (a transferred
copy or an intermediate) is released after its last reader, and a final join marks
completion. A release waits on the events of the tasks that read the value, else on the event
that made it ready; a value computed and read only by tensor ops has no event and is released
in program order. Paged and multi-rank plans use the same ops with more pages, halo transfers
and boundary tasks.
"""
from __future__ import annotations

from ...core.config import config
from ..ir.base import Region, RelationOp, Value
from ..ir.kernel import KernelModule, LaunchOp
from ..ir.syntax import EVENT
from ..ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp
from .common import Namer, expect_level


def _lead(v: Value):
    t = v.type
    if hasattr(t, "num_dst"):
        return t.num_dst
    return t.shape[0] if t.shape else 1


def _unique(values) -> tuple:
    seen, out = set(), []
    for v in values:
        if v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return tuple(out)


class _Planner:
    def __init__(self, body: Region):
        taken = [a.name for a in body.args] + [v.name for op in body.ops for v in op.results]
        self.namer = Namer(taken)
        self.body = body
        self.ops: list = []
        self.ready: dict[str, Value] = {}      # value name -> event that makes it ready
        self.values: dict[str, Value] = {a.name: a for a in body.args}
        self.readers: dict[str, list] = {}     # value name -> events of the tasks reading it
        self.tasks: list = []
        self.n_events = 0

    def event(self) -> Value:
        while f"e{self.n_events}" in self.namer.used:
            self.n_events += 1
        return Value(self.namer.fresh(f"e{self.n_events}"), EVENT)

    def transfer(self, v: Value) -> None:
        e = self.event()
        self.ops.append(TransferOp(e, v, (), "page", "host", "host", 0, (0, _lead(v))))
        self.ready[v.name] = e

    def task(self, op: LaunchOp) -> TaskLaunchOp:
        inputs = _unique(op.operands)
        deps = _unique(self.ready[v.name] for v in inputs if v.name in self.ready)
        done = self.event()
        g = op.comp.relation.type
        rows = g.num_src if op.ordering == "source-major" else g.num_dst
        body = Region(inputs, (op,), op.results)
        t = TaskLaunchOp(op.results + (done,), deps, inputs, body, "interior", 0, 1, (0, rows),
                         0, 1, (), (), tuple(v.name for v in inputs),
                         tuple(v.name for v in op.results))
        for v in inputs:
            self.readers.setdefault(v.name, []).append(done)
        for v in op.results:
            self.ready[v.name] = done
        self.tasks.append(done)
        return t

    def release_after(self, names: list) -> None:
        for name in names:
            v = self.values.get(name)
            if v is not None and v.type != EVENT:
                ready = (self.ready[name],) if name in self.ready else ()
                deps = _unique(self.readers.get(name, ())) or ready
                self.ops.append(ReleaseOp(v, deps, "host"))

    def dying(self) -> dict:
        """{top-level op index: names of the values last used there} (-1: unused
        arguments); returned values stay."""
        last_use = {a.name: -1 for a in self.body.args}
        for i, op in enumerate(self.body.ops):
            for v in op.results:
                last_use[v.name] = i
        for i, op in enumerate(self.body.ops):
            for v in op.operands:
                last_use[v.name] = i
        for v in self.body.results:
            last_use.pop(v.name, None)
        by_index: dict = {}
        for name, i in last_use.items():
            by_index.setdefault(i, []).append(name)
        return by_index

    def plan(self) -> Region:
        dying = self.dying()
        for a in self.body.args:
            self.transfer(a)
        self.release_after(dying.get(-1, ()))
        for i, op in enumerate(self.body.ops):
            self.ops.append(self.task(op) if isinstance(op, LaunchOp) else op)
            if isinstance(op, RelationOp):
                self.transfer(op.result)
            self.values.update((v.name, v) for v in op.results)
            self.release_after(dying.get(i, ()))
        if self.tasks:
            self.ops.append(JoinOp(self.event(), tuple(self.tasks)))
        return Region(self.body.args, tuple(self.ops), self.body.results)


def plan_distributed_tasks(module: KernelModule) -> TaskModule:
    expect_level(module, KernelModule, "plan-distributed-tasks")
    out = TaskModule(module.name, _Planner(module.body).plan())
    if config.check:     # (TIGA_CHECK, on in tests: a warm first call skips it, as the
        out.verify()     # other lowering passes do)
    return out
