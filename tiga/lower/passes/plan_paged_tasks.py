"""lower/passes: Task -> Task: the page plan of a paged propagate, software-pipelined.

The input is the one-page Task module of the propagate (the kernel region every page runs,
lowered through the same stages as any program); the output unrolls it over the pages:

    per page k:  gf_storage.transfer  relation rows [a, b) (kind "page", stream s)
                 gf_storage.transfer  each field: its rows (kind "page"), or the distinct
                                      rows the page reads (kind "gather"), stream s
                 gf_task.launch       the kernel region, task_kind "page", page_rows [a, b)
                 gf_storage.transfer  the page's output rows into the result (kind "write",
                                      or "accumulate" for a sum over all edges)
    first:       gf_storage.transfer  each parameter, once (no stream: read where it is)
    then:        gf_storage.release   the operands after the last page; gf_storage.join

With a device tier (`device="device"`: the Triton route on a GPU), the kernel reads its
buffers there: each page's loaded buffers are copied host -> device (gf_storage.transfer kind
"page", on one more stream, the device's, after the loader streams), each depending on the
loader transfer it copies, and the page's launch waits on those copies; the next page's copies
are issued before the current page's launch (double-buffered: the copy of page k + 1 overlaps
the kernel of page k), the parameters are copied once, and the results are written from the
device (src_tier "device"); the device copies are released after the last page.

A stream is a loader: its transfers run in op order on one thread, so each loader walks its
own contiguous run of pages (a chunk shared by two neighbouring pages is decoded once, by the
loader that reads both). Launches take the runs in turn, and each page's transfers are
placed `lookahead` launches ahead of its own launch: the interpreter, walking the ops in
order, keeps that many pages loading while one computes, and never waits on a page whose
loads were issued after a later page's (what bounds the buffers in flight). A sum over all
edges is one run in plan order (the pages add up in the same order on every run).
"""
from __future__ import annotations

import dataclasses

from ..ir.base import Region, Value
from ..ir.kernel import LaunchOp
from ..ir.syntax import EVENT
from ..ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp


def plan_paged_tasks(base: TaskModule, pages, roles: tuple, tiers: tuple, *, walked: str,
                     edges_in_order: bool, reduce_by: str, result_tier: str,
                     relation_tier: str = "disk", name: str = "paged",
                     threads: int | None = None, loaders: int = 1,
                     lookahead: int = 4, device: str | None = None,
                     schedule=None) -> TaskModule:
    """The page plan. `pages`: (index, rows, edges) of each page ([a, b) of the walked rows
    and of the stored edges); `roles`: the field roles the page kernel reads (as called);
    `tiers`: each field's tier ("host", "disk" or "param"); `walked`: the role of the rows
    a page walks ("dst", or "src" over the transposed relation), the other endpoint is
    gathered; `edges_in_order`: edge fields are stored in walked order (else gathered by
    id); `threads`: the threads a page's kernel runs on (the loaders take the other cores);
    `loaders`: streams; `lookahead`: launches a page's transfers run ahead of its own;
    `device`: the tier the kernel reads its page buffers from (None: the host page
    buffers); `schedule`: the kernel schedule of the target the pages run on (None: the
    base module's)."""
    task = next(op for op in base.body.ops if isinstance(op, TaskLaunchOp))
    if threads is not None or schedule is not None:
        task = _with_schedule(task, threads, schedule)
    pages = [(int(k), tuple(rows), tuple(edges)) for k, rows, edges in pages]
    order, stream = _launch_order(pages, 1 if reduce_by == "all" else loaders)
    if device is not None:
        lookahead = max(1, lookahead)   # (a page's copies follow its loads, issued earlier)
    p = _Planner(base.body.args, roles, tiers, walked, edges_in_order, relation_tier, stream,
                 device)
    for page in order[:lookahead]:
        p.transfers(page)
    if device is not None and order:
        p.copies(order[0])
    for i, page in enumerate(order):
        if i + lookahead < len(order):
            p.transfers(order[i + lookahead])
        if device is not None and i + 1 < len(order):
            p.copies(order[i + 1])       # (before this page's launch: overlaps its kernel)
        p.launch(task, page, len(pages), reduce_by, result_tier)
    return p.finish(name)


