"""runtime: paged execution of a propagate over a stored ("paged") relation.

A page is a range of destination rows (of source rows, for a propagate grouped by source:
it walks the transposed relation, built once into the store by store_transpose). Per page
the runtime reads the CSR row range from the store, gathers each distinct source row once
into a compact buffer (the page's column ids remapped onto it, see distinct()), runs the
same compiled kernel as the in-memory path on the page-local CSR, and writes the output rows
to a host array (the kernel writes them in place), or to a disk tensor when the result
would not fit the host budget. The plan is Task IR (lower/passes/plan_paged_tasks: per page
its transfers on a loader stream, issued a few launches ahead, one gf_task.launch and its
writes), run by the interpreter's one loop with _PagedRun's handlers: a transfer is a job on
its loader thread, so the next pages load while one computes (reused page buffers:
buffers.py). The executor's Lowering (`lower`) gives the one-page Task module and the page
kernel's launch (nothing here lowers); explain() prints the pages with the last run's
measurements. Under a Triton backend the pages run its kernel, streamed through the device
tier where there is one (device.py: TritonPages, the handlers the device ops delegate to).
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ...core.config import config
from ...core.errors import ShapeError, StorageError, UnsupportedError
from ...core.graph import Graph
from ...core.primitive import impl_rules
from ...core.prims.graph import propagate_p
from ...core.program import Var
from ...core.types import TensorType
from ...lower.backends import BACKENDS, TRITON_BACKENDS, selected_backend
from ...lower.ir.task import TaskLaunchOp
from ..backends.cpu.propagate import Fallback, plan_propagate, run_propagate
from ..backends.triton.compile import tensors
from ..explain import launch_facts, schedule_line
from ..interpreter import JOIN, RELEASE, RUN, TRANSFER, interpret, op_steps
from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers import DiskStorage, HostStorage
from ..progress import progress_bar
from ..run_report import NOT_RUN, measured, record
from ..store import transpose as store_transpose
from ..threads import num_threads
from . import plan as paging_plan
from .buffers import PageBuffers, with_slack
from .describe import describe_stats, page_kernel
from .device import TritonPages, device_route, empty_page
from .distinct import distinct
from .writer import WRITE_QUEUE, PageWriter

PAGED_BY = ("dst", "edge")    # groupings a page of destination rows completes on its own
QUEUE_PAGES = 2     # pages loaded ahead of the loaders' current ones
LOADERS = 2         # loader threads: file reads, checksums and numpy copies release the GIL
LOOKAHEAD = QUEUE_PAGES + LOADERS      # launches a page's transfers are issued ahead of it


@dataclass(frozen=True)
class PageTask:
    """One page: destination rows [rows), edges [edges) of the stored CSR."""

    index: int
    rows: tuple
    edges: tuple


@dataclass
class PageStats:
    """What the last paged run on a relation measured (explain() prints it)."""

    pages: int = 0
    page_rows: int = 0
    edges: int = 0
    distinct_sources: int = 0
    bytes_read: dict = field(default_factory=lambda: {"host": 0, "disk": 0})
    bytes_written: dict = field(default_factory=lambda: {"host": 0, "disk": 0})
    bytes_device: dict = field(default_factory=lambda: {"to": 0, "from": 0})
    seconds: dict = field(default_factory=lambda: dict.fromkeys(
        ("read", "gather", "compute", "write", "wait", "device", "total"), 0.0))
    result_tier: str = "host"
    route: str = "cpu-llvm"           # the backend the page kernel ran on
    module: object = None             # the page plan's Task module that ran

    @property
    def distinct_ratio(self) -> float:
        return self.distinct_sources / self.edges if self.edges else 0.0

    @property
    def overlapped(self) -> float:
        """Seconds of page loading hidden behind compute."""
        s = self.seconds
        return max(0.0, s["read"] + s["gather"] - s["wait"])


def page_tasks(num_dst: int, bounds: np.ndarray, page_rows: int) -> list:
    """The plan: one PageTask per `page_rows` destination rows; `bounds` is row_ptr at
    rows 0, page_rows, 2 page_rows, ... and num_dst."""
    starts = list(range(0, num_dst, page_rows))
    return [PageTask(k, (a, min(a + page_rows, num_dst)), (int(bounds[k]), int(bounds[k + 1])))
            for k, a in enumerate(starts)]


# ---- field access on any tier -----------------------------------------------------------------

def _tier(rows) -> str:
    """Where a relation's rows (a store version, resident_pages.ResidentRows) or its edge
    permutation are read from."""
    return getattr(rows, "tier", "disk")


def _storage_of(value):
    """(storage with read_rows / take_rows, tier) of a field value on any tier."""
    st = getattr(value, "_storage", None)
    if st is not None and hasattr(st, "take_rows"):
        return st, st.tier
    arr = np.asarray(value)
    return HostStorage(arr), "host"


def _row_layout(stor) -> tuple:
    """(row shape, numpy dtype) of a storage on any tier."""
    arr = stor._live() if stor.tier == "host" else stor
    return tuple(arr.shape[1:]), np.dtype(arr.dtype)


def _check_lengths(eqn, graph, values) -> None:
    want = {"src": graph.num_src, "dst": graph.num_dst, "edge": graph.num_edges}
    for v, role, name in zip(values, eqn.params["roles"], eqn.params["names"]):
        if role in want:
            shape = tuple(getattr(v, "shape", np.shape(v)))
            if not shape or shape[0] != want[role]:
                raise ShapeError(f"{role}.{name}: expected {want[role]} rows for the paged "
                                 f"relation, found shape {shape}")


# ---- the plan ----------------------------------------------------------------------------------

class PagedPlan:
    """The route of a propagate over a paged relation (a launch.PLANNERS plan), or over a
    relation held in memory whose fields do not fit the host budget (resident_pages: the
    `reader` serves its row ranges)."""

    lazy_fields = True      # the executor hands fields over as they are (disk stays disk)

    def __init__(self, lower, reader=None, backend: str | None = None, page_plan=None):
        self.lower = lower        # the executor's Lowering
        self.reader = reader      # None: the store version of a paged relation
        self.backend = backend    # a Triton backend, or None: cpu-llvm
        self.page_plan = page_plan    # (eqn, page-local CSR) -> its Triton plan or Fallback

    def triton_pages(self, walk: Walk, graph) -> TritonPages | None:
        """The Triton route of a run's pages (its kernel planned once, from an empty page),
        or None (cpu-llvm)."""
        if self.backend is None:
            return None
        tier, _ = device_route(self.backend)
        kernel = self.page_plan(walk.eqn, empty_page(graph.index_dtype))
        return TritonPages(kernel, self.backend, tier)

    def run(self, eqn, graph, values) -> list:
        walk = walk_of(eqn, graph, reader=self.reader)
        if walk is None:
            return _materialised(eqn, graph, values, self.lower, self.page_plan)
        _check_lengths(eqn, graph, values)
        rows = sc.page_rows()
        key = (str(walk.reader.vdir), walk.rows, rows)     # the stored relation is immutable
        tasks = graph.params.setdefault("page_tasks", {}).get(key)
        if tasks is None:
            tasks = graph.params["page_tasks"][key] = page_tasks(
                walk.reader.num_dst, walk.reader.page_bounds(rows), rows)
        triton = self.triton_pages(walk, graph)
        if config.strict:
            _refuse_fallback(page_kernel(walk, self.lower, triton)[0])
        run = _PagedRun(eqn, graph, values, walk, tasks, self.lower, triton)
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
        module = plan_of(eqn, graph, values or [None] * len(p["roles"]), self.lower, walk,
                         triton)
        pages = sum(isinstance(op, TaskLaunchOp) for op in module.body.ops)
        if p["reduce_by"] == "src":
            ex.traversal.append("paged: grouped by source, pages walk the transposed CSR "
                                "stored beside the relation (built once, out of core, into a "
                                "new store version when missing)")
        kind = "source" if p["reduce_by"] == "src" else "destination"
        fallback, kernel = page_kernel(walk, self.lower, triton)
        # (under a Triton backend the route is that backend's: explain() reports it)
        ex.routes.append((self.backend or "paged", what, f"{pages} page(s) of "
                          f"{sc.page_rows()} {kind} rows from store {graph.params['path']} "
                          f"(version {graph.params['version']}); per page: read the CSR "
                          f"rows, gather distinct sources once, run the {kernel} on the "
                          "page-local CSR, write the rows"))
        loaders = page_threads(walk, pages)[0]
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


@dataclass(frozen=True)
class Walk:
    """How pages traverse the relation: by destination (the stored CSR) or by source (its
    transpose, whose kernel is the destination-grouped one with the roles exchanged)."""

    reader: object        # read_rows(a, b) / page_bounds(rows) over the walked rows
    rows: str             # role of the walked rows: "dst" or "src"
    gathered: str         # role gathered distinct once per page: the other endpoint
    eqn: object           # the equation the page kernel runs
    edge_perm: object     # None, or the stored edge id of each transposed edge
    lead: int | None      # rows of the result (None: one value summed over pages)


_SWAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pageable(params) -> bool:
    by = params["reduce_by"]
    return by in PAGED_BY or by == "src" or (by == "all" and params["reducer"].builtin and
                                             params["reducer"].name == "sum")


def walk_of(eqn, graph, build: bool = True, reader=None):
    """The page walk of `eqn` over the paged relation (over `reader`'s rows when given), or
    None (read the CSR whole). build=False: a missing transposed relation is not built (the
    walk's reader is None)."""
    p = eqn.params
    if not pageable(p):
        return None
    reader = reader or graph.params["reader"]
    if p["reduce_by"] != "src":
        lead = {"dst": graph.num_dst, "edge": graph.num_edges, "all": None}[p["reduce_by"]]
        # (a relation held in memory may store its edges out of their id order)
        return Walk(reader, "dst", "src", eqn, getattr(reader, "edge_perm", None), lead)
    if reader.transposed is None and build:    # built once; later opens find it stored
        reader = store_transpose.build(reader)
        graph.params.update(reader=reader, version=reader.version)
    t = reader.transposed
    swapped = _SWAPPED.get(eqn)
    if swapped is None:
        swapped = _SWAPPED[eqn] = _swapped(eqn)
    return Walk(t, "src", "dst", swapped, getattr(t, "edge_perm", None), graph.num_src)


def _swapped(eqn):
    """A propagate grouped by source as one grouped by destination over the transposed
    relation: the roles (and the relation type's endpoints) exchanged. The edge function
    takes its operands by position, so only the labels change."""
    p, gt = eqn.params, eqn.inputs[0].type
    flip = {"src": "dst", "dst": "src"}
    relation = Var(dataclasses.replace(gt, num_src=gt.num_dst, num_dst=gt.num_src))
    return dataclasses.replace(eqn, inputs=(relation,) + tuple(eqn.inputs[1:]), params=dict(
        p, roles=tuple(flip.get(r, r) for r in p["roles"]), reduce_by="dst"))


def _materialised(eqn, graph, values, lower, page_plan=None) -> list:
    """Groupings a page cannot complete (by source, all edges): the in-memory route on the
    whole stored CSR (the Triton kernel under a Triton backend: `page_plan`)."""
    rp, ci = graph.resolve_csr()
    mem = Graph.from_csr(rp, ci, num_src=graph.num_src, validate="none", copy=False)
    vals = [np.asarray(v) for v in values]
    kernel = page_plan(eqn, mem) if page_plan is not None else None
    if kernel is not None and not isinstance(kernel, Fallback):
        buf = tensors()
        return [r if isinstance(r, np.ndarray) else buf.to_numpy(r, d)
                for r, d in zip(kernel.run(eqn, mem, vals), kernel.source.signature.out_dtypes)]
    route = plan_propagate(eqn, mem, lower=lower)
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


@dataclass(eq=False)
class _Page:
    """A page in flight: its buffer set, page-local CSR and distinct gathered ids (its
    relation's loader job makes it), its field rows by name (the field jobs), where the
    kernel writes its results, and the writes left before its buffer set goes back."""

    index: int
    bufs: object
    graph: Graph
    uniq: np.ndarray
    writes: int
    vals: dict = field(default_factory=dict)
    into: list | None = None
    pending: list = field(default_factory=list)     # rows bound for the writer thread
    edge_ids: tuple | None = None


class _Stopped(Exception):
    """A loader job that found the run stopping (or its page's relation rows missing): the
    launch that waits on it raises the cause instead, or the run is already unwinding."""


class Loaders:
    """The streams of a page plan: one thread each, running its transfers in op order."""

    def __init__(self, n: int):
        self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"tiga-page-loader-{i}")
                      for i in range(n)]

    def submit(self, stream: int, fn, *args):
        return self.pools[stream].submit(contextvars.copy_context().run, fn, *args)

    def close(self) -> None:
        """Drop the queued jobs, wait for the running ones (they see the run's stop)."""
        for pool in self.pools:
            pool.shutdown(wait=True, cancel_futures=True)


