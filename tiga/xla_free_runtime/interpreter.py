"""runtime: run a program by interpreting its Task IR.

`build_walk(program, module, pages, threads)` pairs each op of the program's Task module (one
page, one rank: lower/passes/plan_distributed_tasks) with what runs it. The module is the one the
executor lowered for the call's binding (this module never lowers), once per program and
binding (`cached_walk` / `remember_walk`):

    gf_storage.transfer  an argument made ready on the host tier: as numpy, or a disk-tier
                         tensor left lazy (a paged route reads it page by page)
    gf_task.launch       a LAUNCH step: its propagate, run by the launch handler the caller
                         hands run_walk (the executor's: the Kernel op the launch holds, on
                         the route its planner binds; a warm call's prepared launch first),
                         or by the reference rule when the propagate falls back
    gf_tensor.* ops      RUN steps: their equations, through core.eval.run_eqn with the
                         runtime's rules (loops run their bodies through this module again)
    gf_storage.release   the value (an argument or an intermediate) dropped from the
                         interpreter's environment after its last reader, so its memory
                         is reused by the next equation rather than held to the end
    gf_storage.join      every launch has finished (a launch runs to completion on the pool)

Constants and constant relations are the program's literals, read where an equation uses them,
so their ops need no step. A program the IR stages do not express (lowering raises a
TigaError) has no walk; the executor runs it through eval_program with the same overrides,
and explain() says why.
"""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..core.config import config
from ..core.errors import CompilationError
from ..core.eval import bind_dims, host_value, run_eqn
from ..core.graph import Graph
from ..core.prims.graph import propagate_p
from ..core.program import Eqn, GraphProgram, Lit, Var
from ..core.types import Dim, GraphType
from ..lower.ir.base import RelationOp, TensorOp
from ..lower.ir.kernel import LaunchOp
from ..lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TaskModule, TransferOp
from .caches.programs import memo
from .calls.threads import num_threads

TRANSFER, RUN, LAUNCH, RELEASE, JOIN = "transfer", "run", "launch", "release", "join"


@dataclass(frozen=True)
class TaskWalk:
    """A program's Task module and its steps: (TRANSFER, binder position), (RELEASE, the
    program's Var), (LAUNCH, the propagate a gf_task.launch runs), (RUN, another equation)
    or (JOIN, None), in the module's op order."""

    module: TaskModule
    steps: tuple
    sized: bool       # some equation's parameters hold symbolic sizes, bound per call
    launches: dict    # id(propagate equation) -> the gf_kernel.launch its gf_task.launch holds
    threads: int      # the pool size the launches were scheduled for
    generates: bool   # the program generates a radius/knn relation (planned before it runs)
    pages: dict = field(default_factory=dict)   # id(propagate equation) -> the one-page
    #                   Task module its paged run unrolls (the call's lowering bound it so)
    local_pages: dict = field(default_factory=dict)   # the same, for the page walks of a
    #                   rank's paged local relation under a halo plan


@dataclass(frozen=True)
class NoWalk:
    """Why a program runs under eval_program instead (explain() prints it)."""

    reason: str


def cached_walk(program: GraphProgram, binding: tuple = ()) -> TaskWalk | NoWalk | None:
    """The walk built for `program` under `binding` (binding.call_binding), or None: programs
    come from the call cache, so a warm call finds its walk here without lowering."""
    return memo(program).get("walks", {}).get(binding)


def remember_walk(program: GraphProgram, binding: tuple, walk):
    """Keep `walk` (a TaskWalk or NoWalk) for `program` under `binding`; returns it (derived
    from the program's structure and the call's binding, no value of any call)."""
    memo(program).setdefault("walks", {})[binding] = walk
    return walk


def module_name(program: GraphProgram) -> str:
    return "program_" + hashlib.sha256(str(program).encode()).hexdigest()[:16]


