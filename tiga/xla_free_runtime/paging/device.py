"""runtime: the Triton route of a paged run's pages (issue 28 item 3).

Under a Triton backend a paged relation runs the same page plan as under cpu-llvm (loaders
read and gather each page into host buffers); each page's kernel is the Triton kernel of the
page-local CSR, rendered once per equation and relation layout (launch.TritonPlan, built
from an empty page: its key never depends on page sizes). Decided once per run:

- with a device tier (CUDA through cuda-python: memory/tiers/device.py), the plan copies each
  page's loaded host buffers into one of two device buffer sets (double-buffered; charged to
  the "device" budget, grown with slack like the host sets) on a copy thread of its own, the
  plan's device stream, each buffer through its storage's CUDA stream; the next page's copies
  run while the current page's kernel does. The kernel reads the device buffers in place and
  its result rows come back device -> host, into the result's own rows (or the page buffer
  bound for disk), as the in-memory route hands a host result back;
- without one (Triton's interpreter on a CPU machine), the kernel reads the host page buffers
  in place (the interpreter's tensors live on the host).

`TritonPages` holds that state and the handlers PagedRun delegates to: `transfer` (a
host -> device copy), `compute` (a page's kernel), `fetch` (a result device -> host) and
`release`.
"""
from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...core.errors import StorageError
from ...core.graph import Graph
from ...core.primitive import impl_rules
from ...core.prims.graph import propagate_p
from ..backends import Fallback
from ..backends.triton.compile import interpret, tensors
from ..memory import budgets as memory
from ..memory.tiers import device as device_tier
from .buffers import with_slack

DEVICE_SETS = 2       # device buffer sets: one page computing, the next one copying in


def device_route(backend: str) -> tuple:
    """(device tier or None, why not): where a paged run under `backend` keeps the pages its
    kernel reads: "device" when the device tier answers (cuda-python and a CUDA device)."""
    if device_tier.available():
        return "device", None
    return None, "no device tier here (cuda-python and a CUDA device): pages stay on the host"


def empty_page(index_dtype) -> Graph:
    """A page-local CSR with no rows: what the page kernel is planned from (the plan depends
    on the relation's layout and index type, never on its sizes)."""
    return Graph(kind="csr", num_src=0, num_dst=0, num_edges=0, index_dtype=index_dtype,
                 csr=(np.zeros(1, np.int64), np.zeros(0, index_dtype.np)))


class DeviceSet:
    """One page's device buffers by name, reused page after page (grown with slack)."""

    def __init__(self):
        self.bufs: dict = {}      # name -> (DeviceStorage, its charge)
        self.rows: dict = {}      # name -> rows the current page holds in it

    def get(self, name: str, n: int, row_shape: tuple, dtype, what: str):
        dtype = np.dtype(dtype)
        held = self.bufs.get(name)
        if held is not None:
            st, ch = held
            if st.shape[0] >= max(n, 1) and st.dtype == dtype and st.shape[1:] == row_shape:
                self.rows[name] = n
                return st
            self._drop(name)
        cap = max(1, with_slack(n))
        ch = memory.charge("device", cap * int(np.prod(row_shape, dtype=np.int64)) *
                           dtype.itemsize, what, knob="page_rows")
        try:
            st = device_tier.DeviceStorage.alloc((cap,) + tuple(row_shape), dtype,
                                                 nonblocking=True)
        except BaseException:
            ch.credit()
            raise
        self.bufs[name], self.rows[name] = (st, ch), n
        return st

    def put(self, name: str, arr: np.ndarray, dtype, what: str) -> int:
        """`arr` host -> device into buffer `name`; the bytes copied."""
        st = self.get(name, len(arr), tuple(arr.shape[1:]), dtype, what)
        st.write_rows(0, arr)
        return len(arr) * st.row_bytes

    def view(self, name: str):
        """The kernel's tensor over the rows the page holds in `name` (at least one: the
        interpreter reads an empty tensor's pointer as null)."""
        st = self.bufs[name][0]
        return tensors().on_device(st.leading(max(self.rows[name], 1)))

    def _drop(self, name: str) -> None:
        st, ch = self.bufs.pop(name)
        st.release()
        ch.credit()

    def close(self) -> None:
        for name in list(self.bufs):
            self._drop(name)


