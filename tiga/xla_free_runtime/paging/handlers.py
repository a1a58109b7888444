"""runtime: the handlers a page plan runs with (`interpreter.interpret`).

A transfer into the host is a job on its stream's loader thread (its event: the job's
future): the relation's rows of a page into a free buffer set, its source ids made distinct
(distinct.py), then each field's rows or gathered distinct rows. A launch waits on its
transfers and runs the page kernel on this thread (the cpu-llvm plan, or the Triton route's
TritonPages, device.py), a write stores the page's rows (on disk through the writer thread),
the join waits for the last writes. Buffer sets (buffers.py) are handed out in launch
order and go back after a page's writes.
"""
from __future__ import annotations

import contextvars
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ...core.config import config
from ...core.errors import StorageError
from ...core.graph import Graph
from ...core.primitive import impl_rules
from ...core.prims.graph import propagate_p
from ...core.types import TensorType
from ..backends import Fallback
from ..backends.cpu.propagate import generic_plan, run_propagate
from ..caches.relations import memo
from ..interpreter import JOIN, LAUNCH, RELEASE, TRANSFER, held_kernel, interpret, op_steps
from ..memory import budgets as memory
from ..memory import scope as sc
from ..memory.tiers import DiskStorage, HostStorage, chunk_checks
from ..reports.progress import progress_bar
from . import mapped as paging_mapped
from . import plan as paging_plan
from .buffers import PageBuffers, with_slack
from .device import TritonPages
from .distinct import distinct
from .pages import (
    LOOKAHEAD,
    PageStats,
    PageTask,
    Walk,
    page_threads,
    reads_past_cache,
    result_layout,
    row_layout,
    storage_of,
    tier_of,
)
from .writer import WRITE_QUEUE, WRITERS, PageWriter


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


