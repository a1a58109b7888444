"""runtime: tg.Explanation, the readable report of which route a call takes and why."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...lower.ir.syntax import format_attr


def launch_facts(op) -> str:
    """A launch's walk as its Kernel IR prints it (traversal, hierarchy, order, arrays)."""
    return ", ".join(f"{k} = {format_attr(getattr(op, k))}" for k in (
        "traversal", "coordinate_hierarchy", "ordering", "materializes"))


def schedule_line(op) -> str:
    """explain()'s schedule of a launch: its Kernel IR schedule attributes as printed (the
    runtime renders and runs from the same Schedule, so the two cannot drift)."""
    attrs = ", ".join(f"{k} = {format_attr(v)}" for k, v in op.schedule.attrs())
    return f"{op.traversal} launch {{{attrs}}}"


@dataclass
class Explanation:
    """How a call runs, from `layer.explain(**call)`; `str()` of it is a readable report.

    Attributes:
        route (str): "reference", "cpu-llvm", "mixed", "triton" or "triton-interpreter".
        backend (str): the backend's description. reason (str): why this route.
        traversal (list[str]): how each propagate walks its relation (pages, halos).
        schedule (str): the kernel schedule. materialized (list): (what, bytes, why) of
            each array built that a fused kernel would not need.
        estimated_bytes (int): bytes materialised. vjp_route (str): how the gradient runs.
        routes (list): (route, which propagate, reason) per equation.
        tasks (str): the Task IR the runtime walks. run_report (RunReport | None): what
            the call measured, with `explain(..., run=True)`.
    """

    route: str                      # "reference" | "cpu-llvm" | "mixed" | ...
    backend: str
    reason: str
    traversal: list = field(default_factory=list)
    schedule: str = "none (interpreted)"
    materialized: list = field(default_factory=list)   # (what, bytes, why)
    estimated_bytes: int = 0
    vjp_route: str = ""
    cache: str = ""
    program: str = ""
    routes: list = field(default_factory=list)         # (route, which propagate, reason)
    cache_lines: list = field(default_factory=list)    # cache status per compiled propagate
    tasks: str = ""                 # how the runtime runs the program's Task IR
    task_ir: str = ""               # the Task IR a call ran (a distributed propagate's plan)
    run_report: object = None       # explain(..., run=True): the RunReport of the run
    # ids of program values the chosen kernels read through their strides (no copy needed)
    strided_reads: set = field(default_factory=set, repr=False)

    def __str__(self) -> str:
        lines = [f"route:      {self.route} ({self.backend})", f"why:        {self.reason}"]
        for route, what, why in self.routes:
            lines.append(f"  {what}: {route} ({why})")
        for t in self.traversal:
            lines.append(f"traversal:  {t}")
        lines.append(f"schedule:   {self.schedule}")
        for what, nbytes, why in self.materialized:
            lines.append(f"materialized: {what}, {_fmt_bytes(nbytes)} ({why})")
        lines.append(f"estimated bytes: {_fmt_bytes(self.estimated_bytes)}")
        if self.vjp_route:
            lines.append(f"vjp:        {self.vjp_route}")
        if self.tasks:
            lines.append(f"tasks:      {self.tasks}")
        if self.cache:
            lines.append(f"cache:      {self.cache}")
        if self.run_report is not None:
            lines.append("measured:")
            lines.extend(f"  {line}" for line in str(self.run_report).splitlines())
        if self.task_ir:
            lines.append("task ir:")
            lines.extend(f"  {line}" for line in self.task_ir.splitlines())
        return "\n".join(lines)

    __repr__ = __str__


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