class _PagedRun:
    """One paged execution: the handlers the interpreter walks the page plan with. A
    transfer into the host is a job on its stream's loader thread (its event: the job's
    future), a launch waits on its transfers and runs the kernel on the page-local CSR on
    this thread, a write stores the page's rows (on disk through the writer thread), the
    join waits for the last writes."""

    def __init__(self, eqn, graph, values, walk: Walk, tasks, lower, triton=None):
        self.eqn, self.graph, self.walk, self.tasks = eqn, graph, walk, tasks
        self.lower = lower
        self.triton = triton                 # TritonPages, or None: the cpu-llvm route
        self.reader = walk.reader
        self.roles = eqn.params["roles"]
        self.fields = [(_storage_of(v) if r != "param" else (np.asarray(v), "param"))
                       for v, r in zip(values, self.roles)]
        self.module = None                   # the Task-IR page plan (execute builds it)
        self.outs = None                     # [(result tensor, its storage)] (execute)
        self.kernel_threads = None
        key = (str(walk.reader.vdir), walk.rows, sc.page_rows())
        self.windows = graph.params.setdefault("page_windows", {}).setdefault(key, {})
        self.stats = PageStats(pages=len(tasks), page_rows=sc.page_rows(),
                               route=triton.backend if triton is not None else "cpu-llvm")
        self.stop = threading.Event()
        # loading or loaded ahead, computing, queued for the writer, being written
        self.buffers = PageBuffers(LOOKAHEAD + 1 + WRITE_QUEUE + 1)
        self.writer = self.loaders = self.bar = None
        self.lock = threading.Lock()
        self.events: dict = {}     # event name -> the future of the loader job making it
        self.pages: dict = {}      # page index -> its _Page (a loader makes it, a launch takes)
        self.results: dict = {}    # a launch's result name -> (rows, its _Page)
        self.params: dict = {}     # parameter name -> its value (transferred once)
        self.tickets = 0           # page buffer sets are acquired in launch order
        self.out_row_bytes = sum(int(np.prod(v.type.shape[1:], dtype=np.int64)) *
                                 v.type.dtype.np.itemsize for v in eqn.outputs)
        self.row_bytes = [0 if r == "param" else
                          int(np.prod(v.shape[1:], dtype=np.int64)) * v.dtype.itemsize
                          for v, r in zip(values, self.roles)]

    def estimate(self, task: PageTask) -> int:
        """An upper bound of a page's host buffers (CSR rows, remap, gathered rows, result
        rows bound for disk), with the slack page_buffers gives each buffer."""
        rows, edges = task.rows[1] - task.rows[0], task.edges[1] - task.edges[0]
        distinct = min(edges, self.reader.num_src)
        n = {self.walk.gathered: distinct, self.walk.rows: rows, "edge": edges, "param": 0}
        out = (edges if self.eqn.params["reduce_by"] == "edge" else rows) * \
            self.out_row_bytes if self.stats.result_tier == "disk" else 0
        if self.walk.edge_perm is not None:
            edges *= 2          # the page's stored edge ids and their remap
        return with_slack((rows + 1) * 8 + edges * 2 * self.graph.index_dtype.np.itemsize +
                          distinct * 8 + out +
                          sum(n[r] * b for r, b in zip(self.roles, self.row_bytes)))

    def execute(self) -> list:
        t_start = time.perf_counter()
        outs = self.outs = self.allocate()
        tiers = [tier for _, tier in self.fields]
        n, self.kernel_threads = page_threads(self.walk, len(self.tasks))
        self.module = paging_plan.page_module(
            self.walk, self.tasks, self.roles, tiers, self.stats.result_tier,
            _tier(self.reader), threads=self.kernel_threads, loaders=n, lookahead=LOOKAHEAD,
            lower=self.lower, **_route_args(self.triton))
        if config.check:
            self.module.verify()
        self.writes, self.last_load = paging_plan.page_ops(self.module)
        self.bar = progress_bar(len(self.tasks), "tg paged run", "pages")
        self.loaders = Loaders(n)
        if self.stats.result_tier == "disk":
            self.writer = PageWriter(self.buffers, self.stats)
        done = False
        try:
            interpret(op_steps(self.module), {TRANSFER: self.transfer, RUN: self.launch,
                                              RELEASE: self.release, JOIN: self.join})
            done = True
        finally:
            if self.writer is not None:     # interrupted: the queued writes still end
                self.writer.close(check=False)
            self.stop.set()
            self.loaders.close()
            if self.triton is not None:
                self.triton.close()
            self.buffers.close()
            if self.bar is not None:
                self.bar.close()
            if not done:
                _discard(outs)
        self.stats.seconds["total"] = time.perf_counter() - t_start
        return [t for t, _ in outs]

    # ---- transfers ---------------------------------------------------------------------------

    def transfer(self, op) -> None:
        if op.kind in ("write", "accumulate"):
            return self.write(op)
        if op.dst_tier == "device":         # the Triton route's host -> device copies
            return self.triton.transfer(op, self)
        if op.stream is None:               # a parameter: read where it is
            self.params[op.value.name] = self.fields[self._field(op)][0]
            return None
        if op.value.name == self.module.body.args[0].name:
            job, arg = self.load_relation, self.tickets
            self.tickets += 1
        else:
            job, arg = self.load_field, self._field(op)
        self.events[op.event.name] = self.loaders.submit(op.stream, job, op, arg)
        return None

    def _field(self, op) -> int:
        return self.field_index(op.value.name)

    def field_index(self, name: str) -> int:
        """The position among the propagate's fields of the plan's argument `name`."""
        return [a.name for a in self.module.body.args].index(name) - 1

    def load_relation(self, op, ticket: int) -> None:
        """A page's relation rows into a free buffer set (taken in launch order), its
        source ids made distinct and remapped: the page-local CSR."""
        task = self.tasks[op.page]
        bufs = self.buffers.acquire(self.estimate(task), self.stop, ticket)
        if bufs is None:
            raise _Stopped()
        try:
            t0 = time.perf_counter()
            a, b = op.rows
            what = f"page {task.index} buffers"
            out = (bufs.get("row_ptr", b - a + 1, (), np.int64, what),
                   bufs.get("col_idx", task.edges[1] - task.edges[0], (),
                            self.graph.index_dtype.np, what))
            rp, ci, elo = self.reader.read_rows(a, b, out)
            if elo != task.edges[0] or elo + len(ci) != task.edges[1]:
                raise StorageError(f"{self.reader.path}: page {task.index} check failed: "
                                   f"edges [{elo}:{elo + len(ci)}) differ from the planned "
                                   f"[{task.edges[0]}:{task.edges[1]})")
            t1 = time.perf_counter()
            uniq, inv = self.distinct(task.index, ci)
            # the page is valid by construction: row_ptr checked by the reader, ids
            # remapped onto [0, len(uniq)) here
            page = Graph(kind="csr", num_src=len(uniq), num_dst=len(rp) - 1,
                         num_edges=len(inv), index_dtype=self.graph.index_dtype, csr=(rp, inv))
            self.pages[task.index] = _Page(task.index, bufs, page, uniq,
                                           len(self.writes[task.index]))
            with self.lock:        # (loaders run in parallel)
                st = self.stats
                st.bytes_read[_tier(self.reader)] += rp.nbytes + ci.nbytes
                st.distinct_sources += len(uniq)
                st.edges += len(ci)
                st.seconds["read"] += t1 - t0
                st.seconds["gather"] += time.perf_counter() - t1
        except BaseException:
            self.pages[task.index] = None
            self.buffers.release(bufs)
            self.buffers.settled(bufs)
            raise
        if self.last_load[task.index] == op.event.name:
            self.loaded(task.index)

    def load_field(self, op, i: int) -> None:
        """A field's rows of a page: its own rows (kind "page") or the distinct rows the page
        reads (kind "gather"), into the page's buffer set when they need copying."""
        page = self.pages.get(op.page)
        if page is None:                    # (its relation job raised: the launch says why)
            raise _Stopped()
        t0 = time.perf_counter()
        stor, tier = self.fields[i]
        name = op.value.name
        n = op.rows[1] - op.rows[0] if op.kind == "page" else len(page.uniq)
        buf = page.bufs.get(name, n, *_row_layout(stor), f"page {op.page} buffers") \
            if tier == "disk" or (op.kind == "gather" and self.roles[i] != "edge") else None
        v = stor.read_rows(*op.rows, buf) if op.kind == "page" else \
            self.edge_rows(page, stor) if self.roles[i] == "edge" else \
            stor.take_rows(page.uniq, buf)
        page.vals[name] = v
        with self.lock:
            self.stats.bytes_read[tier] += v.nbytes
            self.stats.seconds["gather"] += time.perf_counter() - t0
        if self.last_load[op.page] == op.event.name:
            self.loaded(op.page)

    def loaded(self, k: int) -> None:
        """A page's last load: its result buffers too, so its buffer set settles whole."""
        page = self.pages[k]
        try:
            page.into = self.page_outputs(self.outs, self.writes[k], page.bufs)
        finally:
            self.buffers.settled(page.bufs)

    def distinct(self, page: int, ci: np.ndarray) -> tuple:
        """distinct() of a page's source ids; a page whose ids filled a window [lo, hi) on
        an earlier run over this store version and page size does so again (the stored
        relation is immutable), so its ids are only shifted."""
        window = self.windows.get(page)
        if window is not None:
            lo, hi = window
            if lo:
                np.subtract(ci, lo, out=ci)      # (ci is this page's own buffer)
            return np.arange(lo, hi, dtype=np.int64), ci
        uniq, inv = distinct(ci, self.graph.index_dtype.np, out=ci)   # (ci: its own buffer)
        if len(uniq) and int(uniq[-1]) - int(uniq[0]) + 1 == len(uniq):
            self.windows[page] = (int(uniq[0]), int(uniq[-1]) + 1)
        return uniq, inv

    def edge_rows(self, page, stor):
        """An edge field of a page walking the transpose: the page's stored edge ids (read
        once per page), each row read once, in transposed order."""
        if page.edge_ids is None:
            a, b = self.tasks[page.index].edges
            perm = self.walk.edge_perm.read_rows(a, b)
            with self.lock:
                self.stats.bytes_read[_tier(self.walk.edge_perm)] += perm.nbytes
            page.edge_ids = distinct(perm, np.intp)
        uniq, inv = page.edge_ids
        return stor.take_rows(uniq)[inv]

    # ---- launches and writes (this thread) -------------------------------------------------

    def launch(self, op) -> None:
        """A page's gf_task.launch: wait for its transfers, then the kernel."""
        t0 = time.perf_counter()
        for e in op.deps:
            fut = self.events.pop(e.name, None)
            if fut is not None:
                fut.result()          # (a loader's error is raised here)
        self.stats.seconds["wait"] += time.perf_counter() - t0
        self.compute(op)
        if self.bar is not None:
            self.bar.update(1)

    def compute(self, op) -> None:
        """The kernel on the page-local CSR, writing host result rows in place (on the
        Triton route: TritonPages, whose results may stay on the device until written)."""
        page = self.pages.pop(op.page)
        args = self.module.body.args[1:]
        vals = [self.params[a.name] if r == "param" else page.vals[a.name]
                for a, r in zip(args, self.roles)]
        t0 = time.perf_counter()
        eqn = self.walk.eqn
        if self.triton is not None:
            res = self.triton.compute(op, self, page, vals)
        else:
            route = plan_propagate(eqn, page.graph, lower=self.lower)
            res = impl_rules[propagate_p](page.graph, *vals, **eqn.params) \
                if isinstance(route, Fallback) else \
                run_propagate(route, eqn, page.graph, vals, page.into, self.kernel_threads)
        self.stats.seconds["compute"] += time.perf_counter() - t0
        for v, r in zip(op.results[:-1], res):
            self.results[v.name] = (r if isinstance(r, tuple) else np.asarray(r), page)

    def write(self, op) -> None:
        """A page's output rows into the result: added (a sum over all edges), left where
        the kernel wrote them, copied, or handed to the writer thread with the page's buffer
        set (which holds them); the set goes back after the page's last write. Rows on the
        device come back first, into where a host kernel would have written them."""
        if op.src_tier == "device":
            self.triton.fetch(op, self)
        r, page = self.results.pop(op.value.name)
        _, stor = self.outs[self.writes[op.page].index(op)]
        if op.kind == "accumulate":
            stor._live()[...] += r
        elif stor.tier == "disk":
            page.pending.append((stor, op.rows[0], r))
        elif not np.shares_memory(r, stor._live()[op.rows[0]:op.rows[1]]):
            stor.write_rows(op.rows[0], r)
        self.stats.bytes_written[stor.tier] += r.nbytes
        page.writes -= 1
        if page.writes == 0:
            if page.pending:
                self.writer.put(page.pending, page.bufs)     # (the writer releases it)
            else:
                self.buffers.release(page.bufs)

    def release(self, op) -> None:
        if op.tier == "device":
            self.triton.release(op)
        else:
            self.params.pop(op.value.name, None)

    def join(self, op) -> None:
        if self.writer is not None:
            self.writer.close()         # (the last pages' writes; raises theirs)
            self.writer = None

    def page_outputs(self, outs, writes: list, bufs) -> list | None:
        """Where the kernel writes a page's results: the result's own rows on the host, a
        page buffer for rows bound for disk; None (fresh arrays) for a sum over all edges."""
        if any(op.kind != "write" for op in writes):
            return None
        into = []
        for i, ((_, stor), op) in enumerate(zip(outs, writes)):
            a, b = op.rows
            into.append(stor._live()[a:b] if stor.tier == "host" else bufs.get(
                f"out{i}", b - a, stor.shape[1:], stor.dtype, f"page {op.page} results"))
        return into

    def allocate(self) -> list:
        """[(result tensor, its storage)]: on the host when the results fit the host budget
        (with room for the page buffers), else disk tensors in the spill dir."""
        from ..memory.tensor import Tensor, _own
        shapes, types, on_disk = result_layout(self.eqn, self.walk)
        self.stats.result_tier = "disk" if on_disk else "host"
        outs = []
        for s, t in zip(shapes, types):
            ttype = TensorType(s, t.dtype)
            nbytes = int(np.prod(s, dtype=np.int64)) * t.dtype.np.itemsize
            if on_disk:
                ch = memory.charge("disk", nbytes, "paged result")
                stor = DiskStorage.create(sc.spill_path("paged"), s, t.dtype.np)
                tensor = Tensor(stor, ttype)
                _own(tensor, ch)
                weakref.finalize(tensor, stor.release)
            else:
                ch = memory.charge("host", nbytes, "paged result")
                stor = HostStorage(np.empty(s, t.dtype.np) if self.walk.lead is not None else
                                   np.zeros(s, t.dtype.np))
                tensor = Tensor(stor, ttype)
                _own(tensor, ch)
            outs.append((tensor, stor))
        return outs


