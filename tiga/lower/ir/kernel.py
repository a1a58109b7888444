"""lower/ir: Kernel IR, `gf_kernel.launch`: work mapping, what is materialised, run-time guards
and (once `select_kernel_schedule` ran) the schedule attributes.

Guards are the facts the generated code relies on and the runtime checks before a launch:
`row_ptr = "validated"` (CSR offsets are monotone and in range, so the walk skips bounds
checks), `col_idx = "in-bounds"`, and `max_degree` (an int or symbolic bound, or "dynamic"
when the kernel loops over neighbour tiles of any length).
"""
from __future__ import annotations

import hashlib
from dataclasses import fields, replace
from functools import cached_property
from typing import ClassVar

from ...core.errors import CompilationError
from ...core.records import record
from ...core.types import Dim
from .base import (
    AttrReader,
    GenericOp,
    Module,
    RelationOp,
    TensorOp,
    register_op,
)
from .domain import Computation, ComputationOp, declare_level
from .iter import check_traversal
from .syntax import AttrDict, format_attr
from .text import print_op

TRAVERSAL_OF = {"compressed-row": "csr-row", "dense": "dense-row",
                "triangular": "triangular-row", "cu-seqlens": "segment-row",
                "stencil": "stencil-row", "cat": "csr-row",
                "cell-directory": "cell-directory-row", "knn-shells": "knn-shell-row",
                "knn-tiled-scan": "knn-tile-row", "attention-tiles": "attention-tiles"}
READS_ROW_PTR = ("csr-row", "transposed-csr-row")
MATERIALIZABLE = ("csr", "transposed-csr")
GUARD_KEYS = ("row_ptr", "col_idx", "max_degree")
ROW_PARTITIONS = ("edge-balanced", "row-balanced")
PARALLEL_MODES = ("rows", "partial_sums", "single")


# implicit relations walked by source natively: the transposed walk computes each source's
# destinations and edge ids as the forward walk does (no CSR, no transpose)
TRANSPOSED_NATIVE = ("dense", "triangular", "cu-seqlens", "stencil")


def traversal_for(hierarchy: str, ordering: str) -> str:
    # (attention walks both ways over its row ranges: key blocks for the backward)
    if ordering == "source-major" and hierarchy in TRANSPOSED_NATIVE:
        return "transposed-" + TRAVERSAL_OF[hierarchy]
    if ordering == "source-major" and hierarchy != "attention-tiles":
        return "transposed-csr-row"
    return TRAVERSAL_OF[hierarchy]


def materialized_for(hierarchy: str, ordering: str) -> tuple:
    """Arrays a traversal needs that the relation does not store: a stored relation walked
    by source, its transposed CSR (sized by the edges); implicit ones walk it natively."""
    out = []
    if hierarchy == "attention-tiles" or hierarchy in TRANSPOSED_NATIVE:
        return ()   # (attention: per-row source ranges; implicit kinds: computed walks)
    if hierarchy == "cat" or (ordering == "source-major" and hierarchy != "compressed-row"):
        out.append("csr")
    if ordering == "source-major":
        out.append("transposed-csr")
    return tuple(out)


TARGETS = ("cpu-llvm", "triton")
# The schedule attributes each target's renderer and launcher read; the others stay None
# and are not printed, so a launch shows only what runs. cpu-llvm: the runtime runs
# `threads` threads over row chunks (row_partition, chunks_per_thread chunks per thread)
# and the kernel keeps edge_unroll accumulators and prefetches prefetch_distance edges
# ahead; its feature loops are scalar IR that LLVM vectorises for the host, so no vector
# width is Tiga's choice there. triton: a program per block_rows rows, neighbours in tiles
# of block_neighbors, vector_width-wide feature tiles, num_warps, pipeline_stages.
TARGET_KEYS = {
    "cpu-llvm": ("threads", "row_partition", "chunks_per_thread", "edge_unroll",
                 "prefetch_distance", "parallel"),
    "triton": ("block_rows", "block_neighbors", "vector_width", "num_warps",
               "pipeline_stages", "parallel"),
}


