"""lower/ir: Kernel IR, `gf_kernel.launch`: work mapping, what is materialised, run-time guards
and (once `select_kernel_schedule` ran) the schedule attributes.

Guards are the facts the generated code relies on and the runtime checks before a launch:
`row_ptr = "validated"` (CSR offsets are monotone and in range, so the walk skips bounds
checks), `col_idx = "in-bounds"`, and `max_degree` (an int or symbolic bound, or "dynamic"
when the kernel loops over neighbour tiles of any length).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from ...core.errors import CompilationError
from ...core.types import Dim
from .base import (
    AttrReader,
    GenericOp,
    Module,
    RelationOp,
    TensorOp,
    parse_checked,
    register_level,
    register_op,
)
from .domain import Computation, ComputationOp
from .iter import check_traversal
from .syntax import AttrDict

TRAVERSAL_OF = {"compressed-row": "csr-row", "dense": "dense-row",
                "triangular": "triangular-row", "cu-seqlens": "segment-row",
                "stencil": "stencil-row", "cat": "csr-row",
                "cell-directory": "cell-directory-row", "knn-shells": "knn-shell-row",
                "knn-tiled-scan": "knn-tile-row"}
READS_ROW_PTR = ("csr-row", "transposed-csr-row")
MATERIALIZABLE = ("csr", "transposed-csr")
GUARD_KEYS = ("row_ptr", "col_idx", "max_degree")
ROW_PARTITIONS = ("edge-balanced", "row-balanced")
PARALLEL_MODES = ("rows", "partial_sums", "single")


def traversal_for(hierarchy: str, ordering: str) -> str:
    return "transposed-csr-row" if ordering == "source-major" else TRAVERSAL_OF[hierarchy]


def materialized_for(hierarchy: str, ordering: str) -> tuple:
    """Arrays a traversal needs that the relation does not store: implicit relations walked
    by source resolve their CSR before transposing it."""
    out = []
    if hierarchy == "cat" or (ordering == "source-major" and hierarchy != "compressed-row"):
        out.append("csr")
    if ordering == "source-major":
        out.append("transposed-csr")
    return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """The schedule attributes a launch carries; num_warps/pipeline_stages serve Triton."""

    block_rows: int
    block_neighbors: int
    vector_width: int
    threads: int
    num_warps: int
    pipeline_stages: int
    row_partition: str = "edge-balanced"
    # what the cpu-llvm renderer reads (lower/schedule.py decides them)
    edge_unroll: int = 1          # independent accumulators per row of a reassociable fold
    prefetch_distance: int = 0    # edges ahead of the gathered-row software prefetch (0: none)
    parallel: str = "rows"        # rows | partial_sums | single (how row chunks may run)

    def attrs(self) -> list:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]

    def verify(self, where: str) -> None:
        pow2 = {"block_rows": 4096, "block_neighbors": 4096}
        for key, top in pow2.items():
            v = getattr(self, key)
            if type(v) is not int or v < 1 or v > top or v & (v - 1):
                raise CompilationError(f"{where}: {key} must be a power of two in [1, {top}], "
                                       f"found {v!r}")
        choices = {"vector_width": (1, 2, 4, 8, 16), "num_warps": (1, 2, 4, 8, 16, 32),
                   "edge_unroll": (1, 2, 4, 8, 16)}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed or type(getattr(self, key)) is not int:
                raise CompilationError(f"{where}: {key} must be one of {allowed}, found "
                                       f"{getattr(self, key)!r}")
        for key, low, top in (("threads", 1, 4096), ("pipeline_stages", 1, 8),
                              ("prefetch_distance", 0, 4096)):
            v = getattr(self, key)
            if type(v) is not int or not low <= v <= top:
                raise CompilationError(f"{where}: {key} must be an integer in [{low}, {top}], "
                                       f"found {v!r}")
        if self.row_partition not in ROW_PARTITIONS:
            raise CompilationError(f"{where}: row_partition must be one of "
                                   f"{', '.join(ROW_PARTITIONS)}, found {self.row_partition!r}")
        if self.parallel not in PARALLEL_MODES:
            raise CompilationError(f"{where}: parallel must be one of "
                                   f"{', '.join(PARALLEL_MODES)}, found {self.parallel!r}")


SCHEDULE_KEYS = tuple(f.name for f in fields(Schedule))


@register_op
@dataclass(frozen=True)
class LaunchOp(ComputationOp):
    """`gf_kernel.launch`: one fused kernel for a propagate (messages never materialised)."""

    comp: Computation
    coordinate_hierarchy: str
    ordering: str
    traversal: str
    materializes: tuple
    guards: AttrDict
    schedule: Schedule | None = None
    op_name: ClassVar[str] = "gf_kernel.launch"
    terminator: ClassVar[str] = "gf_kernel.yield"

    def own_attrs(self) -> list:
        out = [("coordinate_hierarchy", self.coordinate_hierarchy),
               ("ordering", self.ordering), ("traversal", self.traversal),
               ("materializes", self.materializes), ("guards", self.guards)]
        return out + (self.schedule.attrs() if self.schedule is not None else [])

    @classmethod
    def from_generic(cls, g: GenericOp) -> LaunchOp:
        r = AttrReader(g.name, g.attrs)
        own = [r.take(k) for k in ("coordinate_hierarchy", "ordering", "traversal",
                                   "materializes", "guards")]
        present = [k for k in SCHEDULE_KEYS if k in r.attrs]
        schedule = None
        if present:
            missing = [k for k in SCHEDULE_KEYS if k not in present]
            if missing:
                raise CompilationError(f"{g.name}: schedule attribute(s) {', '.join(missing)} "
                                       f"missing (a schedule sets all of "
                                       f"{', '.join(SCHEDULE_KEYS)})")
            schedule = Schedule(*[r.take(k) for k in SCHEDULE_KEYS])
        comp = Computation.from_generic(g, r)
        r.done()
        return cls(comp, *own, schedule)

    def verify(self, where: str, level: str) -> None:
        self.comp.verify(where, level)
        check_traversal(self.comp, self.coordinate_hierarchy, self.ordering, where)
        want = traversal_for(self.coordinate_hierarchy, self.ordering)
        if self.traversal != want:
            raise CompilationError(f"{where}: traversal {self.traversal!r} does not implement a "
                                   f"{self.ordering} {self.coordinate_hierarchy} walk "
                                   f"(expected {want!r})")
        if (not isinstance(self.materializes, tuple)
                or any(m not in MATERIALIZABLE for m in self.materializes)):
            raise CompilationError(f"{where}: materializes must list entries of "
                                   f"{', '.join(MATERIALIZABLE)}, found {self.materializes!r}")
        self._verify_guards(where)
        if self.schedule is not None:
            self.schedule.verify(where)

    def _verify_guards(self, where: str) -> None:
        if not isinstance(self.guards, AttrDict):
            raise CompilationError(f"{where}: guards must be a dictionary attribute")
        g = dict(self.guards)
        for key in g:
            if key not in GUARD_KEYS:
                raise CompilationError(f"{where}: unknown guard {key!r} (guards: "
                                       f"{', '.join(GUARD_KEYS)})")
        if self.traversal in READS_ROW_PTR and g.get("row_ptr") != "validated":
            raise CompilationError(f"{where}: traversal {self.traversal!r} reads row_ptr, so it "
                                   "needs the guard row_ptr = \"validated\"")
        if "row_ptr" in g and g["row_ptr"] != "validated":
            raise CompilationError(f"{where}: guard row_ptr must be \"validated\", found "
                                   f"{g['row_ptr']!r}")
        if "col_idx" in g and g["col_idx"] != "in-bounds":
            raise CompilationError(f"{where}: guard col_idx must be \"in-bounds\", found "
                                   f"{g['col_idx']!r}")
        bound = g.get("max_degree", "dynamic")
        if not (bound == "dynamic" or isinstance(bound, Dim)
                or (type(bound) is int and bound >= 0)):
            raise CompilationError(f"{where}: guard max_degree must be a non-negative integer, "
                                   f"a symbolic size or \"dynamic\", found {bound!r}")


@dataclass(frozen=True)
class KernelModule(Module):
    level: ClassVar[str] = "kernel"


register_level(KernelModule, top=(TensorOp, RelationOp, LaunchOp),
               nested=(TensorOp, RelationOp, LaunchOp))


def parse_kernel(text: str) -> KernelModule:
    return parse_checked(text, KernelModule)


def print_kernel(module: KernelModule) -> str:
    return str(module)


def verify_kernel(module: KernelModule) -> None:
    module.verify()