def result_layout(eqn, walk) -> tuple:
    """(shapes, types, on disk?) of the results: on disk when they would not fit the host
    budget with a quarter of it left for the page buffers."""
    lead = walk.lead
    types = [v.type for v in eqn.outputs]
    shapes = [tuple(int(d) for d in t.shape) if lead is None else
              (lead,) + tuple(int(d) for d in t.shape[1:]) for t in types]
    total = sum(int(np.prod(s, dtype=np.int64)) * t.dtype.np.itemsize
                for s, t in zip(shapes, types))
    owner = sc.budget_scope("host")
    on_disk = owner is not None and lead is not None and \
        owner.used["host"] + total > owner.budgets["host"] - owner.budgets["host"] // 4
    return shapes, types, on_disk


def page_threads(walk: Walk, pages: int) -> tuple:
    """(loader threads, threads of a page's kernel) of a run of `pages` pages."""
    # a sum over all edges adds pages in plan order (one loader: the same float sum on
    # every run); other results are written to disjoint rows, in any order, so each
    # loader walks its own contiguous run of pages: a chunk shared by two neighbouring
    # pages is then decoded once, by the loader that reads both
    n = max(1, min(LOADERS, pages)) if walk.lead is not None else 1
    # the loaders keep cores busy reading, so a page's kernel takes the cores left
    return n, max(1, num_threads() - n)


