"""runtime: run reports: what a call measured, handed back to the caller.

Pages and bytes of a paged propagate, the halo exchange of a distributed one, the key blocks a
pruned attention call skipped: each is recorded into the report of the call that ran it, never
onto the relation or the layer (a graph shared by threads would give one call another's
figures). A report exists only while someone asked for it:

    with tg.profile() as prof:        # every call inside the block gets a RunReport
        y = layer(graph=g, src={"x": x})
    print(prof); prof.calls[-1].paged

and `explain(..., run=True)` runs the call under a profile of its own and prints what it
measured. Both are context variables: a thread or task sees only its own calls.
"""
from __future__ import annotations

import collections
import contextlib
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

KINDS = ("paged", "halo", "pruned_blocks")

# Process-wide counts of which kernel paths ran, for diagnostics and for tests that assert a
# path was taken; one registry for every backend (a call's own figures go to its RunReport):
#   CPU attention: native_calls, stats_walks, dq_walks, native_backward_calls
#   Triton: knn_selects, knn_shell_walks, radius_directories (generated relations),
#           split_launches (rows that ran the split path), tile_matmuls (row linears)
COUNTERS: collections.Counter = collections.Counter()


@dataclass
class RunReport:
    """One executed call: its program, wall seconds and, per measuring propagate, what its
    route measured: `paged` (PageStats), `halo` (dict: order, bytes in/out, seconds of
    interior, wait and boundary work, the Task module that ran), `pruned_blocks`
    ((skipped, total) key blocks of a pruned attention call)."""

    program: str
    seconds: float = 0.0
    paged: list = field(default_factory=list)
    halo: list = field(default_factory=list)
    pruned_blocks: list = field(default_factory=list)
    # (kind, relation, value) in the order recorded: explain() finds a relation's own figures
    entries: list = field(default_factory=list, repr=False)

    def of(self, kind: str, relation):
        """The latest value of `kind` recorded for `relation` in this call, or None."""
        for k, rel, value in reversed(self.entries):
            if k == kind and rel is relation:
                return value
        return None

    def __str__(self) -> str:
        lines = [f"{self.program}: {self.seconds * 1e3:.3f} ms"]
        for s in self.paged:
            lines.append(f"  paged: {s.pages} page(s) x {s.page_rows} rows, {s.edges} edges, "
                         f"read {s.bytes_read['disk']} B from disk, "
                         f"{s.seconds['total']:.3f} s")
        for h in self.halo:
            if "bytes_in" in h:
                lines.append(f"  halo ({h['order']}): {h['bytes_in']} B in, {h['bytes_out']} "
                             f"B out, waited {h['wait_s'] * 1e3:.3f} ms")
        for skipped, total in self.pruned_blocks:
            lines.append(f"  attention: skipped {skipped} of {total} key blocks")
        return "\n".join(lines)


@dataclass
class Profile:
    """The run reports of every call made inside a `tg.profile()` block, in call order."""

    calls: list = field(default_factory=list)

    def measured(self, kind: str) -> list:
        """Every value of `kind` ("paged", "halo", "pruned_blocks") the calls recorded, in
        call order."""
        return [v for c in self.calls for v in getattr(c, kind)]

    def __str__(self) -> str:
        total = sum(c.seconds for c in self.calls)
        head = f"tg.profile: {len(self.calls)} call(s), {total * 1e3:.3f} ms"
        return "\n".join([head] + [str(c) for c in self.calls])


_PROFILES: ContextVar[tuple] = ContextVar("tiga_profiles", default=())
_REPORT: ContextVar[RunReport | None] = ContextVar("tiga_run_report", default=None)
_EXPLAINING: ContextVar[RunReport | None] = ContextVar("tiga_explaining", default=None)


@contextlib.contextmanager
def profile():
    """`with tg.profile() as prof:` collects a RunReport per call made inside the block (in
    this thread or task; nested blocks each get every call)."""
    prof = Profile()
    token = _PROFILES.set(_PROFILES.get() + (prof,))
    try:
        yield prof
    finally:
        _PROFILES.reset(token)


def profiled() -> bool:
    """A tg.profile() block is open here and no outer call reports yet: `reporting` would
    make a report (checked first by a warm call, which then skips the context manager)."""
    return bool(_PROFILES.get()) and _REPORT.get() is None


@contextlib.contextmanager
def reporting(name):
    """Around one executed call: a report when a profile asked for one (else nothing, so an
    unprofiled warm call pays one context-variable read). `name()` names its program."""
    profiles = _PROFILES.get()
    if not profiles or _REPORT.get() is not None:    # (a nested execute reports to its caller)
        yield None
        return
    report = RunReport(name())
    token = _REPORT.set(report)
    start = time.perf_counter()
    try:
        yield report
    finally:
        report.seconds = time.perf_counter() - start
        _REPORT.reset(token)
        for prof in profiles:
            prof.calls.append(report)


def record(kind: str, relation, value) -> None:
    """What a route measured, into the running call's report (dropped when none asked)."""
    report = _REPORT.get()
    if report is not None:
        getattr(report, kind).append(value)
        report.entries.append((kind, relation, value))


@contextlib.contextmanager
def explaining(report: RunReport | None):
    """explain(..., run=True): the describers read `measured(...)` from this report."""
    token = _EXPLAINING.set(report)
    try:
        yield
    finally:
        _EXPLAINING.reset(token)


def measured(kind: str, relation):
    """The figures of `kind` the explained run measured for `relation`; None when explain()
    did not run the call."""
    report = _EXPLAINING.get()
    return None if report is None else report.of(kind, relation)


NOT_RUN = "not measured: explain(..., run=True) runs the call and reports what it measured"

__all__ = ["RunReport", "Profile", "profile", "reporting", "record", "explaining", "measured",
           "NOT_RUN"]
