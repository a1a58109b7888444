"""runtime/paging: explain()'s words on a paged run: what each page runs (the in-memory
kernel, the Triton kernel on the host or through the device tier, or the reference
interpreter) and what the last run measured."""
from __future__ import annotations

import dataclasses

from ...core.program import Var
from ..backends import Fallback
from ..backends.cpu.propagate import generic_plan
from .device import TritonPages, device_route
from .plan import kernel_launch


def page_kernel(walk, page, triton: TritonPages | None) -> tuple:
    """(why the pages run the reference interpreter, or None; explain()'s words for what
    runs on each page); `page`: the one-page Task module the pages unroll."""
    fallback = (_page_fallback(walk, page) if triton is None else
        getattr(triton.plan, "reason", None))
    if fallback:
        return fallback, f"reference interpreter ({fallback})"
    return None, "in-memory kernel" if triton is None else triton_kernel_text(triton)


def triton_kernel_text(triton: TritonPages) -> str:
    """explain()'s words for the Triton route of the pages."""
    text = (f"{triton.backend} kernel (rendered once for every page: "
            f"{triton.plan.key[:12]})")
    if triton.tier is not None:
        return text + (" on the device: the page's buffers copied host -> device through "
                       "the device tier (two buffer sets under the 'device' budget, the next "
                       "page's copy overlapping this page's kernel), its rows copied back")
    return text + f" on the host page buffers ({device_route(triton.backend)[1]})"


def _page_fallback(walk, page) -> str | None:
    """Why a page's kernel would run on the reference interpreter, or None (it compiles):
    the Kernel op of the one-page module `page`, planned without compiling."""
    eqn = walk.eqn
    csr = Var(dataclasses.replace(eqn.inputs[0].type, kind="csr"))
    found = generic_plan(dataclasses.replace(eqn, inputs=(csr,) + tuple(eqn.inputs[1:])),
                         None, compile=False, held=kernel_launch(page))
    return found.reason if isinstance(found, Fallback) else None


def describe_stats(s) -> str:
    """explain()'s line on what the last paged run measured (a run.PageStats)."""
    t = s.seconds
    return (f"paged: last run {s.pages} page(s) x {s.page_rows} rows, {s.edges} edges, "
            + ("distinct-source ratio – (read mapped from the page cache: no gather)"
               if s.mapped else f"distinct-source ratio {s.distinct_ratio:.3f}") + "; read host "
            f"{s.bytes_read['host']} B, disk {s.bytes_read['disk']} B; written host "
            f"{s.bytes_written['host']} B, disk {s.bytes_written['disk']} B (result on "
            f"{s.result_tier}); seconds read {t['read']:.3f}, gather {t['gather']:.3f}, "
            f"compute {t['compute']:.3f}, write {t['write']:.3f}, waited {t['wait']:.3f}, "
            f"overlapped {s.overlapped:.3f}" + _device_stats(s))


def _device_stats(s) -> str:
    """The Triton route's part of the last run's line: its backend and device copies."""
    if s.route == "cpu-llvm":
        return ""
    d = s.bytes_device
    return (f"; kernels on {s.route}" + (f", copied host -> device {d['to']} B, device -> "
                                         f"host {d['from']} B in {s.seconds['device']:.3f} s"
                                         if d["to"] or d["from"] else ""))


__all__ = ["describe_stats", "page_kernel", "triton_kernel_text"]