def build_walk(program: GraphProgram, module: TaskModule, pages: dict,
               threads: int, local_pages: dict | None = None) -> TaskWalk | NoWalk:
    """The walk of `program` over `module`, its bound Task module as the executor lowered it
    (with `pages`, {k: the one-page Task module of its k-th propagate, where the binding pages
    it}; `threads`: the pool size its schedules were made for). This module never lowers."""
    try:
        steps, launches = _pair(module, program)
    except CompilationError:
        if config.check:
            raise
        return NoWalk("its Task IR does not pair with its equations (a Tiga bug)")
    propagates = [e for e in program.eqns if e.primitive is propagate_p]
    return TaskWalk(module, steps,
                    any(_has_dim(p) for e in program.eqns for p in e.params.values()),
                    launches, threads, any(e.primitive.name in ("radius", "knn")
                                           for e in program.eqns),
                    {id(propagates[k]): page for k, page in pages.items()},
                    {id(propagates[k]): page for k, page in (local_pages or {}).items()})


# Array literals above this many elements enter the Task IR as arguments (transferred like
# any host value) rather than constant ops: spelling a captured weight matrix out as an IR
# attribute costs seconds, and a literal is read where it is used anyway.
LIFT_ELEMENTS = 64


def lifted(program: GraphProgram) -> GraphProgram:
    """`program` with its large array literals as extra trailing binders, equations in the
    same order (what the walk's Task IR is lowered from)."""
    lifted: dict = {}

    def lift(a):
        if (not isinstance(a, Lit) or isinstance(a.type, GraphType)
                or np.size(a.value) <= LIFT_ELEMENTS):
            return a
        if id(a) not in lifted:
            lifted[id(a)] = Var(a.type)
        return lifted[id(a)]

    eqns = [Eqn(e.primitive, tuple(lift(a) for a in e.inputs), e.params, e.outputs)
            for e in program.eqns]
    outs = [lift(a) for a in program.outs]
    if not lifted:
        return program
    return GraphProgram(list(program.in_binders) + list(lifted.values()), eqns, outs)


def _pair(module: TaskModule, program: GraphProgram) -> tuple:
    """Steps for the module's ops; each op that computes is checked against the equation it
    was lowered from (the stages keep the program's order, one op per equation)."""
    # (arguments past the program's binders are its lifted literals: read where used)
    position = {a.name: i for i, a in enumerate(module.body.args[:len(program.in_binders)])}
    var = {name: program.in_binders[i] for name, i in position.items()}
    eqns = iter(program.eqns)
    steps, launches = [], {}
    for op in module.body.ops:
        if isinstance(op, TransferOp):
            if op.value.name in position:     # (a constant relation is a literal)
                steps.append((TRANSFER, position[op.value.name]))
        elif isinstance(op, ReleaseOp):
            if op.value.name in var:          # (literals and constant relations stay)
                steps.append((RELEASE, var.pop(op.value.name)))
        elif isinstance(op, JoinOp):
            steps.append((JOIN, None))
        elif isinstance(op, RelationOp) or (isinstance(op, TensorOp) and
                                             op.prim == "constant"):
            continue
        else:
            eqn = next(eqns, None)
            want = (propagate_p.name if isinstance(op, TaskLaunchOp) else
                    getattr(op, "prim", propagate_p.name))
            values = op.results[:-1] if isinstance(op, TaskLaunchOp) else op.results
            if eqn is None or eqn.primitive.name != want or len(values) != len(eqn.outputs):
                raise CompilationError(f"task walk: op {want} does not match equation "
                                       f"{None if eqn is None else eqn.primitive.name}")
            var.update((v.name, o) for v, o in zip(values, eqn.outputs))
            steps.append((LAUNCH if isinstance(op, TaskLaunchOp) else RUN, eqn))
            held = held_kernel(op) if isinstance(op, TaskLaunchOp) else None
            if held is not None:
                launches[id(eqn)] = held
    if next(eqns, None) is not None:
        raise CompilationError("task walk: the Task IR has fewer ops than the program has "
                               "equations")
    return _relations_after_readers(steps), launches