class _Planner:
    """The ops of a page plan, in order, and the events they wait on."""

    def __init__(self, args, roles, tiers, walked, edges_in_order, relation_tier, stream,
                 device=None):
        self.args, self.roles, self.tiers, self.stream = args, roles, tiers, stream
        self.walked, self.edges_in_order = walked, edges_in_order
        self.relation_tier, self.device = relation_tier, device
        # the device's copies: one more stream, after the loaders'
        self.device_stream = max(stream.values(), default=-1) + 1
        self.ops, self.results, self.done, self.ready, self.issued = [], [], [], {}, {}
        self.loads: dict = {}    # page -> [(value, rows or None: a parameter, its event)]
        for v, role in zip(args[1:], roles):     # parameters: one transfer before page 0
            if role == "param":
                self.ready[v.name] = Value(f"pp_{v.name}", EVENT)
                self.ops.append(TransferOp(self.ready[v.name], v, (), "page", "host", "host",
                                           0, (0, _lead(v))))
                if device is not None:     # and one copy to the device
                    host, self.ready[v.name] = self.ready[v.name], Value(f"pd_{v.name}", EVENT)
                    self.ops.append(TransferOp(self.ready[v.name], v, (host,), "page", "host",
                                               device, 0, (0, _lead(v)),
                                               stream=self.device_stream))

    def transfers(self, page) -> None:
        """A page's loads on its stream: the relation's rows, then each field's."""
        (k, rows, edges), relation, s = page, self.args[0], self.stream[page[0]]
        loads = self.loads[k] = [(relation, rows, Value(f"p{k}_{relation.name}", EVENT))]
        self.ops.append(TransferOp(loads[0][2], relation, (), "page", self.relation_tier,
                                   "host", k, rows, stream=s))
        for v, role, tier in zip(self.args[1:], self.roles, self.tiers):
            if role == "param":
                loads.append((v, None, self.ready[v.name]))
                continue
            kind, at = (("page", rows) if role == self.walked else
                ("page", edges) if role == "edge" and self.edges_in_order else
                ("gather", rows))
            loads.append((v, at, Value(f"p{k}_{v.name}", EVENT)))
            self.ops.append(TransferOp(loads[-1][2], v, (), kind, tier, "host", k, at,
                                       stream=s))
        self.issued[k] = tuple(event for _, _, event in loads)

    def copies(self, page) -> None:
        """A page's loaded buffers host -> device on the device's stream, each after its
        load; its launch waits on these (and on the parameters' one device copy)."""
        k, deps = page[0], []
        for v, at, loaded in self.loads.pop(k):
            if at is None:
                deps.append(loaded)
                continue
            deps.append(Value(f"d{k}_{v.name}", EVENT))
            self.ops.append(TransferOp(deps[-1], v, (loaded,), "page", "host", self.device, k,
                                       at, stream=self.device_stream))
        self.issued[k] = tuple(deps)

    def launch(self, task, page, num_pages: int, reduce_by: str, result_tier: str) -> None:
        """A page's kernel region, then its writes into the result (from the device, when
        the kernel ran there)."""
        k, rows, edges = page
        outs = tuple(Value(f"{r.name}_p{k}", r.type) for r in task.body.results)
        fin = Value(f"p{k}_done", EVENT)
        self.ops.append(dataclasses.replace(
            task, results=outs + (fin,), deps=self.issued[k], task_kind="page", page=k,
            num_pages=num_pages, page_rows=rows))
        kind = "accumulate" if reduce_by == "all" else "write"
        at = edges if reduce_by == "edge" else (0, 1) if reduce_by == "all" else rows
        for o in outs:
            self.done.append(Value(f"p{k}_{o.name}_w", EVENT))
            self.ops.append(TransferOp(self.done[-1], o, (fin,), kind, self.device or "host",
                                       result_tier, k, at))
        self.results.extend(outs)

    def finish(self, name: str) -> TaskModule:
        if self.done:
            last = tuple(self.done[-1:])
            self.ops.extend(ReleaseOp(v, last, "host") for v in self.args)
            if self.device is not None:
                self.ops.extend(ReleaseOp(v, last, self.device) for v in self.args)
            self.ops.append(JoinOp(Value("pages_done", EVENT), tuple(self.done)))
        return TaskModule(name, Region(self.args, tuple(self.ops), tuple(self.results)))


def _launch_order(pages: list, loaders: int) -> tuple:
    """(pages in launch order, page index -> stream): `loaders` contiguous runs of pages,
    taken in turn."""
    n = max(1, min(loaders, len(pages)))
    cuts = [len(pages) * i // n for i in range(n + 1)]
    runs = [pages[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    stream = {p[0]: s for s, run in enumerate(runs) for p in run}
    order = [run[i] for i in range(max(map(len, runs), default=0)) for run in runs
             if i < len(run)]
    return order, stream


def _with_schedule(task: TaskLaunchOp, threads: int | None, schedule) -> TaskLaunchOp:
    """`task` with its kernel launches scheduled by `schedule` (the target the pages run on:
    the same kernel region, the schedule its backend rendered) when given, and on `threads`
    threads (where the schedule has a thread count: cpu-llvm)."""
    def scheduled(s):
        s = schedule if schedule is not None else s
        return (dataclasses.replace(s, threads=threads)
            if threads is not None and s.threads is not None else s)

    ops = tuple(dataclasses.replace(op, schedule=scheduled(op.schedule))
                if isinstance(op, LaunchOp) else op for op in task.body.ops)
    return dataclasses.replace(task, body=dataclasses.replace(task.body, ops=ops))


def _lead(v: Value):
    shape = getattr(v.type, "shape", ())
    return shape[0] if shape else 1


__all__ = ["plan_paged_tasks"]
