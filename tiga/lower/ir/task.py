"""lower/ir: Task/Storage IR: when work may run and which copy supplies its operands.

`gf_storage.transfer` makes a page (a row range of one value) or a halo (ghost rows from a
peer rank) ready on a tier and yields a readiness event; `gf_task.launch` runs kernels once
its events fired and yields its results plus a completion event; `gf_storage.release` frees
a copy after the events it waits on (a value only tensor ops compute and read has none: it is
freed in program order); `gf_storage.join` joins events without a host-wide
synchronize. Values are never used after their release.
"""
from __future__ import annotations

from typing import ClassVar

from ...core.errors import CompilationError
from ...core.records import record
from ...core.types import Dim
from .base import (
    AttrReader,
    GenericOp,
    Module,
    Region,
    RelationOp,
    TensorOp,
    Value,
    op_label,
    register_op,
    verify_module,
    verify_region,
)
from .domain import declare_level
from .kernel import LaunchOp
from .syntax import EVENT, format_type

TIERS = ("host", "device", "disk")
# page: a row range; halo: ghost rows from a peer; gather: the distinct rows a page of a
# relation reads (paged runs); write / accumulate: a task's output rows stored into
# (added onto) the result on dst_tier
TRANSFER_KINDS = ("page", "halo", "gather", "write", "accumulate")
TASK_KINDS = ("interior", "boundary", "page")


def _nonneg(v) -> bool:
    return type(v) is int and v >= 0


def _check_range(rows, key: str, where: str) -> None:
    ok = isinstance(rows, tuple) and len(rows) == 2 and all(
        _nonneg(x) or isinstance(x, Dim) for x in rows)
    if ok and all(type(x) is int for x in rows):
        ok = rows[0] <= rows[1]
    if not ok:
        raise CompilationError(f"{where}: {key} must be [start, stop] with 0 <= start <= stop "
                               f"(integers or symbolic sizes), found {rows!r}")


def _check_events(values, what: str, where: str, at_least: int = 0) -> None:
    if len(values) < at_least:
        raise CompilationError(f"{where}: {what} needs at least {at_least} event operand(s)")
    for v in values:
        if v.type != EVENT:
            raise CompilationError(f"{where}: {what} operand %{v.name} must be a "
                                   f"!gf_storage.event, found {format_type(v.type)}")


def _split_events(operands: tuple) -> tuple:
    k = 0
    while k < len(operands) and operands[k].type == EVENT:
        k += 1
    return operands[:k], operands[k:]


@register_op
@record
class TransferOp:
    """`%e = gf_storage.transfer(%value, deps...)`: rows of a value made ready on a tier (or,
    kinds write / accumulate, a task's output rows stored into the result)."""

    event: Value
    value: Value
    deps: tuple = ()
    kind: str = "page"
    src_tier: str = "host"
    dst_tier: str = "host"
    page: int = 0
    rows: tuple = (0, 0)
    peer: int | None = None       # halo: the rank owning the ghost rows
    ghosts: int | None = None     # halo: how many ghost rows arrive
    stream: int | None = None     # page / gather: the loader that runs it (in op order)
    op_name: ClassVar[str] = "gf_storage.transfer"
    terminator: ClassVar[str] = ""
    regions = ()

    @property
    def operands(self) -> tuple:
        return (self.value,) + tuple(self.deps)

    @property
    def results(self) -> tuple:
        return (self.event,)

    def to_generic(self) -> GenericOp:
        attrs = [("kind", self.kind), ("src_tier", self.src_tier),
                 ("dst_tier", self.dst_tier), ("page", self.page), ("rows", self.rows)]
        if self.kind == "halo":
            attrs += [("peer", self.peer), ("ghosts", self.ghosts)]
        if self.stream is not None:
            attrs.append(("stream", self.stream))
        return GenericOp(self.op_name, self.results, self.operands, (), tuple(attrs))

    @classmethod
    def from_generic(cls, g: GenericOp) -> TransferOp:
        if len(g.results) != 1 or not g.operands or g.regions:
            raise CompilationError(f"{g.name}: takes a value (and events), yields one event")
        r = AttrReader(g.name, g.attrs)
        kind = r.take("kind")
        own = [r.take(k) for k in ("src_tier", "dst_tier", "page", "rows")]
        halo = [r.take("peer"), r.take("ghosts")] if kind == "halo" else [None, None]
        stream = r.take("stream", None)
        r.done()
        return cls(g.results[0], g.operands[0], g.operands[1:], kind, *own, *halo, stream)

    def verify(self, where: str, level: str) -> None:
        if self.event.type != EVENT or self.value.type == EVENT:
            raise CompilationError(f"{where}: a transfer moves a value (not an event) and "
                                   "yields a !gf_storage.event")
        _check_events(self.deps, "transfer dependency", where)
        if self.kind not in TRANSFER_KINDS:
            raise CompilationError(f"{where}: kind must be one of {', '.join(TRANSFER_KINDS)}, "
                                   f"found {self.kind!r}")
        for key in ("src_tier", "dst_tier"):
            if getattr(self, key) not in TIERS:
                raise CompilationError(f"{where}: {key} must be one of {', '.join(TIERS)}, "
                                       f"found {getattr(self, key)!r}")
        if not _nonneg(self.page):
            raise CompilationError(f"{where}: page must be a non-negative integer, found "
                                   f"{self.page!r}")
        _check_range(self.rows, "rows", where)
        if self.kind == "halo" and not (_nonneg(self.peer) and _nonneg(self.ghosts)):
            raise CompilationError(f"{where}: a halo transfer needs a peer rank and a ghost "
                                   f"count (non-negative integers), found peer={self.peer!r}, "
                                   f"ghosts={self.ghosts!r}")
        if self.stream is not None and not _nonneg(self.stream):
            raise CompilationError(f"{where}: a transfer's stream must be a non-negative "
                                   f"integer, found {self.stream!r}")


