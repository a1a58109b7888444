"""runtime: paged execution of a propagate over a stored ("paged") relation.

A page is a range of destination rows (of source rows, for a propagate grouped by source: it
walks the transposed relation, built once into the store by store_transpose). Per page the
runtime reads the CSR row range from the store, gathers each distinct source row once into a
compact buffer (the page's column ids remapped onto it, see distinct()), runs the same compiled
kernel as the in-memory path on the page-local CSR, and writes the output rows to a host array
(the kernel writes them in place), or to a disk tensor when the result would not fit the host
budget. The plan is Task IR (lower/passes/plan_paged_tasks: per page its transfers on a loader
stream, issued a few launches ahead, one gf_task.launch and its writes), run by the
interpreter's one loop with the handlers of handlers.py: a transfer is a job on its loader
thread, so the next pages load while one computes (reused page buffers: buffers.py). The
executor hands down the one-page Task module its pages unroll and the Kernel op a CSR read
whole runs (nothing here lowers); explain() prints the pages with the last run's measurements.
Under a Triton backend the pages run its kernel, streamed through the device tier where there
is one (device.py: TritonPages, the handlers the device ops delegate to)."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ...core.config import config
from ...core.errors import ShapeError, UnsupportedError
from ...core.graph import Graph
from ...core.primitive import impl_rules
from ...core.prims.graph import propagate_p
from ...lower.backends import selected_backend, targets_triton
from ...lower.ir.task import TaskLaunchOp
from ..backends import Fallback, backend_for
from ..backends.cpu.propagate import generic_plan, run_propagate
from ..backends.triton.compile import tensors
from ..caches.relations import memo
from ..memory import scope as sc
from ..reports.explain import launch_facts, schedule_line
from ..reports.runs import NOT_RUN, measured, record
from . import plan as paging_plan
from .describe import describe_stats, page_kernel
from .device import TritonPages, device_route, empty_page
from .handlers import PagedRun, route_args
from .mapped import mappable
from .pages import (
    LOOKAHEAD,
    QUEUE_PAGES,
    PageStats,
    PageTask,
    Walk,
    page_tasks,
    page_threads,
    pageable,
    result_layout,
    storage_of,
    walk_of,
)


def _check_lengths(eqn, graph, values) -> None:
    want = {"src": graph.num_src, "dst": graph.num_dst, "edge": graph.num_edges}
    for v, role, name in zip(values, eqn.params["roles"], eqn.params["names"]):
        if role in want:
            shape = tuple(getattr(v, "shape", np.shape(v)))
            if not shape or shape[0] != want[role]:
                raise ShapeError(f"{role}.{name}: expected {want[role]} rows for the paged "
                                 f"relation, found shape {shape}")


class PagedPlan:
    """The route of a propagate over a paged relation (routes.plan's first question), or over a
    relation held in memory whose fields do not fit the host budget (resident_pages: the
    `reader` serves its row ranges)."""

    lazy_fields = True      # the executor hands fields over as they are (disk stays disk)

    def __init__(self, reader=None, backend: str | None = None, page_plan=None, page=None,
                 held=None):
        self.reader = reader      # None: the store version of a paged relation
        self.backend = backend    # a Triton backend, or None: cpu-llvm
        self.page_plan = page_plan    # (eqn, page-local CSR, op) -> its Triton plan or Fallback
        self.page = page          # the one-page Task module its pages unroll (bound: below)
        self.held = held          # the Kernel op of the page kernel on a Triton backend, or
        #                           of the CSR read whole (a grouping pages cannot complete)

    def bound(self, page, held=None):
        """This plan with the one-page Task module of its call's lowering and the Kernel op
        a CSR read whole runs (the executor binds every paged plan before it runs or
        describes it: nothing here lowers)."""
        return PagedPlan(self.reader, self.backend, self.page_plan, page, held)

    def triton_pages(self, walk: Walk, graph) -> TritonPages | None:
        """The Triton route of a run's pages (its kernel planned once, from an empty page),
        or None (cpu-llvm)."""
        if self.backend is None:
            return None
        tier, _ = device_route(self.backend)
        kernel = self.page_plan(walk.eqn, empty_page(graph.index_dtype), self.held)
        return TritonPages(kernel, self.backend, tier)

    def run(self, eqn, graph, values) -> list:
        walk = walk_of(eqn, graph, reader=self.reader)
        if walk is None:
            return _materialised(eqn, graph, values, self.held, self.page_plan)
        _check_lengths(eqn, graph, values)
        rows = sc.page_rows()
        key = (str(walk.reader.vdir), walk.rows, rows)     # the stored relation is immutable
        tasks = memo(graph).setdefault("page_tasks", {}).get(key)
        if tasks is None:
            tasks = memo(graph)["page_tasks"][key] = page_tasks(
                walk.reader.num_dst, walk.reader.page_bounds(rows), rows)
        triton = self.triton_pages(walk, graph)
        if config.strict:
            _refuse_fallback(page_kernel(walk, self.page, triton)[0])
        run = PagedRun(eqn, graph, values, walk, tasks, self.page, triton)
        outs = run.execute()
        record("paged", graph, dataclasses.replace(run.stats, module=run.module))
        return outs

    def describe(self, ex, eqn, graph, where, values=None) -> None:
        """explain() of the call: pages, schedule and tasks counted off the page plan that
        ir("task") prints (`values`: the call's field values, for their tiers)."""
        p = eqn.params
        what = f"{where}propagate[{p['reducer'].pp_param()}] by {p['reduce_by']}"
        if not pageable(p):
            ex.routes.append(("paged", what, "grouped over all edges by a reducer other than "
                              "sum: the stored CSR is read whole and the in-memory kernel "
                              "runs on it"))
            ex.materialized.append(("CSR of the paged relation (read whole)",
                                    graph.num_edges * graph.index_dtype.np.itemsize,
                                    f"reduce_by={p['reduce_by']!r} is not paged"))
            return
        walk = walk_of(eqn, graph, build=False)
        triton = self.triton_pages(walk, graph)
        module = plan_of(eqn, graph, values or [None] * len(p["roles"]), self.page, walk,
                         triton)
        pages = sum(isinstance(op, TaskLaunchOp) for op in module.body.ops)
        if p["reduce_by"] == "src":
            ex.traversal.append("paged: grouped by source, pages walk the transposed CSR "
                                "stored beside the relation (built once, out of core, into a "
                                "new store version when missing)")
        kind = "source" if p["reduce_by"] == "src" else "destination"
        fallback, kernel = page_kernel(walk, self.page, triton)
        mapped = walk.reader is not None and maps(
            eqn, walk, _fields(values or [None] * len(p["roles"]), p["roles"]), triton)
        per_page = ("map the CSR rows and disk fields from the page cache (read in where it "
                    f"lacks them) and check their chunks, run the {kernel} on the stored ids"
                    if mapped else "read the CSR rows, gather distinct sources once, run "
                    f"the {kernel} on the page-local CSR")
        # (under a Triton backend the route is that backend's: explain() reports it)
        ex.routes.append((self.backend or "paged", what, f"{pages} page(s) of "
                          f"{sc.page_rows()} {kind} rows from store {graph.params['path']} "
                          f"(version {graph.params['version']}); per page: {per_page}, "
                          "write the rows"))
        loaders = page_threads(walk, pages, mapped)[0]
        ex.traversal.append(f"paged: {loaders} prefetch thread(s) load the next pages while "
                            f"one computes (queue of {QUEUE_PAGES} pages)")
        op = paging_plan.kernel_launch(module)
        if op is not None and not fallback:
            ex.traversal.append(f"paged: each page's gf_kernel.launch: {launch_facts(op)}")
            ex.schedule = (f"{schedule_line(op)}; once per page ({pages} page(s)), on the "
                           "page-local CSR")
        last = measured("paged", graph)
        ex.traversal.append(describe_stats(last) if last is not None else
                            f"paged: run {NOT_RUN}")


def _materialised(eqn, graph, values, held, page_plan=None) -> list:
    """Groupings a page cannot complete (by source, all edges): the in-memory route on the
    whole stored CSR (the Triton kernel under a Triton backend: `page_plan`)."""
    rp, ci = graph.resolve_csr()
    mem = Graph.from_csr(rp, ci, num_src=graph.num_src, validate="none", copy=False)
    vals = [np.asarray(v) for v in values]
    kernel = page_plan(eqn, mem, held) if page_plan is not None else None
    if kernel is not None and not isinstance(kernel, Fallback):
        buf = tensors()
        return [r if isinstance(r, np.ndarray) else buf.to_numpy(r, d)
                for r, d in zip(kernel.run(eqn, mem, vals), kernel.source.signature.out_dtypes)]
    route = generic_plan(eqn, mem, held=held)
    if isinstance(route, Fallback):
        _refuse_fallback(route.reason if config.strict else None)
        return impl_rules[propagate_p](mem, *vals, **eqn.params)
    return run_propagate(route, eqn, mem, vals)


def _refuse_fallback(why: str | None) -> None:
    """Strict mode: a paged propagate whose kernel would run on the reference interpreter
    (on its pages or on the CSR read whole) is refused before anything is read."""
    if why:
        raise UnsupportedError(f"strict mode: a paged propagate would run on the reference "
                               f"interpreter: {why}", hint="unset TIGA_STRICT / "
                               "tg.config.strict")


def plan_of(eqn, graph, values: list, page, walk: Walk | None = None,
            triton: TritonPages | None = None):
    """The page plan (Task module) a call of `eqn` over the paged relation `graph` with
    these field values runs, as PagedRun builds it (`page`: the one-page Task module of the
    call's lowering; `triton`: its Triton route, if any);
    None when the call reads the CSR whole. Builds nothing: a walk by source whose
    transposed relation is not built yet shows its pages without edge offsets. A value of
    None is taken to be on the host."""
    walk = walk or walk_of(eqn, graph, build=False)
    if walk is None:
        return None
    rows = sc.page_rows()
    n = walk.reader.num_dst if walk.reader is not None else graph.num_src
    bounds = (walk.reader.page_bounds(rows) if walk.reader is not None else
              np.zeros(-(-n // rows) + 1, np.int64))
    fields = _fields(values, eqn.params["roles"])
    on_disk = result_layout(eqn, walk)[2]
    tasks = page_tasks(n, bounds, rows)
    loaders, threads = page_threads(walk, len(tasks), maps(eqn, walk, fields, triton))
    return paging_plan.page_module(walk, tasks, eqn.params["roles"],
                                   [tier for _, tier in fields],
                                   "disk" if on_disk else "host", threads=threads,
                                   loaders=loaders, lookahead=LOOKAHEAD, page=page,
                                   **route_args(triton))


def _fields(values: list, roles) -> list:
    """(storage, tier) of each propagate field value (None: taken to be on the host)."""
    return [(None, "param") if r == "param" else (None, "host") if v is None else
            storage_of(v) for v, r in zip(values, roles)]


def maps(eqn, walk: Walk, fields: list, triton=None) -> bool:
    """Whether a call's pages would be read mapped now (mapped.mappable), its result's
    bytes still to be charged when they go to the host."""
    shapes, types, on_disk = result_layout(eqn, walk)
    result = 0 if on_disk else sum(int(np.prod(s, dtype=np.int64)) * t.dtype.np.itemsize
                                   for s, t in zip(shapes, types))
    return mappable(walk, fields, eqn.params["roles"], triton, reserved=result)



def call_plan(program, args: list, bound: dict):
    """The page plan of a call of `program` when it is one propagate over a paged relation
    (what ir("task") prints for it, and explain() counts), else None. `bound`: {id(eqn): its
    PagedPlan bound by the executor} (one-page module, Kernel op)."""
    eqns = program.eqns
    if (len(eqns) != 1 or eqns[0].primitive is not propagate_p
            or getattr(args[0] if args else None, "kind", None) != "paged"):
        return None
    walk = walk_of(eqns[0], args[0], build=False)
    if walk is None:         # (the CSR is read whole: no page plan)
        return None
    plan = bound[id(eqns[0])]
    return plan_of(eqns[0], args[0], list(args[1:]), plan.page, walk,
                   plan.triton_pages(walk, args[0]))


def task_ir(program, args: list, bound: dict) -> str | None:
    """The Task IR a call of `program` runs when it is one propagate over a paged relation
    (the page plan, as PagedRun interprets it), else None."""
    module = call_plan(program, args, bound)
    return None if module is None else str(module)


def plan_paged(eqn, graph):
    """The route of a propagate over a stored ("paged") relation, or None (not paged); its
    pages run the selected backend's kernel (the executor binds its Kernel op)."""
    if getattr(graph, "kind", None) != "paged":
        return None
    return PagedPlan(**backend_pages())


def backend_pages() -> dict:
    """PagedPlan's arguments for the selected backend: a Triton backend and its launcher's
    page-kernel planner (`page_plan(backend, eqn, page-local CSR, op)`: a TritonPlan or a
    Fallback), or none (cpu-llvm)."""
    name = selected_backend()
    if not targets_triton(name):     # (cpu-llvm: its pages run the one-page module's kernel)
        return {}
    return {"backend": name, "page_plan": functools.partial(backend_for("triton").page_plan,
                                                            name)}


__all__ = ["PagedPlan", "plan_paged", "Walk", "task_ir", "call_plan", "plan_of", "PageTask",
           "PageStats", "page_tasks", "describe_stats"]