class PagedRun:
    """One paged execution: the handlers the interpreter walks the page plan with. A
    transfer into the host is a job on its stream's loader thread (its event: the job's
    future), a launch waits on its transfers and runs the kernel on the page-local CSR on
    this thread, a write stores the page's rows (on disk through the writer thread), the
    join waits for the last writes."""

    def __init__(self, eqn, graph, values, walk: Walk, tasks, page, triton=None):
        self.eqn, self.graph, self.walk, self.tasks = eqn, graph, walk, tasks
        self.page = page                     # the one-page Task module the plan unrolls
        self.triton = triton                 # TritonPages, or None: the cpu-llvm route
        self.reader = walk.reader
        self.roles = eqn.params["roles"]
        self.fields = [(storage_of(v) if r != "param" else (np.asarray(v), "param"))
                       for v, r in zip(values, self.roles)]
        self.module = None                   # the Task-IR page plan (execute builds it)
        self.outs = None                     # [(result tensor, its storage)] (execute)
        self.kernel_threads = None
        key = (str(walk.reader.vdir), walk.rows, sc.page_rows())
        self.windows = memo(graph).setdefault("page_windows", {}).setdefault(key, {})
        self.stats = PageStats(pages=len(tasks), page_rows=sc.page_rows(),
                               route=triton.backend if triton is not None else "cpu-llvm")
        self.stop = threading.Event()
        # loading or loaded ahead, computing, queued for the writers or being written
        self.buffers = PageBuffers(LOOKAHEAD + 1 + WRITE_QUEUE)
        self.writer = self.loaders = self.bar = None
        self.lock = threading.Lock()
        self.events: dict = {}     # event name -> the future of the loader job making it
        self.pages: dict = {}      # page index -> its _Page (a loader makes it, a launch takes)
        self.results: dict = {}    # a launch's result name -> (rows, its _Page)
        self.params: dict = {}     # parameter name -> its value (transferred once)
        self.tickets = 0           # page buffer sets are acquired in launch order
        self.pages_loaded = 0      # pages whose loads are done (the last one settles checks)
        self.checks = None         # the run's chunk_checks ledger (execute makes it)
        self.mapped = None         # mapped.MappedRun: pages read from the page cache in place
        self.inline = False        # transfers run on this thread (execute says when)
        self.through_charges = []  # chunks read through kept mappings (charge_through)
        self.page_bound = None     # the largest page's buffer estimate (charge_through)
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
        out = ((edges if self.eqn.params["reduce_by"] == "edge" else rows) *
            self.out_row_bytes if self.stats.result_tier == "disk" else 0)
        if self.mapped is not None:      # (its kernel reads the rest where it is mapped)
            return with_slack(out)
        if self.walk.edge_perm is not None:
            edges *= 2          # the page's stored edge ids and their remap
        return with_slack((rows + 1) * 8 + edges * 2 * self.graph.index_dtype.np.itemsize +
                          distinct * 8 + out +
                          sum(n[r] * b for r, b in zip(self.roles, self.row_bytes)))

    def execute(self) -> list:
        t_start = time.perf_counter()
        outs = self.outs = self.allocate()
        tiers = [tier for _, tier in self.fields]
        disk = paging_mapped.could_map(self.walk, self.fields, self.roles, self.triton)
        mapped = disk is not None and paging_mapped.warm(disk)
        n, self.kernel_threads = page_threads(self.walk, len(self.tasks), mapped)
        self.mapped = (paging_mapped.open_mapped(self.walk, self.fields, len(self.tasks))
            if mapped else None)
        through = (paging_mapped.reads_through(disk)
            if disk is not None and self.mapped is None else None)
        mapped_charge = self.charge_mapped()
        # nothing to read or check (a mapped run over chunks checked before, its result on
        # the host: no page buffers to wait for): each page's transfers run here, in plan
        # order, rather than as jobs of a loader thread (two hand-offs a page, ~0.1 ms)
        self.inline = (self.mapped is not None and self.mapped.checked() and
            self.stats.result_tier == "host")
        self.stats.mapped = self.mapped is not None
        self.module = paging_plan.page_module(
            self.walk, self.tasks, self.roles, tiers, self.stats.result_tier,
            tier_of(self.reader), threads=self.kernel_threads, loaders=n, lookahead=LOOKAHEAD,
            page=self.page, **route_args(self.triton))
        if config.check:
            self.module.verify()
        self.writes, self.last_load = paging_plan.page_ops(self.module)
        self.bar = progress_bar(len(self.tasks), "tg paged run", "pages")
        self.loaders = Loaders(n)
        if self.stats.result_tier == "disk":
            self.writer = PageWriter(self.buffers, self.stats,
                                     WRITERS if self.whole_chunk_writes() else 1)
        done = False
        try:
            # chunks the pages read in part are checked once, before the results are kept
            with chunk_checks.checking(reads_past_cache(self.walk, self.fields),
                                       {id(s): fmap for s, fmap in through or ()},
                                       self.charge_through) as self.checks:
                if self.mapped is not None:
                    self.mapped.owe_all(self.checks)
                interpret(op_steps(self.module), {TRANSFER: self.transfer, LAUNCH: self.launch,
                                                  RELEASE: self.release, JOIN: self.join})
                self.checks.settle()       # (a no-op once the last page loaded)
            done = True
        finally:
            if self.writer is not None:     # interrupted: the queued writes still end
                self.writer.close(check=False)
            self.stop.set()
            self.loaders.close()
            if self.triton is not None:
                self.triton.close()
            self.buffers.close()
            for ch in self.through_charges + [mapped_charge] * (mapped_charge is not None):
                ch.credit()
            self.checks = None          # (it holds charge_through: a cycle back to the run)
            if self.bar is not None:
                self.bar.close()
            if not done:
                _discard(outs)
        if through:
            paging_mapped.map_rest(through)
        self.stats.seconds["total"] = time.perf_counter() - t_start
        return [t for t, _ in outs]

    def whole_chunk_writes(self) -> bool:
        """Whether every page writes whole chunks of the disk results (then no two pages
        write one chunk: PageWriter may write pages at once)."""
        return all(stor.tier != "disk" or stor._aligned(op.rows[0], op.rows[1] - op.rows[0])
                   for ops in self.writes.values() for op, (_, stor) in zip(ops, self.outs))

    def charge_mapped(self):
        """The host budget's charge for the mapped arrays (they are resident while the run
        maps them), or None: nothing mapped, or the budget filled up since the plan found
        room (the pages are then read into buffers)."""
        if self.mapped is None:
            return None
        try:
            return memory.charge("host", paging_mapped.mapped_bytes(self.walk, self.fields),
                                 "mapped store pages")
        except StorageError:
            self.mapped = None
            return None

    def charge_through(self, nbytes: int) -> bool:
        """Charge a chunk a cold run reads through its storage's kept mapping
        (mapped.reads_through) to the host budget, if that leaves room for the largest
        page's buffers (an upper bound: those of a run that reads into buffers come first)
        and spills nothing; whether it did."""
        owner = sc.budget_scope("host")
        if owner is not None:
            if self.page_bound is None:
                self.page_bound = max(map(self.estimate, self.tasks), default=0)
            if owner.used["host"] + nbytes + self.page_bound > owner.budgets["host"]:
                return False
        try:
            self.through_charges.append(memory.charge("host", nbytes, "mapped store pages"))
        except StorageError:
            return False
        return True

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
        if self.inline:
            job(op, arg)
            return None
        self.events[op.event.name] = self.loaders.submit(op.stream, job, op, arg)
        return None

    def _field(self, op) -> int:
        return self.field_index(op.value.name)

    def field_index(self, name: str) -> int:
        """The position among the propagate's fields of the plan's argument `name`."""
        return [a.name for a in self.module.body.args].index(name) - 1

    def load_relation(self, op, ticket: int) -> None:
        """A page's relation rows into a free buffer set (taken in launch order), its
        source ids made distinct and remapped: the page-local CSR (a mapped run's pages
        keep the stored ids, mapped.py)."""
        task = self.tasks[op.page]
        bufs = self.buffers.acquire(self.estimate(task), self.stop, ticket)
        if bufs is None:
            raise _Stopped()
        try:
            t0 = time.perf_counter()
            a, b = op.rows
            what = f"page {task.index} buffers"
            if self.mapped is not None:      # (the stored ids, checked: mapped.py)
                page, elo, nbytes = self.mapped.page(task, self.graph.index_dtype)
                uniq, ne = None, page.num_edges
            else:
                rp, ci, elo = self.reader.read_rows(a, b, (
                    bufs.get("row_ptr", b - a + 1, (), np.int64, what),
                    bufs.get("col_idx", task.edges[1] - task.edges[0], (),
                             self.graph.index_dtype.np, what)))
                nbytes, ne = rp.nbytes + ci.nbytes, len(ci)
            if elo != task.edges[0] or elo + ne != task.edges[1]:
                raise StorageError(f"{self.reader.path}: page {task.index} check failed: "
                                   f"edges [{elo}:{elo + ne}) differ from the planned "
                                   f"[{task.edges[0]}:{task.edges[1]})")
            t1 = time.perf_counter()
            if self.mapped is None:
                # the page is valid by construction: row_ptr checked by the reader, ids
                # remapped onto [0, len(uniq)) here
                uniq, inv = self.distinct(task.index, ci)
                page = Graph(kind="csr", num_src=len(uniq), num_dst=len(rp) - 1,
                             num_edges=len(inv), index_dtype=self.graph.index_dtype,
                             csr=(rp, inv))
            self.pages[task.index] = _Page(task.index, bufs, page, uniq,
                                           len(self.writes[task.index]))
            with self.lock:        # (loaders run in parallel)
                st = self.stats
                st.bytes_read[tier_of(self.reader)] += nbytes
                st.distinct_sources += 0 if uniq is None else len(uniq)
                st.edges += ne
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
        if self.mapped is not None:
            page.vals[name], nbytes = self.mapped.field(i, op, stor)
            return self.field_loaded(op, tier, nbytes, t0)
        n = op.rows[1] - op.rows[0] if op.kind == "page" else len(page.uniq)
        buf = (page.bufs.get(name, n, *row_layout(stor), f"page {op.page} buffers")
            if tier == "disk" or (op.kind == "gather" and self.roles[i] != "edge") else None)
        v = (stor.read_rows(*op.rows, buf) if op.kind == "page" else
            self.edge_rows(page, stor) if self.roles[i] == "edge" else
            stor.take_rows(page.uniq, buf))
        page.vals[name] = v
        self.field_loaded(op, tier, v.nbytes, t0)

    def field_loaded(self, op, tier: str, nbytes: int, t0: float) -> None:
        with self.lock:
            self.stats.bytes_read[tier] += nbytes
            self.stats.seconds["gather"] += time.perf_counter() - t0
        if self.last_load[op.page] == op.event.name:
            self.loaded(op.page)

    def loaded(self, k: int) -> None:
        """A page's last load: its result buffers too, so its buffer set settles whole. The
        run's last page loaded, the chunks still owed a check (chunk_checks.py) are read
        here, on a loader thread, while the last pages compute."""
        page = self.pages[k]
        try:
            page.into = self.page_outputs(self.outs, self.writes[k], page.bufs)
        finally:
            self.buffers.settled(page.bufs)
        with self.lock:
            self.pages_loaded += 1
            last = self.pages_loaded == len(self.tasks)
        if last:
            self.checks.settle()

    def distinct(self, page: int, ci: np.ndarray) -> tuple:
        """distinct() of a page's source ids; a page whose ids filled a window [lo, hi) on
        an earlier run over this store version and page size does so again (the stored
        relation is immutable), so its ids are only shifted. Ids the run has not checked
        yet (chunk_checks: read in part, their check owed) must still index inside what
        the kernel reads (_check_ids)."""
        window = self.windows.get(page)
        if window is not None:
            lo, hi = window
            self._check_ids(page, ci, lo, hi)
            if lo:
                np.subtract(ci, lo, out=ci)      # (ci is this page's own buffer)
            return np.arange(lo, hi, dtype=np.int64), ci
        uniq, inv = distinct(ci, self.graph.index_dtype.np, out=ci)   # (ci: its own buffer)
        if len(uniq) and (uniq[0] < 0 or uniq[-1] >= self.reader.num_src):
            self._check_ids(page, uniq, 0, self.reader.num_src, stored=False)
        if len(uniq) and int(uniq[-1]) - int(uniq[0]) + 1 == len(uniq):
            self.windows[page] = (int(uniq[0]), int(uniq[-1]) + 1)
        return uniq, inv

    def _check_ids(self, page: int, ids: np.ndarray, lo: int, hi: int,
                   stored: bool = True) -> None:
        """A page's source ids in [lo, hi), or a StorageError: the chunk that holds a stray
        one is checked at once (a damaged chunk names itself), else the ids are refused.
        `stored`: `ids` are the page's own, in stored order, and only those of column-id
        chunks the run has not checked are looked at (a stored relation's checked ids are
        in range: its commit checked them; an unchecked one would otherwise index outside
        the page's rows before the run's checks settle); else `ids` hold a stray one and
        every unchecked chunk of the page is checked."""
        col, (a, b) = getattr(self.reader, "col_idx", None), self.tasks[page].edges
        if not isinstance(col, DiskStorage) or self.checks is None:
            return          # (a relation held in memory: its ids were checked when made)
        cr = col.chunk_rows
        for k in range(a // cr, -(-b // cr)):
            if self.checks.is_checked(col, k):
                continue
            part = ids[max(k * cr, a) - a:min((k + 1) * cr, b) - a] if stored else ids
            if len(part) and (part.min() < lo or part.max() >= hi):
                col.check_chunk(k)
                self.checks.checked(col, k)
                if stored:
                    raise StorageError(f"{col.path}: page {page} check failed: column ids "
                                       f"[{int(part.min())}, {int(part.max())}] leave the "
                                       f"sources [{lo}:{hi}) the page reads")
        if not stored:
            raise StorageError(f"{col.path}: page {page} check failed: column ids "
                               f"[{int(ids.min())}, {int(ids.max())}] leave the sources "
                               f"[{lo}:{hi})")

    def edge_rows(self, page, stor):
        """An edge field of a page walking the transpose: the page's stored edge ids (read
        once per page), each row read once, in transposed order."""
        if page.edge_ids is None:
            a, b = self.tasks[page.index].edges
            perm = self.walk.edge_perm.read_rows(a, b)
            with self.lock:
                self.stats.bytes_read[tier_of(self.walk.edge_perm)] += perm.nbytes
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
            route = generic_plan(eqn, page.graph, held=held_kernel(op))
            res = (impl_rules[propagate_p](page.graph, *vals, **eqn.params)
                if isinstance(route, Fallback) else
                run_propagate(route, eqn, page.graph, vals, page.into, self.kernel_threads))
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


def _discard(outs) -> None:
    for tensor, stor in outs:
        if stor.tier == "disk":
            stor.release()
        if tensor._charge is not None:
            tensor._charge.credit()


def route_args(triton: TritonPages | None) -> dict:
    """The page plan's arguments for the pages' route: the device tier their kernel reads
    from and the schedule their Triton kernel was rendered with (none on cpu-llvm)."""
    if triton is None or isinstance(triton.plan, Fallback):
        return {}
    return {"device": triton.tier, "schedule": triton.plan.schedule}



__all__ = ["PagedRun", "Loaders", "route_args"]
