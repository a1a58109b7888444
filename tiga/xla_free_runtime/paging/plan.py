"""runtime: the page plan of a paged propagate as a Task-IR module, and its walk.

The plan is the one-page Task IR of the kernel that runs on every page (the propagate over a
CSR relation, lowered through the same stages as any program by the executor's Lowering,
`lower.page`, handed to `page_module`), unrolled over the pages:

    per page k:  gf_storage.transfer  relation rows [a, b) (disk -> host, kind "page")
                 gf_storage.transfer  each field: its rows (kind "page"), or the distinct
                                      rows the page reads (kind "gather")
                 gf_task.launch       the kernel region, task_kind "page", page_rows [a, b)
                 gf_storage.transfer  the page's output rows into the result (kind "write",
                                      or "accumulate" for a sum over all edges)
    then:        gf_storage.release   the operands after the last page; gf_storage.join

`paging._PagedRun` interprets it: the prefetch thread walks the transfers into the host
(page by page, ahead of compute), the calling thread walks the launches and the writes.
Page buffers are private to their page and freed when its write has run.
"""
from __future__ import annotations

import dataclasses

from ...lower.ir.base import Region, Value
from ...lower.ir.kernel import LaunchOp
from ...lower.ir.syntax import EVENT
from ...lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp


def page_module(walk, tasks, roles: tuple, tiers: list, result_tier: str,
                relation_tier: str = "disk", name: str = "paged",
                threads: int | None = None, *, lower) -> TaskModule:
    """The page plan: `roles` are the propagate's field roles (as called, not swapped),
    `tiers` each field's tier ("host", "disk" or "param"), `relation_tier` where the
    relation's rows are read from (a store on disk, a relation held in memory), `threads`
    the threads a page's kernel runs on (the loaders take the other cores), `lower` the
    executor's Lowering (its `page(eqn, name)`: the one-page Task module, memoised there)."""
    base = lower.page(walk.eqn, name)
    task = next(op for op in base.body.ops if isinstance(op, TaskLaunchOp))
    if threads is not None:
        task = _with_threads(task, threads)
    args = base.body.args
    relation, fields = args[0], args[1:]
    by = walk.eqn.params["reduce_by"]
    ops, results, done = [], [], []
    ready = {}
    for v, role in zip(fields, roles):        # parameters: one transfer before page 0
        if role == "param":
            ready[v.name] = _event(f"pp_{v.name}")
            ops.append(TransferOp(ready[v.name], v, (), "page", "host", "host", 0,
                                  (0, _lead(v))))
    n = len(tasks)
    for t in tasks:
        k, rows = t.index, tuple(t.rows)
        deps = [_event(f"p{k}_{relation.name}")]
        ops.append(TransferOp(deps[0], relation, (), "page", relation_tier, "host", k, rows))
        for v, role, tier in zip(fields, roles, tiers):
            if role == "param":
                deps.append(ready[v.name])
                continue
            kind, at = _field_transfer(role, walk, t)
            e = _event(f"p{k}_{v.name}")
            ops.append(TransferOp(e, v, (), kind, tier, "host", k, at))
            deps.append(e)
        outs = tuple(Value(f"{r.name}_p{k}", r.type) for r in task.body.results)
        fin = _event(f"p{k}_done")
        ops.append(dataclasses.replace(
            task, results=outs + (fin,), deps=tuple(deps), task_kind="page", page=k,
            num_pages=n, page_rows=rows))
        for o in outs:
            w = _event(f"p{k}_{o.name}_w")
            kind = "accumulate" if by == "all" else "write"
            at = tuple(t.edges) if by == "edge" else (0, 1) if by == "all" else rows
            ops.append(TransferOp(w, o, (fin,), kind, "host", result_tier, k, at))
            done.append(w)
        results.extend(outs)
    last = tuple(done[-1:]) or ()
    for v in args:
        if last:
            ops.append(ReleaseOp(v, last, "host"))
    if done:
        ops.append(JoinOp(_event("pages_done"), tuple(done)))
    return TaskModule(name, Region(args, tuple(ops), tuple(results)))


def _with_threads(task: TaskLaunchOp, threads: int) -> TaskLaunchOp:
    """`task` with its kernel launches scheduled on `threads` threads (where they have a
    thread count: cpu-llvm)."""
    ops = tuple(dataclasses.replace(op, schedule=dataclasses.replace(op.schedule,
                                                                     threads=threads))
                if isinstance(op, LaunchOp) and op.schedule.threads is not None else op
                for op in task.body.ops)
    return dataclasses.replace(task, body=dataclasses.replace(task.body, ops=ops))


def kernel_launch(module: TaskModule):
    """The gf_kernel.launch every page runs (page 0's), or None (no pages)."""
    for op in module.body.ops:
        if isinstance(op, TaskLaunchOp):
            return next((k for k in op.body.ops if isinstance(k, LaunchOp)), None)
    return None


def describe_plan(module: TaskModule) -> str:
    """explain()'s line on a page plan, counted off its Task IR (what ir("task") prints)."""
    ops = module.body.ops
    pages = [op for op in ops if isinstance(op, TaskLaunchOp)]
    moves: dict = {}
    for op in ops:
        if isinstance(op, TransferOp):
            key = f"{op.kind} {op.src_tier} -> {op.dst_tier}"
            moves[key] = moves.get(key, 0) + 1
    n = pages[0].num_pages if pages else 0
    releases = sum(isinstance(op, ReleaseOp) for op in ops)
    return (f"the runtime walks the page plan @{module.name} (the Task IR ir(\"task\") "
            f"prints): {len(pages)} gf_task.launch of task_kind page (pages 0 to {n - 1} of "
            f"{n}), transfers {', '.join(f'{c} {k}' for k, c in sorted(moves.items()))}, "
            f"{releases} release(s), then a join")


def _field_transfer(role: str, walk, t) -> tuple:
    """(kind, rows) of a field's transfer for page `t`."""
    if role == walk.rows:
        return "page", tuple(t.rows)
    if role == "edge" and walk.edge_perm is None:
        return "page", tuple(t.edges)
    return "gather", tuple(t.rows)      # distinct endpoint rows / the page's edges by id


def _event(name: str) -> Value:
    return Value(name, EVENT)


def _lead(v: Value):
    shape = getattr(v.type, "shape", ())
    return shape[0] if shape else 1


def steps(module: TaskModule) -> list:
    """The plan as the interpreter walks it: per page, in op order, (transfers into the
    host, its task, its writes). Parameters transferred before page 0 count as page 0's."""
    pages: dict = {}
    for op in module.body.ops:
        if isinstance(op, TaskLaunchOp):
            pages.setdefault(op.page, ([], [], []))[1].append(op)
        elif isinstance(op, TransferOp):
            out = op.kind in ("write", "accumulate")
            pages.setdefault(op.page, ([], [], []))[2 if out else 0].append(op)
    return [pages[k] for k in sorted(pages)]


__all__ = ["page_module", "steps", "kernel_launch", "describe_plan"]