@record
class Schedule:
    """The schedule attributes of a launch for one target (TARGET_KEYS: the others are
    None). `tiles` holds a walk's own tile sizes (knn-tiled-scan, attention) by name."""

    target: str = "cpu-llvm"
    threads: int | None = None
    row_partition: str | None = None
    chunks_per_thread: int | None = None
    edge_unroll: int | None = None       # independent accumulators per row of a sum
    prefetch_distance: int | None = None  # edges ahead of the gathered-row prefetch (0: none)
    parallel: str = "rows"               # rows | partial_sums | single (how row chunks run)
    block_rows: int | None = None
    block_neighbors: int | None = None
    vector_width: int | None = None
    num_warps: int | None = None
    pipeline_stages: int | None = None
    tiles: AttrDict = AttrDict()

    def attrs(self) -> list:
        out = [("target", self.target)]
        out += [(k, getattr(self, k)) for k in TARGET_KEYS.get(self.target, ())]
        return out + ([("tiles", self.tiles)] if self.tiles else [])

    def tile(self, name: str) -> int:
        found = dict(self.tiles).get(name)
        if type(found) is not int:
            raise CompilationError(f"schedule tiles: {name} must be an integer, found "
                                   f"{found!r} (tiles: {dict(self.tiles)})")
        return found

    @classmethod
    def from_attrs(cls, r: AttrReader, where: str) -> Schedule | None:
        if not any(k in r.attrs for k in SCHEDULE_KEYS):
            return None
        target = r.take("target", None)
        if target not in TARGET_KEYS:
            raise CompilationError(f"{where}: schedule attribute target must be one of "
                                   f"{', '.join(TARGET_KEYS)}, found {target!r}")
        want = TARGET_KEYS[target]
        missing = [k for k in want if k not in r.attrs]
        if missing:
            raise CompilationError(f"{where}: schedule attribute(s) {', '.join(missing)} "
                                   f"missing (a {target} schedule sets all of "
                                   f"{', '.join(want)})")
        other = [k for k in SCHEDULE_KEYS if k in r.attrs and k not in want and k != "tiles"]
        if other:
            raise CompilationError(f"{where}: {', '.join(other)} is not a {target} schedule "
                                   f"attribute (a {target} schedule sets {', '.join(want)})")
        tiles = r.take("tiles", AttrDict())
        return cls(target=target, tiles=tiles, **{k: r.take(k) for k in want})

    def verify(self, where: str) -> None:
        if self.target not in TARGET_KEYS:
            raise CompilationError(f"{where}: target must be one of {', '.join(TARGET_KEYS)}, "
                                   f"found {self.target!r}")
        want = TARGET_KEYS[self.target]
        for key in SCHEDULE_KEYS:
            if (key not in want and key not in ("target", "tiles") and
                    getattr(self, key) is not None):
                raise CompilationError(f"{where}: {key} is not a {self.target} schedule "
                                       f"attribute, found {getattr(self, key)!r}")
        for key in want:
            _check_value(key, getattr(self, key), where)
        if not isinstance(self.tiles, AttrDict) or any(
                type(v) is not int or v < 1 for _, v in self.tiles):
            raise CompilationError(f"{where}: tiles must be a dictionary of positive integers, "
                                   f"found {format_attr(self.tiles)}")


# key -> ("pow2", top) | ("choice", allowed) | ("range", low, top) | ("name", allowed)
_RULES = {"block_rows": ("pow2", 4096), "block_neighbors": ("pow2", 4096),
          "vector_width": ("choice", (1, 2, 4, 8, 16)),
          "num_warps": ("choice", (1, 2, 4, 8, 16, 32)),
          "edge_unroll": ("choice", (1, 2, 4, 8, 16)),
          "threads": ("range", 1, 4096), "pipeline_stages": ("range", 1, 8),
          "prefetch_distance": ("range", 0, 4096), "chunks_per_thread": ("range", 1, 4096),
          "row_partition": ("name", ROW_PARTITIONS), "parallel": ("name", PARALLEL_MODES)}


def _check_value(key: str, v, where: str) -> None:
    rule = _RULES[key]
    if rule[0] == "pow2":
        if type(v) is not int or v < 1 or v > rule[1] or v & (v - 1):
            raise CompilationError(f"{where}: {key} must be a power of two in [1, {rule[1]}], "
                                   f"found {v!r}")
    elif rule[0] == "choice":
        if type(v) is not int or v not in rule[1]:
            raise CompilationError(f"{where}: {key} must be one of {rule[1]}, found {v!r}")
    elif rule[0] == "range":
        if type(v) is not int or not rule[1] <= v <= rule[2]:
            raise CompilationError(f"{where}: {key} must be an integer in [{rule[1]}, "
                                   f"{rule[2]}], found {v!r}")
    elif v not in rule[1]:
        raise CompilationError(f"{where}: {key} must be one of {', '.join(rule[1])}, found "
                               f"{v!r}")


SCHEDULE_KEYS = tuple(f.name for f in fields(Schedule))


@register_op
@record
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

    @property
    def target(self) -> str:
        """The backend target the op is scheduled for (its renderer and launcher)."""
        return self.schedule.target if self.schedule is not None else "cpu-llvm"

    @cached_property
    def name(self) -> str:
        """`k` + a digest of the printed op with the pool size printed as 0 (the pool splits
        rows at launch, never changes the code) and without the names of its operands and
        results (the module's, not the kernel's: a page's module and the program's name them
        differently): equal kernels share a name, so the name of a kernel that ran finds its
        op in a printed Task module."""
        plain = self.schedule is None or self.schedule.threads is None
        op = self if plain else replace(self, schedule=replace(self.schedule, threads=0))
        # (the first line is `%results = "gf_kernel.launch"(%operands) ({`; the region is
        # isolated from above, so no other line names them)
        body = print_op(op).split("\n", 1)[1]
        head = f"{len(self.results)} = {self.op_name}({len(self.operands)})\n"
        return "k" + hashlib.sha256((head + body).encode()).hexdigest()[:16]

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
        schedule = Schedule.from_attrs(r, g.name)
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


class KernelModule(Module):   # (Module's dataclass methods: no fields of its own)
    level: ClassVar[str] = "kernel"


parse_kernel, print_kernel, verify_kernel = declare_level(
    KernelModule, top=(TensorOp, RelationOp, LaunchOp), nested=(TensorOp, RelationOp, LaunchOp))