def _relations_after_readers(steps: list) -> tuple:
    """`steps` with each relation's release after its last reader in the program: a bound
    module's propagates may read a relation through a binder of their bound type, so the
    module releases the relation itself after its other readers only."""
    last = {}
    for i, (code, x) in enumerate(steps):
        if code is RUN or code is LAUNCH:
            for a in x.inputs:
                if isinstance(a.type, GraphType):
                    last[id(a)] = i
    out = list(steps)
    for code, x in steps:
        if code is RELEASE and isinstance(x.type, GraphType):
            at = out.index((code, x))
            if last.get(id(x), -1) > at:
                del out[at]
                out.insert(out.index(steps[last[id(x)]]) + 1, (code, x))
    return tuple(out)


def held_kernel(op):
    """The gf_kernel.launch a gf_task.launch holds (its one kernel), or None."""
    held = [k for k in op.body.ops if isinstance(k, LaunchOp)]
    return held[0] if len(held) == 1 else None


def _has_dim(param) -> bool:
    if isinstance(param, Dim):
        return True
    return isinstance(param, tuple) and any(_has_dim(p) for p in param)


def interpret(steps, handlers: dict) -> None:
    """The one loop that runs Task IR. `steps`: (kind, what) pairs in the module's op order
    (a program's walk, or `op_steps` of a page or halo plan); `handlers`: kind -> the
    handler that runs it (TRANSFER, LAUNCH, RUN, RELEASE, JOIN). What a kind means on a run
    is its handler's: a program's transfer readies an argument on the host, a page plan's submits a
    page read to a loader and a halo plan's posts a peer's messages; a launch waits on its
    deps' events and runs its kernel. Asynchronous handlers record their events; the
    handlers of the ops that wait on them wait."""
    for kind, x in steps:
        handlers[kind](x)


def op_steps(module: TaskModule) -> tuple:
    """A Task module's ops as steps: (TRANSFER, TransferOp), (LAUNCH, TaskLaunchOp),
    (RELEASE, ReleaseOp), (JOIN, JoinOp); other ops (relations, constants) take no step."""
    kinds = {TransferOp: TRANSFER, TaskLaunchOp: LAUNCH, ReleaseOp: RELEASE, JoinOp: JOIN}
    return tuple((kinds[type(op)], op) for op in module.body.ops if type(op) in kinds)


def run_walk(walk, program: GraphProgram, args: list, overrides: dict,
             prepared: dict | None = None, launch=None) -> list:
    """Interpret the walk's steps on this call's arguments (`walk`: a TaskWalk or a
    PreparedWalk). A launch runs its prepared launch (`prepared`: id(propagate equation) ->
    `fn(values) -> outputs`, or None for operands it does not take: a warm call's list),
    else `launch(eqn, values)` (the runtime's launch handler: outputs, or None where the
    reference rule runs it); other equations run through `overrides` (core.eval rules)."""
    binders = program.in_binders
    env: dict = {}
    dims = bind_dims(binders, args, resolve=False) if walk.sized else {}

    def read(a):
        return a.value if isinstance(a, Lit) else env[id(a)]

    def run(eqn):
        # (read() inlined, and loops rather than comprehensions, which cost a frame each on
        # CPython 3.11: a warm call's host time is counted in microseconds)
        vals = []
        for a in eqn.inputs:
            vals.append(a.value if isinstance(a, Lit) else env[id(a)])
        outs = run_eqn(eqn, vals, overrides, dims)
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = o

    def launched(eqn):
        vals = []
        for a in eqn.inputs:
            vals.append(a.value if isinstance(a, Lit) else env[id(a)])
        fn = prepared.get(id(eqn)) if prepared else None
        outs = fn(vals) if fn is not None else None
        if outs is None and launch is not None:
            outs = launch(eqn, vals)
        if outs is None:    # (the reference rule; without a handler, the overrides' own)
            outs = run_eqn(eqn, vals, overrides if launch is None else {}, dims)
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = o

    def transfer(i):
        # (a tuple: a prepared walk's consecutive transfers as one step; a host array or a
        # relation is bound as it is, host_value's first cases)
        for j in (i if type(i) is tuple else (i,)):
            x = args[j]
            env[id(binders[j])] = (x if type(x) is np.ndarray or type(x) is Graph else
                                   host_value(binders[j], x, True))

    # (a launch runs to completion on the pool, so a join has nothing left to wait on)
    interpret(walk.steps, {RUN: run, LAUNCH: launched, TRANSFER: transfer,
                           RELEASE: lambda v: env.pop(id(v), None), JOIN: _nothing})
    outs = []
    for a in program.outs:
        outs.append(read(a))
    return outs


