"""runtime: paged execution of a propagate over a stored ("paged") relation.

A page is a range of destination rows (of source rows, for a propagate grouped by source:
it walks the transposed relation, built once into the store by store_transpose). Per page
the runtime reads the CSR row range from the store, gathers each distinct source row once
into a compact buffer (the page's column ids remapped onto it, see distinct()), runs the
same compiled kernel as the in-memory path on the page-local CSR, and writes the output rows
to a host array (the kernel writes them in place), or to a disk tensor when the result
would not fit the host budget. Prefetch threads load the next pages while one computes (a
bounded queue of two pages, reused page buffers: page_buffers). The plan is Task IR
(paging_plan: one transfer per page and operand, one gf_task.launch and one write per page)
and _PagedRun interprets it; the plan holds the executor's Lowering (`lower`), which gives
the one-page Task module and the page kernel's launch (nothing here lowers); explain()
prints the pages with the last run's measurements.
"""
from __future__ import annotations

import contextvars
import dataclasses
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from ...core.config import config
from ...core.errors import ShapeError, StorageError
from ...core.graph import Graph
from ...core.primitive import impl_rules
from ...core.prims.graph import propagate_p
from ...core.program import Var
from ...core.types import TensorType
from ...lower.ir.task import TaskLaunchOp
from ..backends.cpu.propagate import Fallback, plan_propagate, run_propagate
from ..explain import launch_facts, schedule_line
from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers import DiskStorage, HostStorage
from ..progress import progress_bar
from ..run_report import NOT_RUN, measured, record
from ..store import transpose as store_transpose
from ..threads import num_threads
from . import gather
from . import plan as paging_plan
from .buffers import PageBuffers, with_slack
from .writer import WRITE_QUEUE, PageWriter

PAGED_BY = ("dst", "edge")    # groupings a page of destination rows completes on its own
QUEUE_PAGES = 2
LOADERS = 2         # prefetch threads: file reads, checksums and numpy copies release the GIL


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
    seconds: dict = field(default_factory=lambda: dict.fromkeys(
        ("read", "gather", "compute", "write", "wait", "total"), 0.0))
    result_tier: str = "host"
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


BLOCK_SHIFT = 12      # id blocks of 4096 for pages whose ids sit in a few far-apart windows


def distinct(ci: np.ndarray, index_dtype, out: np.ndarray | None = None) -> tuple:
    """(sorted distinct ids, each id's position among them), i.e. np.unique's inverse,
    without a sort when cheap: a mark array over the ids' span (a page of a banded graph),
    or over the occupied 4096-id blocks (a page whose ids wrap around or sit in a few
    windows); a sort only for ids spread thin over a wide span. The mark array is the native
    kernel's (paging.gather) where it runs; then the positions go to `out` when given (the
    page's own id buffer: in place)."""
    if not len(ci):
        return np.zeros(0, np.int64), np.zeros(0, index_dtype)
    lo, hi = int(ci.min()), int(ci.max()) + 1
    if hi - lo <= 8 * len(ci):
        return _marked(ci, lo, hi - lo, index_dtype, out)
    blk = ci >> BLOCK_SHIFT
    occupied = np.zeros((hi - 1 >> BLOCK_SHIFT) + 1, bool)
    occupied[blk] = True
    blocks = np.flatnonzero(occupied)
    span = len(blocks) << BLOCK_SHIFT
    if span > 8 * len(ci):
        uniq, inv = np.unique(ci, return_inverse=True)
        return uniq, inv.astype(index_dtype, copy=False).reshape(-1)
    slot = np.zeros(len(occupied), ci.dtype)
    slot[blocks] = np.arange(len(blocks), dtype=ci.dtype)
    local = slot[blk]
    local <<= BLOCK_SHIFT
    local |= ci & ((1 << BLOCK_SHIFT) - 1)
    pos, inv = _marked(local, 0, span, index_dtype, out)
    return (blocks[pos >> BLOCK_SHIFT] << BLOCK_SHIFT) | (pos & ((1 << BLOCK_SHIFT) - 1)), inv