class TritonPages:
    """The Triton route of one paged run: the page kernel's plan (a TritonPlan, or a
    Fallback naming why pages run the reference interpreter), and with a device tier the
    device buffer sets, the parameters copied once and the copy thread."""

    def __init__(self, plan, backend: str, tier: str | None):
        self.plan, self.backend = plan, backend
        self.tier = tier if not isinstance(plan, Fallback) else None
        self.sets = [DeviceSet() for _ in range(DEVICE_SETS)]
        self.params = DeviceSet()
        self.slot: dict = {}        # page -> the device set its copies go to
        self.taken = 0              # pages given a set so far, in launch order
        self.copier = None          # the device stream's thread (made on its first copy)

    # ---- host -> device (the plan's device stream) ---------------------------------------

    def transfer(self, op, run) -> None:
        """A host -> device copy: a job on the copy thread once the load it copies is done
        (its future is the op's event). A page's copies are issued together, in launch
        order, so the sets alternate; a set is reused two launches later, once the page
        that held it was computed and written (on the calling thread, in op order)."""
        if self.copier is None:
            self.copier = ThreadPoolExecutor(1, thread_name_prefix="tiga-page-device")
        deps = [run.events.pop(e.name) for e in op.deps if e.name in run.events]
        name = op.value.name
        if (name != run.module.body.args[0].name and
                run.roles[run.field_index(name)] == "param"):
            job, dst = self._param, self.params
        else:
            if op.page not in self.slot:
                self.slot[op.page] = self.taken % DEVICE_SETS
                self.taken += 1
            job, dst = self._copy, self.sets[self.slot[op.page]]
        run.events[op.event.name] = self.copier.submit(
            contextvars.copy_context().run, job, op, deps, run, dst)

    def _copy(self, op, deps, run, dst: DeviceSet) -> None:
        for fut in deps:
            fut.result()          # (the load's error is raised here, and at the launch)
        t0 = time.perf_counter()
        page = run.pages[op.page]
        what = f"page {op.page} device buffers"
        if op.value.name == run.module.body.args[0].name:
            rp, ci = page.graph.resolve_csr()
            n = dst.put("row_ptr", rp, rp.dtype, what) + dst.put("col_idx", ci, ci.dtype, what)
        else:
            i = run.field_index(op.value.name)
            n = dst.put(op.value.name, page.vals[op.value.name],
                        self.plan.source.signature.field_dtypes[i], what)
        with run.lock:
            run.stats.bytes_device["to"] += n
            run.stats.seconds["device"] += time.perf_counter() - t0

    def _param(self, op, deps, run, dst: DeviceSet) -> None:
        arr = np.asarray(run.fields[run.field_index(op.value.name)][0])
        dtype = self.plan.source.signature.field_dtypes[run.field_index(op.value.name)]
        n = dst.put(op.value.name, arr.reshape((1,) + arr.shape), dtype, "paged parameter")
        with run.lock:
            run.stats.bytes_device["to"] += n

    # ---- the kernel ------------------------------------------------------------------------

    def compute(self, op, run, page, vals: list) -> list:
        """A page's kernel: results as host arrays (no device tier), or (device set, buffer
        name, rows) for `fetch` to bring back."""
        eqn = run.walk.eqn
        if isinstance(self.plan, Fallback):
            return [np.asarray(r) for r in impl_rules[propagate_p](page.graph, *vals,
                                                                   **eqn.params)]
        if self.tier is None:
            buf = tensors()
            sig = self.plan.source.signature
            return [r if isinstance(r, np.ndarray) else buf.to_numpy(r, d)
                    for r, d in zip(self.plan.run(eqn, page.graph, vals), sig.out_dtypes)]
        return self._launch(run, page, self.sets[self.slot.pop(op.page)])

    def _launch(self, run, page, dset: DeviceSet) -> list:
        sig, g = self.plan.source.signature, page.graph
        walk = {"row_ptr": dset.view("row_ptr"), "col_idx": dset.view("col_idx")}
        missing = [s for s in sig.slots if not s.startswith(("field:", "out:"))
                   and s not in walk]
        if missing:
            raise StorageError(f"paged Triton route: the page kernel reads {missing}, which "
                               "a page-local CSR does not have")
        args = [walk[s] for s in sig.slots if not s.startswith(("field:", "out:"))]
        for a, r in zip(run.module.body.args[1:], run.roles):
            args.append((self.params if r == "param" else dset).view(a.name))
        lead = g.num_edges if sig.reduce_by == "edge" else g.num_dst
        outs = []
        for i, (shape, dtype) in enumerate(zip(sig.out_shapes, sig.out_dtypes)):
            dset.get(f"out{i}", lead, tuple(shape), dtype, f"page {page.index} results")
            outs.append(dset.view(f"out{i}"))
            outs[-1].zero_()
        if g.num_dst > 0:
            with interpret(self.backend):
                self.plan.kernel()[(-(-g.num_dst // sig.block_rows),)](
                    *args, *outs, g.num_dst, BLOCK_R=sig.block_rows,
                    BLOCK_N=sig.block_neighbors, num_warps=sig.num_warps,
                    num_stages=sig.num_stages)
            if sig.split_degree:       # (rows above the split degree: as the in-memory run)
                self.plan._run_split(g, sig, walk["row_ptr"].device.type, walk["row_ptr"],
                                     args + outs)
        device_tier.synchronize()     # (the results are read back on the tier's streams)
        return [(dset, f"out{i}", lead) for i in range(len(outs))]

    # ---- device -> host ----------------------------------------------------------------------

    def fetch(self, op, run) -> None:
        """A page's result rows device -> host: into the rows the host route's kernel would
        have written (the result's own rows, or the page buffer bound for disk), summed over
        the page's rows for a sum over all edges (the kernel's per-row partials)."""
        (dset, name, n), page = run.results[op.value.name]
        t0 = time.perf_counter()
        i = run.writes[op.page].index(op)
        into = page.into[i] if page.into is not None else None
        host = dset.bufs[name][0].read_rows(0, n, into)
        with run.lock:
            run.stats.bytes_device["from"] += host.nbytes
            run.stats.seconds["device"] += time.perf_counter() - t0
        if self.plan.source.signature.combine:
            host = host.sum(axis=0)
        run.results[op.value.name] = (host, page)

    def release(self, op) -> None:
        if op.value.name in self.params.bufs:
            self.params._drop(op.value.name)

    def close(self) -> None:
        """Wait for the copies in flight (their loads were cancelled or ended), then give
        every device buffer back."""
        if self.copier is not None:
            self.copier.shutdown(wait=True, cancel_futures=True)
        for s in self.sets + [self.params]:
            s.close()


__all__ = ["TritonPages", "DeviceSet", "device_route", "empty_page", "DEVICE_SETS"]
