"""runtime: the page plan of a paged propagate as a Task-IR module.

The plan is the one-page Task IR of the kernel that runs on every page (the propagate over a
CSR relation, lowered through the same stages as any program, with the call's signature: the
executor hands the module down), unrolled over the pages by the lowering pass
lower/passes/plan_paged_tasks: per page, the relation's rows and each field's rows or gathered
distinct rows (transfers on the page's loader stream, issued a few launches ahead), the kernel
region (task_kind "page"), the page's writes into the result; the releases and a join last. On
the Triton route with a device tier, each page's loaded buffers are also copied host -> device
on the device's stream (the next page's copies issued before the current page's launch) and its
results are written from the device; the kernel region carries the Triton schedule that was
rendered.

`handlers.PagedRun` is the handler set the interpreter runs it with (interpreter.interpret).
"""
from __future__ import annotations

from dataclasses import replace

from ...lower.ir.kernel import LaunchOp
from ...lower.ir.task import ReleaseOp, TaskLaunchOp, TaskModule, TransferOp
from ...lower.passes.plan_paged_tasks import plan_paged_tasks
from .gather import kernel_name as gather_kernel


def page_module(walk, tasks, roles: tuple, tiers: list, result_tier: str,
                relation_tier: str = "disk", name: str = "paged",
                threads: int | None = None, loaders: int = 1, lookahead: int = 4, *,
                page: TaskModule, device: str | None = None, schedule=None) -> TaskModule:
    """The page plan of `walk` over `tasks` (PageTasks): `roles` are the propagate's field
    roles (as called, not swapped), `tiers` each field's tier ("host", "disk" or "param"),
    `relation_tier` where the relation's rows are read from (a store on disk, a relation
    held in memory), `threads` the threads a page's kernel runs on, `loaders` the loader
    streams, `page` the one-page Task module of `walk.eqn` (the call's lowering gives it);
    `device` the tier the kernel reads its page buffers from (None:
    the host), `schedule` the kernel schedule of the backend the pages run on (None: the
    one-page module's, cpu-llvm)."""
    module = plan_paged_tasks(
        page, [(t.index, t.rows, t.edges) for t in tasks], roles,
        tuple(tiers), walked=walk.rows, edges_in_order=walk.edge_perm is None,
        reduce_by=walk.eqn.params["reduce_by"], result_tier=result_tier,
        relation_tier=relation_tier, name=name, threads=threads, loaders=loaders,
        lookahead=lookahead, device=device, schedule=schedule)
    bits = 8 * walk.eqn.inputs[0].type.index_dtype.np.itemsize
    return _with_gathers(module, gather_kernel(bits))


def _with_gathers(module: TaskModule, kernel: str) -> TaskModule:
    """The plan with each page task naming the gather kernel its page's gathers run (the
    distinct-row remap of its column ids, paging/gather.py), where the page gathers."""
    gathered = {op.page for op in module.body.ops
                if isinstance(op, TransferOp) and op.kind == "gather"}
    if not gathered:
        return module
    ops = tuple(replace(op, kernels=(kernel,))
                if isinstance(op, TaskLaunchOp) and op.page in gathered else op
                for op in module.body.ops)
    return replace(module, body=replace(module.body, ops=ops))


def page_ops(module: TaskModule) -> tuple:
    """({page: its write ops, in result order}, {page: the event of its last transfer on a
    loader stream, into the host}): what the page handlers look up (derived from the plan,
    once a run)."""
    writes, last = {}, {}
    for op in module.body.ops:
        if isinstance(op, TransferOp):
            if op.kind in ("write", "accumulate"):
                writes.setdefault(op.page, []).append(op)
            elif op.stream is not None and op.dst_tier == "host":
                last[op.page] = op.event.name
    return writes, last


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
            f"{releases} release(s), then a join" + _device_line(ops))


def _device_line(ops) -> str:
    """What the plan's device copies are, where it has them (the Triton route on a GPU)."""
    copies = [op for op in ops if isinstance(op, TransferOp) and op.dst_tier == "device"]
    if not copies:
        return ""
    last, ahead = None, False
    for op in ops:       # double-buffered: a launch follows the copies of a later page
        if isinstance(op, TransferOp) and op.dst_tier == "device":
            last = op.page
        elif isinstance(op, TaskLaunchOp):
            ahead = ahead or (last is not None and last != op.page)
    return ("; each page's buffers are copied host -> device on the device tier's stream "
            f"{copies[-1].stream}" + (", the next page's copies issued before the current "
                                      "page's launch (double-buffered)" if ahead else "")
            + ", its results written from the device")


__all__ = ["page_module", "page_ops", "kernel_launch", "describe_plan"]