@register_op
@record
class ReleaseOp:
    """`gf_storage.release(%value, events...)`: the copy is recycled after the events fire."""

    value: Value
    deps: tuple
    tier: str = "host"
    op_name: ClassVar[str] = "gf_storage.release"
    terminator: ClassVar[str] = ""
    results = ()
    regions = ()

    @property
    def operands(self) -> tuple:
        return (self.value,) + tuple(self.deps)

    def to_generic(self) -> GenericOp:
        return GenericOp(self.op_name, (), self.operands, (), (("tier", self.tier),))

    @classmethod
    def from_generic(cls, g: GenericOp) -> ReleaseOp:
        if g.results or not g.operands or g.regions:
            raise CompilationError(f"{g.name}: takes a value and events, yields nothing")
        r = AttrReader(g.name, g.attrs)
        tier = r.take("tier")
        r.done()
        return cls(g.operands[0], g.operands[1:], tier)

    def verify(self, where: str, level: str) -> None:
        if self.value.type == EVENT:
            raise CompilationError(f"{where}: release frees a value, not an event")
        # (no events: every reader is a tensor op, which runs in program order)
        _check_events(self.deps, "release", where)
        if self.tier not in TIERS:
            raise CompilationError(f"{where}: tier must be one of {', '.join(TIERS)}, found "
                                   f"{self.tier!r}")


@register_op
@record
class JoinOp:
    """`%e = gf_storage.join(events...)`: fires once every operand event fired."""

    event: Value
    deps: tuple
    op_name: ClassVar[str] = "gf_storage.join"
    terminator: ClassVar[str] = ""
    regions = ()

    @property
    def operands(self) -> tuple:
        return tuple(self.deps)

    @property
    def results(self) -> tuple:
        return (self.event,)

    def to_generic(self) -> GenericOp:
        return GenericOp(self.op_name, self.results, self.operands)

    @classmethod
    def from_generic(cls, g: GenericOp) -> JoinOp:
        if len(g.results) != 1 or g.regions or g.attrs:
            raise CompilationError(f"{g.name}: joins events into one event, no attributes")
        return cls(g.results[0], g.operands)

    def verify(self, where: str, level: str) -> None:
        _check_events(self.deps, "join", where, at_least=1)
        if self.event.type != EVENT:
            raise CompilationError(f"{where}: join yields a !gf_storage.event")


TASK_ATTRS = ("task_kind", "page", "num_pages", "page_rows", "rank", "num_ranks",
              "halo_ranks", "halo_ghosts", "reads", "writes")


