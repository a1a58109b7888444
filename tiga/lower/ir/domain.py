"""lower/ir: Domain IR, `gf.apply`: relation, field roles and names, reducer algebra, regions.

`Computation` is the semantic payload of one propagate. The Iter and Kernel ops carry it
unchanged and add their own decisions, so every level keeps what the messages mean.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from ...core.dtypes import DType, int64
from ...core.errors import CompilationError
from ...core.prims.graph import REDUCE_BY, ROLES, propagate_p
from ...core.records import record
from ...core.reducers import ARG, ARG_OF, BUILTIN, EMPTY_SETTABLE
from ...core.types import GraphType, TensorType
from .base import (
    AttrReader,
    GenericOp,
    Module,
    Region,
    RelationOp,
    TensorOp,
    Value,
    check_rule,
    propagate_params,
    register_level,
    register_op,
    verify_region,
)
from .syntax import format_type
from .text import parse_checked

BUILTIN_IDENTITY = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0,
                    "online_softmax": 0.0, "argmin": math.inf, "argmax": -math.inf}
REGION_KINDS = ("edge", "update", "reducer.lift", "reducer.combine", "reducer.finalize")


@record
class ReducerSpec:
    """A reducer's algebra: identity, state types per output, and regions for user reducers."""

    name: str
    builtin: bool
    identity: Any
    state: tuple                      # one tuple of state types per reduced output
    commutative: bool = True
    associative: bool = True
    prune_threshold: float | None = None
    lift: Region | None = None
    combine: Region | None = None
    finalize: Region | None = None
    # online_softmax(stats): the per-row (max, mass) are outputs too (residuals the VJP reads)
    stats: bool = False
    empty: float | None = None        # max/min/prod: an empty row's value (None: 0, prod 1)
    of: str | None = None             # argmin/argmax: "src" or "edge" ids

    @property
    def arity(self) -> int:
        return 2 if self.builtin and self.name in ("online_softmax",) + ARG else 1


def builtin_state(name: str, parts: list) -> tuple:
    """State types of a built-in reducer over one output's message parts."""
    parts = [t.strong() for t in parts]
    if name == "online_softmax":
        score, value = parts
        return (score, score, value)           # running max, mass, weighted accumulator
    if name in ARG:                            # best message and its (smallest) id
        return (parts[0], TensorType(parts[0].shape, int64))
    if name == "mean":
        return (parts[0], TensorType((), int64))  # running sum and edge count
    return (parts[0],)


