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
                     lookahead: int = 4) -> TaskModule:
    """The page plan. `pages`: (index, rows, edges) of each page ([a, b) of the walked rows
    and of the stored edges); `roles`: the field roles the page kernel reads (as called);
    `tiers`: each field's tier ("host", "disk" or "param"); `walked`: the role of the rows
    a page walks ("dst", or "src" over the transposed relation), the other endpoint is
    gathered; `edges_in_order`: edge fields are stored in walked order (else gathered by
    id); `threads`: the threads a page's kernel runs on (the loaders take the other cores);
    `loaders`: streams; `lookahead`: launches a page's transfers run ahead of its own."""
    task = next(op for op in base.body.ops if isinstance(op, TaskLaunchOp))
    if threads is not None:
        task = _with_threads(task, threads)
    args = base.body.args
    relation, fields = args[0], args[1:]
    pages = [(int(k), tuple(rows), tuple(edges)) for k, rows, edges in pages]
    order, stream = _launch_order(pages, 1 if reduce_by == "all" else loaders)
    ops, results, done, ready = [], [], [], {}
    for v, role in zip(fields, roles):        # parameters: one transfer before page 0
        if role == "param":
            ready[v.name] = Value(f"pp_{v.name}", EVENT)
            ops.append(TransferOp(ready[v.name], v, (), "page", "host", "host", 0,
                                  (0, _lead(v))))

    def transfers(page) -> None:
        k, rows, edges = page
        deps = [Value(f"p{k}_{relation.name}", EVENT)]
        ops.append(TransferOp(deps[0], relation, (), "page", relation_tier, "host", k, rows,
                              stream=stream[k]))
        for v, role, tier in zip(fields, roles, tiers):
            if role == "param":
                deps.append(ready[v.name])
                continue
            kind, at = ("page", rows) if role == walked else \
                ("page", edges) if role == "edge" and edges_in_order else ("gather", rows)
            deps.append(Value(f"p{k}_{v.name}", EVENT))
            ops.append(TransferOp(deps[-1], v, (), kind, tier, "host", k, at,
                                  stream=stream[k]))
        issued[k] = tuple(deps)

    issued: dict = {}
    for page in order[:lookahead]:
        transfers(page)
    for i, (k, rows, edges) in enumerate(order):
        if i + lookahead < len(order):
            transfers(order[i + lookahead])
        outs = tuple(Value(f"{r.name}_p{k}", r.type) for r in task.body.results)
        fin = Value(f"p{k}_done", EVENT)
        ops.append(dataclasses.replace(
            task, results=outs + (fin,), deps=issued[k], task_kind="page", page=k,
            num_pages=len(pages), page_rows=rows))
        for o in outs:
            w = Value(f"p{k}_{o.name}_w", EVENT)
            kind = "accumulate" if reduce_by == "all" else "write"
            at = edges if reduce_by == "edge" else (0, 1) if reduce_by == "all" else rows
            ops.append(TransferOp(w, o, (fin,), kind, "host", result_tier, k, at))
            done.append(w)
        results.extend(outs)
    if done:
        ops.extend(ReleaseOp(v, tuple(done[-1:]), "host") for v in args)
        ops.append(JoinOp(Value("pages_done", EVENT), tuple(done)))
    return TaskModule(name, Region(args, tuple(ops), tuple(results)))


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


def _with_threads(task: TaskLaunchOp, threads: int) -> TaskLaunchOp:
    """`task` with its kernel launches scheduled on `threads` threads (where they have a
    thread count: cpu-llvm)."""
    ops = tuple(dataclasses.replace(op, schedule=dataclasses.replace(op.schedule,
                                                                     threads=threads))
                if isinstance(op, LaunchOp) and op.schedule.threads is not None else op
                for op in task.body.ops)
    return dataclasses.replace(task, body=dataclasses.replace(task.body, ops=ops))


def _lead(v: Value):
    shape = getattr(v.type, "shape", ())
    return shape[0] if shape else 1


__all__ = ["plan_paged_tasks"]