def _nothing(_) -> None:
    return None


@dataclass(frozen=True)
class PreparedWalk:
    """A walk bound to the relations of one call: its steps, with each propagate's prepared
    launch (`run_walk(prep, ..., prep.prepared)`). Valid while the call's relations are these
    objects, its other operands numpy arrays and the pool the same size (`matches`)."""

    steps: tuple      # the TaskWalk's steps, as `warm_steps` shortens them
    prepared: dict    # id(propagate equation) -> its prepared launch
    graphs: tuple     # (binder position, weak relation) of every relation argument
    threads: int
    sized: bool
    backend: str      # the backend selected when it was prepared
    handler: object   # the launch handler of the walk it was prepared from: what runs a
    #                   launch whose prepared form declines this call's operands

    def matches(self, args: list, backend: str) -> bool:
        if self.threads != num_threads() or self.backend != backend:
            return False
        for i, ref in self.graphs:
            if args[i] is not ref():
                return False
        return True

    def relations(self) -> tuple | None:
        """The relations it was prepared for, or None once one of them is gone."""
        out = tuple(ref() for _, ref in self.graphs)
        return None if any(g is None for g in out) else out


def prepare_walk(walk: TaskWalk, program: GraphProgram, args: list, launcher, backend: str,
                 handler):
    """The prepared form of `walk` for these arguments, or None when some propagate has no
    prepared launch (`launcher(eqn, relation)` returns None) or an operand is not a plain
    host array (those calls keep taking the interpreter's per-step rules). `handler`: the
    walk's launch handler, kept for a launch whose prepared form declines its operands."""
    binders = program.in_binders
    position = {id(v): i for i, v in enumerate(binders)}
    graphs, prepared = [], {}
    for i, (v, a) in enumerate(zip(binders, args)):
        if isinstance(v.type, GraphType):
            graphs.append((i, weakref.ref(a)))
        elif type(a) is not np.ndarray:
            return None
    for code, x in walk.steps:
        if code is LAUNCH:
            rel = x.inputs[0]
            fn = launcher(x, rel.value if isinstance(rel, Lit) else args[position[id(rel)]])
            if fn is None:
                return None
            prepared[id(x)] = fn
    return PreparedWalk(warm_steps(walk.steps), prepared, tuple(graphs), walk.threads,
                        walk.sized, backend, handler)


# Prepared launch lists kept per program, one per set of relations (the latest first): a
# layer called on a few relations in turn (the batches of an epoch, a train and a test
# graph) finds each one's list warm instead of preparing it again every call. 32: the
# bucketed batches of a graph-classification epoch share a program among up to 13 relations
# (8 re-prepared the larger groups on every call); a miss scans them at ~0.3 us each.
PREPARED_PER_PROGRAM = 32