@record
class Computation:
    """What one propagate computes, independent of how it is traversed or scheduled."""

    results: tuple
    relation: Value
    inputs: tuple
    input_roles: tuple
    input_names: tuple
    reducer: ReducerSpec
    reduce_by: str | tuple            # a side, or one side per output (a multi-output walk)
    edge: Region
    update: Region | None = None

    @property
    def operands(self) -> tuple:
        return (self.relation,) + tuple(self.inputs)

    def named_regions(self) -> list:
        r = self.reducer
        found = [("edge", self.edge), ("update", self.update), ("reducer.lift", r.lift),
                 ("reducer.combine", r.combine), ("reducer.finalize", r.finalize)]
        return [(k, v) for k, v in found if v is not None]

    def attrs(self) -> list:
        r = self.reducer
        out = [("input_roles", self.input_roles), ("input_names", self.input_names),
               ("reduce_by", self.reduce_by), ("reducer", r.name),
               ("reducer_kind", "builtin" if r.builtin else "user"),
               ("reducer_identity", r.identity), ("reducer_state", r.state)]
        if not r.builtin:
            out += [("reducer_commutative", r.commutative),
                    ("reducer_associative", r.associative)]
        if r.prune_threshold is not None:
            out.append(("reducer_prune_threshold", r.prune_threshold))
        if r.stats:
            out.append(("reducer_stats", True))
        if r.empty is not None:
            out.append(("reducer_empty", r.empty))
        if r.of is not None:
            out.append(("reducer_of", r.of))
        out.append(("region_kinds", tuple(k for k, _ in self.named_regions())))
        return out

    @classmethod
    def from_generic(cls, g: GenericOp, r: AttrReader) -> Computation:
        if not g.operands:
            raise CompilationError(f"{g.name}: the first operand must be the relation")
        roles, names = r.take("input_roles"), r.take("input_names")
        reduce_by, name, kind = r.take("reduce_by"), r.take("reducer"), r.take("reducer_kind")
        if kind not in ("builtin", "user"):
            raise CompilationError(f"{g.name}: reducer_kind must be \"builtin\" or \"user\", "
                                   f"found {kind!r}")
        identity, state = r.take("reducer_identity"), _state_types(r.take("reducer_state"))
        user = kind == "user"
        comm = r.take("reducer_commutative") if user else True
        assoc = r.take("reducer_associative") if user else True
        prune = r.take("reducer_prune_threshold", None)
        stats = r.take("reducer_stats", False)
        empty, of = r.take("reducer_empty", None), r.take("reducer_of", None)
        regions = _regions_by_kind(g, r.take("region_kinds"))
        spec = ReducerSpec(name, not user, identity, state, comm, assoc, prune,
                           regions.get("reducer.lift"), regions.get("reducer.combine"),
                           regions.get("reducer.finalize"), stats,
                           None if empty is None else float(empty), of)
        return cls(g.results, g.operands[0], g.operands[1:], roles, names, spec, reduce_by,
                   regions["edge"], regions.get("update"))

    def verify(self, where: str, level: str) -> None:
        self._verify_attrs(where)
        for kind, region in self.named_regions():
            verify_region(region, f"{where} {kind} region", level, (TensorOp,))
        self._verify_reducer(where)
        check_rule(propagate_p, self.operands, self.results, propagate_params(self), where)

    def _verify_attrs(self, where: str) -> None:
        if not isinstance(self.relation.type, GraphType):
            raise CompilationError(f"{where}: the first operand %{self.relation.name} must be a "
                                   f"!gf.relation, found {format_type(self.relation.type)}")
        n = len(self.inputs)
        for key in ("input_roles", "input_names"):
            value = getattr(self, key)
            if not isinstance(value, tuple) or not all(isinstance(s, str) for s in value):
                raise CompilationError(f"{where}: {key} must be a list of strings")
            if len(value) != n:
                raise CompilationError(f"{where}: {key} has {len(value)} entries for {n} "
                                       "field operand(s)")
        for role, name in zip(self.input_roles, self.input_names):
            if role not in ROLES:
                raise CompilationError(f"{where}: input role {role!r} of {name!r} is not one "
                                       f"of {', '.join(ROLES)}")
            # (dotted names: the canonical attention VJP operands, `attn.dq.q`)
            if not all(part.isidentifier() for part in name.split(".")):
                raise CompilationError(f"{where}: input name {name!r} is not an identifier "
                                       "(or dotted identifiers)")
        by = self.reduce_by
        if isinstance(by, tuple):
            if not by or any(side not in ("dst", "src") for side in by):
                raise CompilationError(f"{where}: a per-output reduce_by lists dst or src per "
                                       f"output, found {list(by)!r}")
        elif by not in REDUCE_BY:
            raise CompilationError(f"{where}: reduce_by must be one of {', '.join(REDUCE_BY)}, "
                                   f"found {by!r} (or a list of dst/src, one per output)")

    def _verify_reducer(self, where: str) -> None:
        r = self.reducer
        msgs = [v.type for v in self.edge.results]
        if r.builtin:
            if r.name not in BUILTIN:
                raise CompilationError(f"{where}: reducer {r.name!r} is not built in (one of "
                                       f"{', '.join(BUILTIN)}); use reducer_kind = \"user\"")
            if r.lift or r.combine or r.finalize:
                raise CompilationError(f"{where}: built-in reducer {r.name} takes no regions")
            if r.identity != BUILTIN_IDENTITY[r.name]:
                raise CompilationError(f"{where}: the {r.name} identity is "
                                       f"{BUILTIN_IDENTITY[r.name]!r}, found {r.identity!r}")
            if (r.prune_threshold is not None or r.stats) and r.name != "online_softmax":
                raise CompilationError(f"{where}: only online_softmax takes a prune threshold "
                                       "or reducer_stats")
            _verify_builtin_options(r, where)
        elif r.combine is None:
            raise CompilationError(f"{where}: user reducer {r.name!r} needs a reducer.combine "
                                   "region")
        if not isinstance(r.commutative, bool) or not isinstance(r.associative, bool):
            raise CompilationError(f"{where}: reducer_commutative/associative must be booleans")
        k = r.arity
        if len(msgs) % k:
            raise CompilationError(f"{where}: {r.name} takes {k} message parts per output, the "
                                   f"edge region yields {len(msgs)}")
        want = tuple(builtin_state(r.name, msgs[i:i + k]) if r.builtin
                     else (r.combine.args[0].type,) for i in range(0, len(msgs), k))
        if r.state != want:
            raise CompilationError(f"{where}: reducer_state is {_fmt_state(r.state)} but {r.name} "
                                   f"over these messages keeps {_fmt_state(want)}")