@register_op
@record
class TaskLaunchOp:
    """`gf_task.launch(events..., values...)`: a task over one page on one rank; its region
    (isolated, one argument per value) holds the kernel launches."""

    results: tuple                 # data results, then the completion event
    deps: tuple
    inputs: tuple
    body: Region
    task_kind: str = "interior"
    page: int = 0
    num_pages: int = 1
    page_rows: tuple = (0, 0)
    rank: int = 0
    num_ranks: int = 1
    halo_ranks: tuple = ()
    halo_ghosts: tuple = ()
    reads: tuple = ()
    writes: tuple = ()
    # the kernels the task runs beside its region's launches, by name: those no propagate
    # lowers to (a generated relation's cell directory build, a page's gather), bound to the
    # call's relations (printed only when there are some)
    kernels: tuple = ()
    op_name: ClassVar[str] = "gf_task.launch"
    terminator: ClassVar[str] = "gf_task.yield"

    @property
    def operands(self) -> tuple:
        return tuple(self.deps) + tuple(self.inputs)

    @property
    def regions(self) -> tuple:
        return (self.body,)

    def to_generic(self) -> GenericOp:
        attrs = tuple((k, getattr(self, k)) for k in TASK_ATTRS)
        if self.kernels:
            attrs += (("kernels", self.kernels),)
        return GenericOp(self.op_name, self.results, self.operands, (self.body,), attrs)

    @classmethod
    def from_generic(cls, g: GenericOp) -> TaskLaunchOp:
        if len(g.regions) != 1:
            raise CompilationError(f"{g.name}: needs exactly one region")
        r = AttrReader(g.name, g.attrs)
        own = [r.take(k) for k in TASK_ATTRS]
        kernels = r.take("kernels", ())
        r.done()
        deps, inputs = _split_events(g.operands)
        return cls(g.results, deps, inputs, g.regions[0], *own, kernels=kernels)

    def verify(self, where: str, level: str) -> None:
        _check_events(self.deps, "task dependency", where)
        if any(v.type == EVENT for v in self.inputs):
            raise CompilationError(f"{where}: event operands must come before the values")
        self._verify_placement(where)
        for key in ("reads", "writes", "kernels"):
            v = getattr(self, key)
            if not isinstance(v, tuple) or not all(isinstance(s, str) for s in v):
                raise CompilationError(f"{where}: {key} must be a list of strings")
        if [a.type for a in self.body.args] != [v.type for v in self.inputs]:
            raise CompilationError(f"{where}: the region takes one argument per value operand "
                                   "with the same type")
        verify_region(self.body, f"{where} body region", level, (TensorOp, LaunchOp))
        if not self.results or self.results[-1].type != EVENT:
            raise CompilationError(f"{where}: the last result must be the completion event")
        if [v.type for v in self.results[:-1]] != [v.type for v in self.body.results]:
            raise CompilationError(f"{where}: results must match the region's yielded values "
                                   "followed by the completion event")

    def _verify_placement(self, where: str) -> None:
        if self.task_kind not in TASK_KINDS:
            raise CompilationError(f"{where}: task_kind must be one of {', '.join(TASK_KINDS)}"
                                   f", found {self.task_kind!r}")
        for idx, count in (("page", "num_pages"), ("rank", "num_ranks")):
            i, n = getattr(self, idx), getattr(self, count)
            if not (_nonneg(i) and _nonneg(n) and i < n):
                raise CompilationError(f"{where}: {idx} must satisfy 0 <= {idx} < {count}, "
                                       f"found {idx}={i!r}, {count}={n!r}")
        _check_range(self.page_rows, "page_rows", where)
        ranks, ghosts = self.halo_ranks, self.halo_ghosts
        if not (isinstance(ranks, tuple) and isinstance(ghosts, tuple)
                and len(ranks) == len(ghosts)):
            raise CompilationError(f"{where}: halo_ranks and halo_ghosts must be lists of the "
                                   f"same length, found {ranks!r} and {ghosts!r}")
        if not all(_nonneg(g) for g in ghosts) or len(set(ranks)) != len(ranks) or not all(
                _nonneg(r) and r < self.num_ranks and r != self.rank for r in ranks):
            raise CompilationError(f"{where}: halo_ranks must be distinct peer ranks below "
                                   f"num_ranks={self.num_ranks} (not rank {self.rank}) with "
                                   f"non-negative ghost counts, found {ranks!r} / {ghosts!r}")
        if self.task_kind == "boundary" and not (ranks and self.deps):
            raise CompilationError(f"{where}: a boundary task reads halo rows, so it needs "
                                   "halo_ranks and an event to wait on")


class TaskModule(Module):   # (Module's dataclass methods: no fields of its own)
    level: ClassVar[str] = "task"

    def verify(self) -> None:
        verify_module(self)
        released: dict[str, int] = {}
        tiers: dict[str, set] = {}   # the tiers each released value was released on
        evented: set = set()     # values with an event: transferred, or a task's in/output
        for i, op in enumerate(self.body.ops):
            for v in op.operands:
                # (a value held on two tiers, a page's host and device copies, is released
                # once on each)
                again = (isinstance(op, ReleaseOp) and v.name == op.value.name and
                    op.tier not in tiers.get(v.name, ()))
                if v.name in released and not again:
                    raise CompilationError(
                        f"@{self.name}, op {i} ({op_label(op)}): %{v.name} is used after "
                        f"gf_storage.release (op {released[v.name]})")
            if isinstance(op, TransferOp):
                evented.add(op.value.name)
            elif isinstance(op, TaskLaunchOp):
                evented.update(v.name for v in op.operands + op.results)
            elif isinstance(op, ReleaseOp):
                if not op.deps and op.value.name in evented:
                    raise CompilationError(
                        f"@{self.name}, op {i} (gf_storage.release): %{op.value.name} is "
                        "transferred or touched by a task, so its release needs at least 1 "
                        "event operand (only values that tensor ops alone compute and read "
                        "are released in program order)")
                released[op.value.name] = i
                tiers.setdefault(op.value.name, set()).add(op.tier)
        for v in self.body.results:
            if v.name in released:
                raise CompilationError(f"@{self.name}: %{v.name} is returned after its "
                                       f"gf_storage.release (op {released[v.name]})")


parse_task, print_task, verify_task = declare_level(
    TaskModule, top=(TensorOp, RelationOp, TaskLaunchOp, TransferOp, ReleaseOp, JoinOp),
    nested=(TensorOp, RelationOp, LaunchOp))