def prepared_walk(program: GraphProgram, args: list, backend: str, host_args: bool = False):
    """The PreparedWalk kept for `program` (remember_prepared) that `args` can take on
    `backend` (PreparedWalk.matches: the same relation objects and pool), else None.
    `host_args`: the caller checked that `args` are the program's arguments, each a numpy
    array or a tg.Graph."""
    preps = memo(program).get("prepared")
    if not preps:
        return None
    if not host_args:
        if len(args) != len(program.in_binders):
            return None
        for a in args:
            if type(a) is not np.ndarray and not isinstance(a, Graph):
                return None
    for prep in preps:
        if prep.matches(args, backend):
            return prep
    return None


def remember_prepared(program: GraphProgram, args: list, make) -> None:
    """Keep `make()` (a PreparedWalk, or None: not preparable) for `program`, beside the
    lists kept for other relations (at most PREPARED_PER_PROGRAM, those of relations still
    alive); not asked again for relations None was decided for."""
    entry = memo(program)
    relations = tuple(id(a) for v, a in zip(program.in_binders, args)
                      if isinstance(v.type, GraphType))
    refused = entry.setdefault("unprepared", set())   # relations' ids None was decided for
    if relations in refused:
        return
    prep = make()
    if prep is None:
        if len(refused) > 64:       # (ids of relations long gone: asked again, once)
            refused.clear()
        refused.add(relations)
        return
    kept = [p for p in entry.get("prepared", ()) if _other(p, prep)]
    entry["prepared"] = [prep] + kept[:PREPARED_PER_PROGRAM - 1]


def _other(kept: PreparedWalk, new: PreparedWalk) -> bool:
    """Whether `kept` stays beside `new`: its relations are alive and are not `new`'s (by
    identity)."""
    rel = kept.relations()
    return rel is not None and [id(g) for g in rel] != [id(g) for g in new.relations()]


def warm_steps(steps: tuple) -> tuple:
    """A walk's steps for a prepared call, whose operands are host arrays and relations
    (bound as they are): consecutive transfers as one step (TRANSFER, positions), and no
    step after the last launch or equation (its releases and the join: the call's values
    are dropped when it returns, and a launch has run to completion). Same order, same
    work; a warm call's host time is counted in microseconds."""
    last = max((k for k, (code, _) in enumerate(steps) if code is RUN or code is LAUNCH),
               default=-1)
    out: list = []
    for code, x in steps[:last + 1]:
        if code is TRANSFER and out and out[-1][0] is TRANSFER:
            out[-1] = (TRANSFER, out[-1][1] + (x,))
        else:
            out.append((code, (x,) if code is TRANSFER else x))
    return tuple(out)


def describe_walk(walk: TaskWalk | NoWalk) -> str:
    """explain()'s line on how the runtime runs the program, counted off its Task IR."""
    if isinstance(walk, NoWalk):
        return f"eval_program with the runtime's rules: {walk.reason}"
    ops = walk.module.body.ops
    launches = [op for op in ops if isinstance(op, TaskLaunchOp)]
    count = {c: sum(1 for code, _ in walk.steps if code is c) for c in (TRANSFER, RELEASE)}
    others = sorted({x.primitive.name for code, x in walk.steps
                     if code is RUN and x.primitive is not propagate_p})
    kinds = sorted({f"{op.task_kind}, page {op.page} of {op.num_pages}, rank {op.rank} of "
                    f"{op.num_ranks}" for op in launches})
    text = (f"the runtime walks the Task IR of @{walk.module.name}: {count[TRANSFER]} "
            f"transfer(s) host -> host, {len(launches)} gf_task.launch ({'; '.join(kinds)})")
    if others:
        text += f", {', '.join(others)} through the eval rules"
    return text + f", {count[RELEASE]} release(s), then a join"


__all__ = ["TRANSFER", "RUN", "LAUNCH", "RELEASE", "JOIN", "lifted", "held_kernel", "interpret",
           "op_steps", "cached_walk", "remember_walk", "build_walk", "run_walk", "describe_walk",
           "TaskWalk", "NoWalk", "PreparedWalk", "prepare_walk", "prepared_walk",
           "remember_prepared", "warm_steps"]
