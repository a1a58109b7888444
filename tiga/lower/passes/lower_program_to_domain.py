"""lower/passes: GraphProgram -> Domain IR: one gf.apply per propagate equation (edge, update
and reducer sub-programs become regions); every other equation stays a gf_tensor op.

Names follow the program's meaning where it has one: the relation is `%graph`, field
operands take their field names (`%x`, `%w`), edge-region arguments `%src_x`, `%edge_w`,
yielded messages `%message`; everything else is numbered.
"""
from __future__ import annotations

import weakref

import numpy as np

from ...autodiff.inlining import has_custom_calls, inline_custom_calls
from ...core.config import config
from ...core.errors import CompilationError
from ...core.prims.graph import propagate_p
from ...core.program import ClosedProgram, GraphProgram, Lit, Var, array_digest
from ...core.reducers import Reducer
from ...core.types import GraphType
from ..ir.base import Region, RelationOp, TensorOp, Value, tensor_params
from ..ir.domain import ApplyOp, Computation, DomainModule, ReducerSpec, builtin_state
from ..ir.syntax import to_attr
from .common import Namer


class _Block:
    """Lowers one GraphProgram body into one region, with its own SSA names."""

    def __init__(self, taken=()):
        self.namer = Namer(taken)
        self.values: dict[int, Value] = {}
        self.ops: list = []
        self.relations: dict[tuple, Value] = {}  # one gf.relation per distinct constant

    def define(self, var, hint=None) -> Value:
        v = Value(self.namer.fresh(hint), var.type)
        self.values[id(var)] = v
        return v

    def operand(self, atom) -> Value:
        """A Var's value; a literal becomes a constant (or gf.relation) op at first use."""
        if id(atom) in self.values:
            return self.values[id(atom)]
        if not isinstance(atom, Lit):
            raise CompilationError(f"lower-program-to-domain: {atom!r} is used before it is "
                                   "defined")
        if isinstance(atom.type, GraphType):
            attrs = _relation_attrs(atom.value)
            v = self.relations.get((atom.type, attrs))
            if v is None:
                v = self.relations[(atom.type, attrs)] = self.define(atom, "graph")
                self.ops.append(RelationOp(v, attrs))
            self.values[id(atom)] = v
        else:
            v = self.define(atom, "cst")
            # (a constant's value attribute is flat, row-major: what the text prints)
            value = (np.asarray(atom.value).reshape(-1) if np.ndim(atom.value) > 1
                else atom.value)
            self.ops.append(TensorOp("constant", (), (v,), (("value", to_attr(value)),)))
        return v


def _relation_attrs(graph) -> tuple:
    """What identifies a constant relation: its CSR digest, or its generator's parameters
    (memoised per relation: relations are immutable, and hashing a large CSR takes time)."""
    found = _ATTRS.get(graph)
    if found is None:
        found = _ATTRS[graph] = _identify(graph)
    return found


_ATTRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # relation -> its attrs


def _identify(graph) -> tuple:
    attrs = [("origin", "constant")]
    kind, params = graph.kind, getattr(graph, "params", {})
    if kind == "cu_seqlens":
        attrs += [("cu_seqlens_digest", array_digest(params["cu_seqlens"])),
                  ("causal", bool(params["causal"]))]
    elif kind == "stencil":
        attrs += [("shape", to_attr(params["shape"])), ("offsets", to_attr(params["offsets"])),
                  ("periodic", bool(params["periodic"]))]
    elif kind in ("radius", "knn"):   # (by its generator: the relation stays unmaterialised)
        q = params["query"]
        attrs += [("positions_digest", array_digest(params["positions"]) +
                   ("" if q is None else array_digest(q)))]
        attrs += [(k, to_attr(params[k])) for k in ("cutoff", "k", "loop", "max_neighbors")
                  if params.get(k) is not None]
    elif kind == "paged":              # (a committed store version never changes)
        attrs += [("path", str(params["path"])), ("version", to_attr(params["version"]))]
    elif getattr(graph, "tiga_distributed", False) is True:
        # (a rank's part of a DistributedGraph has no single CSR: its local relation over
        # owned + ghost source rows identifies it on this rank)
        row_ptr, col_idx = graph.full.resolve_csr()
        attrs.append(("rank_digest", array_digest(row_ptr) + array_digest(col_idx)))
    elif kind not in ("dense", "triangular"):
        row_ptr, col_idx = graph.resolve_csr()
        attrs.append(("digest", array_digest(row_ptr) + array_digest(col_idx)))
    return tuple(attrs)


def _lit(value, type_) -> Lit:
    if isinstance(type_, GraphType):  # relations are literals without an array value
        lit = object.__new__(Lit)
        lit.value, lit.type = value, type_
        return lit
    return Lit(value, type_)


def lower_block(program: GraphProgram, consts=(), arg_hints=(), out_hint=None) -> Region:
    block = _Block()
    binders = program.in_binders
    for var, value in zip(binders, consts):
        block.values[id(var)] = block.operand(_lit(value, var.type))
    hints = list(arg_hints) + [None] * len(binders)
    args = tuple(block.define(v, h) for v, h in zip(binders[len(consts):], hints))
    out_hints = {}
    if out_hint is not None:
        for a in program.outs:
            if isinstance(a, Var) and id(a) not in out_hints:
                out_hints[id(a)] = out_hint
    for eqn in program.eqns:
        _lower_eqn(block, eqn, out_hints)
    results = tuple(block.operand(a) for a in program.outs)
    return Region(args, tuple(block.ops), results)