def _marked(ids: np.ndarray, lo: int, span: int, index_dtype, out=None) -> tuple:
    """distinct() of ids in [lo, lo + span) by a mark array: the native kernel's, else
    numpy's (a window every id of which occurs, a banded page, needs no remap there: the
    ids less lo are their own positions)."""
    got = gather.marked(ids, lo, span, index_dtype, out)
    if got is not None:
        return got
    local = ids - lo if lo else ids
    uniq = np.flatnonzero(np.bincount(local, minlength=span))    # (faster than a scatter)
    if len(uniq) == span:
        return uniq + lo, local.astype(index_dtype, copy=False)
    remap = np.empty(span, index_dtype)
    remap[uniq] = np.arange(len(uniq), dtype=index_dtype)
    return uniq + lo, remap[local]


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

    def __init__(self, lower, reader=None):
        self.lower = lower        # the executor's Lowering
        self.reader = reader      # None: the store version of a paged relation

    def run(self, eqn, graph, values) -> list:
        walk = walk_of(eqn, graph, reader=self.reader)
        if walk is None:
            return _materialised(eqn, graph, values, self.lower)
        _check_lengths(eqn, graph, values)
        rows = sc.page_rows()
        key = (str(walk.reader.vdir), walk.rows, rows)     # the stored relation is immutable
        tasks = graph.params.setdefault("page_tasks", {}).get(key)
        if tasks is None:
            tasks = graph.params["page_tasks"][key] = page_tasks(
                walk.reader.num_dst, walk.reader.page_bounds(rows), rows)
        run = _PagedRun(eqn, graph, values, walk, tasks, self.lower)
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
        module = plan_of(eqn, graph, values or [None] * len(p["roles"]), self.lower, walk)
        pages = sum(isinstance(op, TaskLaunchOp) for op in module.body.ops)
        if p["reduce_by"] == "src":
            ex.traversal.append("paged: grouped by source, pages walk the transposed CSR "
                                "stored beside the relation (built once, out of core, into a "
                                "new store version when missing)")
        kind = "source" if p["reduce_by"] == "src" else "destination"
        fallback = _page_fallback(walk, self.lower)
        ex.routes.append(("paged", what, f"{pages} page(s) of {sc.page_rows()} {kind} rows "
                          f"from store {graph.params['path']} (version "
                          f"{graph.params['version']}); per page: read the CSR rows, gather "
                          "distinct sources once, run the "
                          + (f"reference interpreter ({fallback})" if fallback else
                             "in-memory kernel") + " on the page-local CSR, write the rows"))
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


def _page_fallback(walk: Walk, lower) -> str | None:
    """Why a page's kernel would run on the reference interpreter, or None (it compiles)."""
    eqn = walk.eqn
    csr = Var(dataclasses.replace(eqn.inputs[0].type, kind="csr"))
    found = plan_propagate(dataclasses.replace(eqn, inputs=(csr,) + tuple(eqn.inputs[1:])),
                           None, compile=False, lower=lower)
    return found.reason if isinstance(found, Fallback) else None


def describe_stats(s: PageStats) -> str:
    t = s.seconds
    return (f"paged: last run {s.pages} page(s) x {s.page_rows} rows, {s.edges} edges, "
            f"distinct-source ratio {s.distinct_ratio:.3f}; read host "
            f"{s.bytes_read['host']} B, disk {s.bytes_read['disk']} B; written host "
            f"{s.bytes_written['host']} B, disk {s.bytes_written['disk']} B (result on "
            f"{s.result_tier}); seconds read {t['read']:.3f}, gather {t['gather']:.3f}, "
            f"compute {t['compute']:.3f}, write {t['write']:.3f}, waited {t['wait']:.3f}, "
            f"overlapped {s.overlapped:.3f}")


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


def _materialised(eqn, graph, values, lower) -> list:
    """Groupings a page cannot complete (by source, all edges): the in-memory route on the
    whole stored CSR."""
    rp, ci = graph.resolve_csr()
    mem = Graph.from_csr(rp, ci, num_src=graph.num_src, validate="none", copy=False)
    vals = [np.asarray(v) for v in values]
    route = plan_propagate(eqn, mem, lower=lower)
    if isinstance(route, Fallback):
        return impl_rules[propagate_p](mem, *vals, **eqn.params)
    return run_propagate(route, eqn, mem, vals)