def plan_of(eqn, graph, values: list, lower, walk: Walk | None = None,
            triton: TritonPages | None = None):
    """The page plan (Task module) a call of `eqn` over the paged relation `graph` with
    these field values runs, as _PagedRun builds it (`triton`: its Triton route, if any);
    None when the call reads the CSR whole. Builds nothing: a walk by source whose
    transposed relation is not built yet shows its pages without edge offsets. A value of
    None is taken to be on the host."""
    walk = walk or walk_of(eqn, graph, build=False)
    if walk is None:
        return None
    rows = sc.page_rows()
    n = walk.reader.num_dst if walk.reader is not None else graph.num_src
    bounds = walk.reader.page_bounds(rows) if walk.reader is not None else \
        np.zeros(-(-n // rows) + 1, np.int64)
    tiers = ["param" if r == "param" else "host" if v is None else _storage_of(v)[1]
             for v, r in zip(values, eqn.params["roles"])]
    on_disk = result_layout(eqn, walk)[2]
    tasks = page_tasks(n, bounds, rows)
    loaders, threads = page_threads(walk, len(tasks))
    return paging_plan.page_module(walk, tasks, eqn.params["roles"], tiers,
                                   "disk" if on_disk else "host", threads=threads,
                                   loaders=loaders, lookahead=LOOKAHEAD, lower=lower,
                                   **_route_args(triton))


def _route_args(triton: TritonPages | None) -> dict:
    """The page plan's arguments for the pages' route: the device tier their kernel reads
    from and the schedule their Triton kernel was rendered with (none on cpu-llvm)."""
    if triton is None or isinstance(triton.plan, Fallback):
        return {}
    return {"device": triton.tier, "schedule": triton.plan.schedule}


def call_plan(program, args: list, lower):
    """The page plan of a call of `program` when it is one propagate over a paged relation
    (what ir("task") prints for it, and explain() counts), else None."""
    eqns = program.eqns
    if len(eqns) != 1 or eqns[0].primitive is not propagate_p or \
            getattr(args[0] if args else None, "kind", None) != "paged":
        return None
    walk = walk_of(eqns[0], args[0], build=False)
    if walk is None:         # (the CSR is read whole: no page plan)
        return None
    triton = plan_paged(eqns[0], args[0], lower).triton_pages(walk, args[0])
    return plan_of(eqns[0], args[0], list(args[1:]), lower, walk, triton)


def task_ir(program, args: list, lower) -> str | None:
    """The Task IR a call of `program` runs when it is one propagate over a paged relation
    (the page plan, as _PagedRun interprets it), else None."""
    module = call_plan(program, args, lower)
    return None if module is None else str(module)


def _discard(outs) -> None:
    for tensor, stor in outs:
        if stor.tier == "disk":
            stor.release()
        if tensor._charge is not None:
            tensor._charge.credit()


def plan_paged(eqn, graph, lower):
    """The route of a propagate over a stored ("paged") relation, or None (not paged); its
    pages run the selected backend's kernel."""
    if getattr(graph, "kind", None) != "paged":
        return None
    return PagedPlan(lower, **backend_pages(lower))


def backend_pages(lower) -> dict:
    """PagedPlan's arguments for the selected backend: a Triton backend and its launcher's
    page-kernel planner (`page_plan(backend, lower, eqn, page-local CSR)`: a TritonPlan or a
    Fallback), or none (cpu-llvm)."""
    name = selected_backend()
    if name not in TRITON_BACKENDS:
        return {}
    return {"backend": name,
            "page_plan": functools.partial(BACKENDS[name].launcher.page_plan, name, lower)}


__all__ = ["PagedPlan", "plan_paged", "Walk", "task_ir", "call_plan", "plan_of", "PageTask",
           "PageStats", "page_tasks", "describe_stats"]