def _state_types(state):
    """Scalar state types read back as dtypes (attribute syntax); make them tensor types."""
    if not isinstance(state, tuple):
        return state
    return tuple(tuple(TensorType((), t) if isinstance(t, DType) else t for t in s)
                 if isinstance(s, tuple) else s for s in state)


def _verify_builtin_options(r: ReducerSpec, where: str) -> None:
    if r.empty is not None and (r.name not in EMPTY_SETTABLE
                                or not isinstance(r.empty, (int, float))):
        raise CompilationError(f"{where}: reducer_empty is a number for "
                               f"{', '.join(EMPTY_SETTABLE)} only, found {r.empty!r} on {r.name}")
    if (r.name in ARG) != (r.of in ARG_OF):
        raise CompilationError(f"{where}: reducer_of is one of {ARG_OF} on {', '.join(ARG)} "
                               f"(and absent elsewhere), found {r.of!r} on {r.name}")


def _fmt_state(state) -> str:
    try:
        return "[" + ", ".join("[" + ", ".join(format_type(t) for t in s) + "]"
                               for s in state) + "]"
    except (TypeError, CompilationError):
        return repr(state)


def _regions_by_kind(g: GenericOp, kinds) -> dict:
    if not isinstance(kinds, tuple) or not kinds or kinds[0] != "edge":
        raise CompilationError(f"{g.name}: region_kinds must start with \"edge\", found "
                               f"{kinds!r}")
    if any(k not in REGION_KINDS for k in kinds) or list(kinds) != sorted(
            kinds, key=REGION_KINDS.index) or len(set(kinds)) != len(kinds):
        raise CompilationError(f"{g.name}: region_kinds {list(kinds)} must be distinct, taken "
                               f"from {', '.join(REGION_KINDS)} in that order")
    if len(kinds) != len(g.regions):
        raise CompilationError(f"{g.name}: region_kinds names {len(kinds)} region(s) but the op "
                               f"has {len(g.regions)}")
    return dict(zip(kinds, g.regions))


class ComputationOp:
    """Shared behaviour of gf.apply, gf_iter.traverse and gf_kernel.launch."""

    comp: Computation
    op_name: ClassVar[str]

    @property
    def operands(self) -> tuple:
        return self.comp.operands

    @property
    def results(self) -> tuple:
        return self.comp.results

    @property
    def regions(self) -> tuple:
        return tuple(r for _, r in self.comp.named_regions())

    def own_attrs(self) -> list:
        return []

    def to_generic(self) -> GenericOp:
        return GenericOp(self.op_name, self.comp.results, self.comp.operands, self.regions,
                         tuple(self.own_attrs() + self.comp.attrs()))


@register_op
@record
class ApplyOp(ComputationOp):
    """`gf.apply`: messages over a relation, reduced by a reducer; no traversal chosen yet."""

    comp: Computation
    op_name: ClassVar[str] = "gf.apply"
    terminator: ClassVar[str] = "gf.yield"

    @classmethod
    def from_generic(cls, g: GenericOp) -> ApplyOp:
        r = AttrReader(g.name, g.attrs)
        comp = Computation.from_generic(g, r)
        r.done()
        return cls(comp)

    def verify(self, where: str, level: str) -> None:
        self.comp.verify(where, level)


class DomainModule(Module):   # (Module's dataclass methods: no fields of its own)
    level: ClassVar[str] = "domain"


def declare_level(cls: type, top: tuple, nested: tuple) -> tuple:
    """Register the module class `cls` as an IR level (`top`: the ops its function body may
    hold, `nested`: those inside its ops' regions) and return the level's `parse_<level>`,
    `print_<level>` and `verify_<level>`. Every level reads, prints and checks its text the
    same way, so the three are made here once for all four levels (Domain is the first one:
    iter, kernel and task build on this module)."""
    register_level(cls, top=top, nested=nested)

    def parse(text: str) -> Module:
        return parse_checked(text, cls)

    def print_(module: Module) -> str:
        return str(module)

    def verify(module: Module) -> None:
        module.verify()

    for fn, verb in ((parse, "parse"), (print_, "print"), (verify, "verify")):
        fn.__name__ = fn.__qualname__ = f"{verb}_{cls.level}"   # tracebacks name the level
    return parse, print_, verify


parse_domain, print_domain, verify_domain = declare_level(
    DomainModule, top=(TensorOp, RelationOp, ApplyOp), nested=(TensorOp, RelationOp, ApplyOp))