def lower_closed(closed, arg_hints=(), out_hint=None) -> Region:
    if isinstance(closed, GraphProgram):
        return lower_block(closed, (), arg_hints, out_hint)
    return lower_block(closed.program, closed.consts, arg_hints, out_hint)


def _lower_eqn(block: _Block, eqn, out_hints: dict) -> None:
    inputs = tuple(block.operand(a) for a in eqn.inputs)
    if eqn.primitive is propagate_p:
        block.ops.append(ApplyOp(_computation(block, eqn, inputs)))
        return
    params = {k: lower_closed(v) if isinstance(v, (ClosedProgram, GraphProgram)) else
              tuple(lower_closed(b) for b in v) if _branches(v) else v
              for k, v in eqn.params.items()}
    try:
        attrs = tensor_params(params)
    except CompilationError as exc:
        raise CompilationError(f"gf_tensor.{eqn.primitive.name}: {exc}") from None
    results = tuple(block.define(v, out_hints.get(id(v))) for v in eqn.outputs)
    block.ops.append(TensorOp(eqn.primitive.name, inputs, results, attrs))


def _branches(v) -> bool:
    """A tuple of sub-programs (cond's branches): a tuple of regions in the IR."""
    return (isinstance(v, tuple) and v != ()
            and all(isinstance(b, (ClosedProgram, GraphProgram)) for b in v))


def _runnable(closed):
    """An edge or update function as its kernel runs it: custom_vjp / custom_jvp calls in it
    replaced by their primal function (their rules matter only to the transformations, which
    read them before a program is lowered; the call itself has no kernel rule)."""
    if closed is None or not has_custom_calls(closed.program):
        return closed
    return ClosedProgram(inline_custom_calls(closed.program), closed.consts)


def _computation(block: _Block, eqn, inputs: tuple) -> Computation:
    p = eqn.params
    roles, names = tuple(p["roles"]), tuple(p["names"])
    edge_hints = [n if r == "param" else f"{r}_{n}" for r, n in zip(roles, names)]
    edge = lower_closed(_runnable(p["edge_fn"]), edge_hints, "message")
    reducer = reducer_spec(p["reducer"], [v.type for v in edge.results])
    update = None
    if p["update"] is not None:
        n_out = len(edge.results) // reducer.arity
        hints = ([f"dst_{n}" for r, n in zip(roles, names) if r == "dst"]
                 + ["aggregated"] * n_out + [n for r, n in zip(roles, names) if r == "param"])
        update = lower_closed(_runnable(p["update"]), hints, "updated")
    results = tuple(block.define(v, "out") for v in eqn.outputs)
    return Computation(results, inputs[0], inputs[1:], roles, names, reducer,
                       p["reduce_by"], edge, update)


def reducer_spec(reducer: Reducer, msgs: list) -> ReducerSpec:
    k = reducer.arity
    groups = [msgs[i:i + k] for i in range(0, len(msgs), k)]
    if reducer.builtin:
        return ReducerSpec(reducer.name, True, to_attr(float(reducer.identity)),
                           tuple(builtin_state(reducer.name, g) for g in groups),
                           prune_threshold=reducer.prune_threshold,
                           stats=bool(getattr(reducer, "stats", False)),
                           empty=getattr(reducer, "empty", None),
                           of=getattr(reducer, "of", None))
    if reducer.regions is None:
        raise CompilationError(f"reducer {reducer.name!r} was never traced into regions")
    lift, combine, finalize = reducer.regions
    lift = None if lift is None else lower_closed(lift, ["message"], "lifted")
    combine = lower_closed(combine, ["acc", "message"], "combined")
    finalize = None if finalize is None else lower_closed(finalize, ["acc"], "result")
    state = tuple((combine.args[0].type,) for _ in groups)
    return ReducerSpec(reducer.name, False, to_attr(reducer.identity), state,
                       bool(reducer.commutative), bool(reducer.associative), None,
                       lift, combine, finalize)


def _binder_hints(program: GraphProgram) -> list:
    """`graph` for relations, the field/parameter name when a propagate reads the binder."""
    hints = {}
    for eqn in program.eqns:
        if eqn.primitive is propagate_p:
            for atom, name in zip(eqn.inputs[1:], eqn.params["names"]):
                hints.setdefault(id(atom), name)
    return [("graph" if isinstance(v.type, GraphType) else hints.get(id(v), f"arg{i}"))
            for i, v in enumerate(program.in_binders)]


def lower_program_to_domain(program, name: str = "main") -> DomainModule:
    """GraphProgram (or ClosedProgram) -> DomainModule named `name` (verified under
    TIGA_CHECK, as every lowering pass: tests run with it)."""
    closed = program if isinstance(program, ClosedProgram) else ClosedProgram(program)
    if not isinstance(closed.program, GraphProgram):
        raise CompilationError(f"lower-program-to-domain: expected a GraphProgram, found "
                               f"{type(program).__name__}")
    hints = _binder_hints(closed.program)[len(closed.consts):]
    module = DomainModule(name, lower_block(closed.program, closed.consts, hints))
    if config.check:     # (TIGA_CHECK, on in tests: a warm first call skips it)
        module.verify()
    return module