class _PagedRun:
    """One paged execution: a prefetch thread loads pages, this thread computes them."""

    def __init__(self, eqn, graph, values, walk: Walk, tasks, lower):
        self.eqn, self.graph, self.walk, self.tasks = eqn, graph, walk, tasks
        self.lower = lower
        self.reader = walk.reader
        self.roles = eqn.params["roles"]
        self.fields = [(_storage_of(v) if r != "param" else (np.asarray(v), "param"))
                       for v, r in zip(values, self.roles)]
        self.module = self.plan = None       # the Task-IR page plan (execute builds it)
        self.outs = None                     # [(result tensor, its storage)] (execute)
        self.kernel_threads = None
        key = (str(walk.reader.vdir), walk.rows, sc.page_rows())
        self.windows = graph.params.setdefault("page_windows", {}).setdefault(key, {})
        self.stats = PageStats(pages=len(tasks), page_rows=sc.page_rows())
        self.stop = threading.Event()
        # queued, computing, loading, being written
        self.buffers = PageBuffers(QUEUE_PAGES + 1 + LOADERS + WRITE_QUEUE + 1)
        self.writer = None
        self.lock = threading.Lock()
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

    # ---- loading (prefetch thread) -------------------------------------------------------

    def load(self, task: PageTask, transfers: list, bufs):
        """Run a page's transfers into the host (into the buffer set `bufs`): the
        relation's rows, then each field's rows (kind "page") or the distinct rows the page
        reads (kind "gather")."""
        t0 = time.perf_counter()
        relation = self.module.body.args[0]
        ops = {op.value.name: op for op in transfers}
        a, b = ops[relation.name].rows
        what = f"page {task.index} buffers"
        out = (bufs.get("row_ptr", b - a + 1, (), np.int64, what),
               bufs.get("col_idx", task.edges[1] - task.edges[0], (),
                        self.graph.index_dtype.np, what))
        rp, ci, elo = self.reader.read_rows(a, b, out)
        if elo != task.edges[0] or elo + len(ci) != task.edges[1]:
            raise StorageError(f"{self.reader.path}: page {task.index} check failed: "
                               f"edges [{elo}:{elo + len(ci)}) differ from the planned "
                               f"[{task.edges[0]}:{task.edges[1]})")
        reads = {"disk": 0, "host": 0}
        reads[_tier(self.reader)] += rp.nbytes + ci.nbytes
        t1 = time.perf_counter()
        uniq, inv = self.distinct(task.index, ci)
        vals = []
        edge_rows = self.edge_rows(task, reads)
        for (stor, tier), role, arg in zip(self.fields, self.roles, self.module.body.args[1:]):
            if role == "param":
                vals.append(stor)
                continue
            op = ops[arg.name]
            n = op.rows[1] - op.rows[0] if op.kind == "page" else len(uniq)
            buf = bufs.get(arg.name, n, *_row_layout(stor), what) if tier == "disk" or \
                (op.kind == "gather" and role != "edge") else None
            v = stor.read_rows(*op.rows, buf) if op.kind == "page" else \
                edge_rows(stor) if role == "edge" else stor.take_rows(uniq, buf)
            reads[tier] += v.nbytes
            vals.append(v)
        # the page is valid by construction: row_ptr checked by the reader, ids remapped
        # onto [0, len(uniq)) here
        page = Graph(kind="csr", num_src=len(uniq), num_dst=len(rp) - 1, num_edges=len(inv),
                     index_dtype=self.graph.index_dtype, csr=(rp, inv))
        t2 = time.perf_counter()
        with self.lock:        # (loaders run in parallel)
            st = self.stats
            for tier, n in reads.items():
                st.bytes_read[tier] += n
            st.distinct_sources += len(uniq)
            st.edges += len(ci)
            st.seconds["read"] += t1 - t0
            st.seconds["gather"] += t2 - t1
        return task, page, vals, bufs

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

    def edge_rows(self, task: PageTask, reads: dict):
        """Edge fields of a page walking the transpose: the page's stored edge ids, each
        row read once, in transposed order."""
        ids = []

        def take(stor):
            if not ids:
                perm = self.walk.edge_perm.read_rows(*task.edges)
                reads[_tier(self.walk.edge_perm)] += perm.nbytes
                ids.extend(distinct(perm, np.intp))
            return stor.take_rows(ids[0])[ids[1]]
        return take

    def producer(self, q: queue.Queue, pages) -> None:
        """A prefetch thread: walks the transfers of its run of pages (`pages`, an
        iterator over plan steps) into the host, one page at a time."""
        try:
            while True:
                step = next(pages, None)     # (this loader's own run of pages)
                if step is None:
                    break
                transfers, launches, writes = step
                task = self.tasks[launches[0].page]
                bufs = self.buffers.acquire(self.estimate(task), self.stop)
                if bufs is None:
                    return
                try:
                    item = self.load(task, transfers, bufs)
                    # the page's result buffers too, so the set settles whole
                    self.page_outputs(self.outs, writes, bufs)
                except BaseException:
                    self.buffers.release(bufs)
                    raise
                finally:
                    self.buffers.settled(bufs)
                while not self.stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                else:
                    self.buffers.release(bufs)
            q.put(None)
        except BaseException as exc:      # handed to the computing thread, raised there
            q.put(exc)

    # ---- computing (calling thread) ------------------------------------------------------

    def execute(self) -> list:
        t_start = time.perf_counter()
        outs = self.outs = self.allocate()
        tiers = [tier for _, tier in self.fields]
        n, self.kernel_threads = page_threads(self.walk, len(self.tasks))
        self.module = paging_plan.page_module(self.walk, self.tasks, self.roles, tiers,
                                              self.stats.result_tier, _tier(self.reader),
                                              threads=self.kernel_threads, lower=self.lower)
        if config.check:
            self.module.verify()
        self.plan = paging_plan.steps(self.module)
        bar = progress_bar(len(self.tasks), "tg paged run", "pages")
        q: queue.Queue = queue.Queue(maxsize=QUEUE_PAGES)
        cuts = [len(self.plan) * i // n for i in range(n + 1)]
        workers = [threading.Thread(target=contextvars.copy_context().run, daemon=True,
                                    args=(self.producer, q, iter(self.plan[a:b])),
                                    name=f"tiga-page-prefetch-{i}")
                   for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        writes = {step[1][0].page: step[2] for step in self.plan}
        done = False
        if self.stats.result_tier == "disk":
            self.writer = PageWriter(self.buffers, self.stats)
        try:
            for w in workers if self.tasks else ():
                w.start()
            left = len(self.plan)
            while left:                 # the calling thread: each page's task, its writes
                t0 = time.perf_counter()
                item = q.get()
                self.stats.seconds["wait"] += time.perf_counter() - t0
                if isinstance(item, BaseException):
                    raise item
                if item is None:        # a loader finished
                    continue
                self.compute(item, outs, writes[item[0].index])
                left -= 1
                if bar is not None:
                    bar.update(1)
            if self.writer is not None:
                self.writer.close()         # (the last pages' writes; raises theirs)
                self.writer = None
            done = True
        finally:
            if self.writer is not None:     # interrupted: the queued writes still end
                self.writer.close(check=False)
            self.stop.set()
            self.drain(q)
            for w in workers:
                if w.is_alive():
                    w.join()
            self.drain(q)
            self.buffers.close()
            if bar is not None:
                bar.close()
            if not done:
                _discard(outs)
        self.stats.seconds["total"] = time.perf_counter() - t_start
        return [t for t, _ in outs]

    def compute(self, item, outs, writes: list) -> None:
        """A page's gf_task.launch (the kernel on the page-local CSR), then its writes: host
        rows are written in place by the kernel, disk rows by the writer thread (the
        page's buffer set, which holds them, goes with them)."""
        task, page, vals, bufs = item
        try:
            t0 = time.perf_counter()
            eqn = self.walk.eqn
            route = plan_propagate(eqn, page, lower=self.lower)
            if isinstance(route, Fallback):
                res = impl_rules[propagate_p](page, *vals, **eqn.params)
            else:
                res = run_propagate(route, eqn, page, vals, self.page_outputs(
                    outs, writes, bufs), self.kernel_threads)
            t1 = time.perf_counter()
            pending = []
            for (_, stor), r, op in zip(outs, res, writes):
                r = np.asarray(r)
                if op.kind == "accumulate":     # summed over all edges: add the page's sum
                    stor._live()[...] += r
                elif stor.tier == "disk":
                    pending.append((stor, op.rows[0], r))
                elif not np.shares_memory(r, stor._live()[op.rows[0]:op.rows[1]]):
                    stor.write_rows(op.rows[0], r)
                self.stats.bytes_written[stor.tier] += r.nbytes
            self.stats.seconds["compute"] += t1 - t0
            if pending:
                self.writer.put(pending, bufs)
                bufs = None         # (the writer releases it)
        finally:
            if bufs is not None:
                self.buffers.release(bufs)

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

    def drain(self, q: queue.Queue) -> None:
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                self.buffers.release(item[3])

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


def plan_of(eqn, graph, values: list, lower, walk: Walk | None = None):
    """The page plan (Task module) a call of `eqn` over the paged relation `graph` with
    these field values runs, as _PagedRun builds it; None when the call reads the CSR whole.
    Builds nothing: a walk by source whose transposed relation is not built yet shows its
    pages without edge offsets. A value of None is taken to be on the host."""
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
    return paging_plan.page_module(walk, tasks, eqn.params["roles"], tiers,
                                   "disk" if on_disk else "host",
                                   threads=page_threads(walk, len(tasks))[1], lower=lower)


def call_plan(program, args: list, lower):
    """The page plan of a call of `program` when it is one propagate over a paged relation
    (what ir("task") prints for it, and explain() counts), else None."""
    eqns = program.eqns
    if len(eqns) != 1 or eqns[0].primitive is not propagate_p or \
            getattr(args[0] if args else None, "kind", None) != "paged":
        return None
    return plan_of(eqns[0], args[0], list(args[1:]), lower)


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
    """The route of a propagate over a stored ("paged") relation, or None (not paged)."""
    if getattr(graph, "kind", None) != "paged":
        return None
    return PagedPlan(lower)


__all__ = ["PagedPlan", "plan_paged", "Walk", "task_ir", "call_plan", "plan_of", "PageTask",
           "PageStats", "page_tasks", "describe_stats"]
