"""runtime: run a call: lower its signature once, walk its Task IR, explain the route.

The executor is the runtime's one caller of lower/pipeline. A call signature (the program and
its binding for the selected backend's target: binding.call_binding) is lowered once by
`pipeline.lower_call`, giving the bound Task module, whose launches hold the Kernel ops that
run, and the one-page modules of the propagates it runs by pages or halo plans, handed down as
data (TaskWalk.pages, PagedPlan.bound, run_distributed's pages). Where the bound module holds
no launch that fits (a program its stages do not walk, a relation known only as a loop body
runs, a degree count over a radius relation) a planner answers an Unbound naming the launch,
which the executor lowers (kernel_op, once per equation) and plans again with (planned).
Equations that are not kernels run through the eval rules (OVERRIDES); loops and conds run
their bodies through this executor. Strict mode refuses a propagate that would fall back to
the reference interpreter before anything runs.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import partial

from ..core.check import check_program
from ..core.config import ConfigError, config
from ..core.errors import ProgramError, TigaError, UnsupportedError
from ..core.eval import eval_program, host_array, on_device
from ..core.graph import Graph
from ..core.prims.control import cond_p, repeat_p, run_cond, run_repeat, run_while, while_loop_p
from ..core.prims.graph import degrees_p, propagate_p
from ..core.prims.linalg import dot_general_p
from ..core.program import GraphProgram, Lit
from ..core.types import GraphType
from ..lower import pipeline
from ..lower.backends import selected_backend
from ..lower.binding import page_program
from ..lower.ir.task import TaskLaunchOp
from ..lower.passes.plan_halo_tasks import NAME as HALO_MODULE
from .backends.cpu.generated import count_eqn, fused_degrees, generated_relations
from .backends.cpu.native.heap import pin_once
from .backends.cpu.prepared import prepare
from .backends.cpu.propagate import (
    NOT_LOWERED,
    Fallback,
    Unbound,
    equation_text,
    run_propagate,
)
from .backends.triton.compile import HOOKS as TRITON_HOOKS
from .backends.triton.launch import call_backend as triton_call_backend
from .backends.triton.linear import dot_rule
from .backends.triton.prepared import prepare as prepare_triton
from .binding import call_binding, call_target, distributed_binding
from .cache import CACHE, Executable
from .distributed.run import distributed_call, run_distributed
from .equation_cache import kept, memo
from .explain import Explanation
from .interpreter import (
    NoWalk,
    TaskWalk,
    build_walk,
    cached_walk,
    held_kernel,
    lifted,
    module_name,
    prepare_walk,
    prepared_walk,
    remember_prepared,
    remember_walk,
    run_walk,
)
from .paging.degrees import paged_degrees
from .paging.pages import pageable, walked_eqn
from .paging.resident import plan_resident
from .paging.run import PagedPlan, plan_paged, task_ir
from .program_cache import memo as memo_of
from .routes import bodies_of, describe_program, paged_propagates, plan, propagates_of
from .run_report import profiled, reporting
from .threads import num_threads, pin_threads, unpin_threads

# what the runtime asks of lower/pipeline, from here only (api.py prints IR through ir_text
# and ir_module_name); lowering itself is asked as `pipeline.<function>` at the call, so a
# test counting the calls into the pipeline sees every one
ir_text, ir_module_name, quiet_dumps = pipeline.ir_text, pipeline.module_name, pipeline.quiet_dumps

GENERATED = ("radius", "knn")
NUMPY_NOTE = "numpy impl rules (tensor code outside propagate is not compiled yet)"


# ---- lowering: the runtime asks lower/pipeline here only -----------------------------------

def task_module(program: GraphProgram, name: str, binding: tuple = (),
                page_name: str = "paged") -> tuple:
    """(the Task module of `program` through every stage, bound by the call's `binding`
    (binding.call_binding, or distributed_binding: a rank's halo plans): its launches hold
    the Kernel ops that run, so every stage is dumped from here; {k: the one-page Task
    module, named `page_name`, of the k-th propagate} for those it runs by pages or halo
    plans), from one lowering. Raises what the pipeline raises (the interpreter records it
    as a NoWalk)."""
    return pipeline.lower_call(program, name=name, binding=binding, page_name=page_name,
                               target=call_target())


def kernel_op(eqn, relation_type=None, *, target: str = "cpu-llvm", name: str | None = None):
    """The scheduled `gf_kernel.launch` of one propagate over a relation of type
    `relation_type` (None: the equation's) for `target`, through the pipeline's Kernel stage
    (TIGA_DUMP writes that IR here, once per kernel and pool size: a schedule may depend on
    static sizes). Memoised per (equation, relation type, target, pool size); an equation the
    IR stages do not express raises the pipeline's TigaError (memoised too)."""
    gtype = eqn.inputs[0].type if relation_type is None else relation_type
    at = (num_threads(), gtype, target)
    per_eqn = kept(eqn, "kernel_ops")   # {(pool, relation type, target): op or its error}
    found = per_eqn.get(at)
    if found is None:
        if name is None:
            digest = hashlib.sha256((equation_text(eqn) + str(gtype)).encode()).hexdigest()
            name = f"propagate_{digest[:16]}"
        try:
            found = pipeline.lower_launch(eqn, gtype, name=name, target=target)
        except TigaError as exc:
            found = exc
        per_eqn[at] = found
    if isinstance(found, TigaError):
        raise found.with_traceback(None)
    return found


def page_module(eqn, name: str = "paged"):
    """The Task IR of `eqn` over a CSR relation: what one page of a paged run and one rank's
    launches of a distributed run execute (their plans unroll it), memoised per equation;
    for the propagates no call lowering bound by pages (a loop body's, one over a relation
    held in memory whose fields page, one under a Triton backend)."""
    entry = memo(eqn)
    found = entry.get("page_module")
    if found is None:
        found = entry["page_module"] = pipeline.lower(page_program(eqn), until="task",
                                                      name=name)
    return found


def task_walk(program: GraphProgram, binding: tuple = (), page_name: str = "paged"):
    """The interpreter's walk of `program` under the call's `binding`: built once per program
    and binding from the one lowering of the call (task_module); a NoWalk naming why when
    the IR stages do not express the program (eval_program then runs the same rules)."""
    key = (call_target(), page_name) + binding
    found = cached_walk(program, key)
    if found is not None:
        return found
    threads = num_threads()      # (what the schedule pass reads: read before it runs)
    try:
        module, pages = task_module(lifted(program), module_name(program), binding, page_name)
    except ConfigError:
        raise       # (a setting the user got wrong, TIGA_DUMP say: never a silent fallback)
    except TigaError as exc:
        return remember_walk(program, key, NoWalk(
            f"the IR stages do not express this program ({exc})"))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        if config.check:
            raise
        # a lowering defect must not take the call down: eval_program runs the same rules
        return remember_walk(program, key, NoWalk(
            f"lowering failed ({type(exc).__name__}: {exc}); this is a Tiga bug, please report"))
    return remember_walk(program, key, build_walk(program, module, pages, threads))


def _page(walk, eqn):
    """The one-page Task module a paged run of `eqn` unrolls: the one the call's lowering
    bound (`walk`: its TaskWalk, or None), else lowered here."""
    found = walk.pages.get(id(eqn)) if isinstance(walk, TaskWalk) else None
    return found if found is not None else page_module(walked_eqn(eqn))


def _pages(program: GraphProgram, args: list, walk=None) -> dict:
    """{id(propagate): its PagedPlan, bound (_bound)} for every propagate a call runs by
    pages of a stored relation (loop bodies too): what explain() and ir("task") print."""
    return {id(e): _bound(plan_paged(e, g), walk, e, g) for e, g in paged_propagates(program, args)}


def planned(eqn, graph, *, held=None, compile: bool = True):
    """The route of one propagate (routes.plan) over `graph` with the Kernel op it
    binds: `held` (the call's Task module's), else, when the planner answers Unbound (the
    call's module holds no op for the walk it binds: a program the Task stages do not walk,
    a relation computed in the program), the launch it names, lowered here, once per
    equation and relation type (kernel_op)."""
    route = plan(eqn, graph, held=held, compile=compile)
    if not isinstance(route, Unbound):
        return route
    try:
        op = kernel_op(route.eqn, route.relation, target=route.target)
    except TigaError as exc:
        return Fallback(f"{NOT_LOWERED} ({exc})")
    route = plan(eqn, graph, held=op, compile=compile)
    # (a planner that names a launch accepts it: one that did not would be a Tiga bug)
    return Fallback(NOT_LOWERED) if isinstance(route, Unbound) else route


def _graph_of(eqn, env_or_args):
    src = eqn.inputs[0]
    if isinstance(src, Lit):
        return src.value
    return env_or_args.get(id(src))


def plan_routes(program: GraphProgram, args: list, launches: dict | None = None) -> dict:
    """{id(eqn): Executable | Fallback} for every top-level propagate (`launches`: the Kernel
    op the call's bound Task module holds per equation)."""
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    # radius/knn generated inside the program: planned from their static parameters (the
    # fused kernel depends on them only), so strict mode sees the route that will run
    known.update(generated_relations(program))
    routes = {}
    for eqn in program.eqns:
        if eqn.primitive is propagate_p:
            routes[id(eqn)] = planned(eqn, _graph_of(eqn, known),
                                      held=(launches or {}).get(id(eqn)))
    return routes


def _strict_check(routes: dict) -> None:
    falls = [r.reason for r in routes.values() if isinstance(r, Fallback)]
    if config.strict and falls:
        raise UnsupportedError(f"strict mode: {len(falls)} propagate(s) would fall back to the "
                               f"reference interpreter: {falls[0]}",
                               hint="unset TIGA_STRICT / tg.config.strict, or change the "
                                    "program so every propagate compiles")


def execute(program: GraphProgram, args: list, *, keep_device: bool = False) -> list:
    """Run `program` on `args`. Outputs the triton route left on a GPU are copied to the
    host, unless `keep_device` (the torch bridge hands them to torch where they are)."""
    outs = run_prepared(program, args)
    if outs is not None:      # a warm call: its prepared launch list, no planning
        return outs
    if config.check:
        check_program(program)
    pin_once()     # per-call arrays reuse the heap whatever the process freed before
    if len(args) != len(program.in_binders):
        raise ProgramError(f"execute: program takes {len(program.in_binders)} inputs, "
                           f"got {len(args)}")
    if profiled():    # a report only inside tg.profile() (a warm call skips the with)
        with reporting(lambda: module_name(program)):
            outs = _routed(program, args)
    else:
        outs = _routed(program, args)
    return outs if keep_device else [host_array(o) if on_device(o) else o for o in outs]


def _routed(program: GraphProgram, args: list) -> list:
    if distributed_call(program, args):   # a DistributedGraph: the MPI halo route
        walks = _distributed_walks(program, args)
        return run_distributed(program, list(args), walks, _halo_pages(program, args, walks),
                               _local_pages(program, args), _local_launches(program, args))
    pinned = pin_threads()    # TIGA_NUM_THREADS read once for the whole call
    try:
        return _run(program, list(args))
    finally:
        unpin_threads(pinned)


def _distributed_walks(program: GraphProgram, args: list) -> dict:
    """{id(program): its TaskWalk (or NoWalk)} for a distributed call's program and the
    bodies and branches of its loops and conds: each lowered once per binding, bound by
    distributed_binding (a DistributedGraph captured by a body is one of its constants), so
    the rank runs every program as a Task walk like any other, and the walks hold the halo
    plans' one-page modules."""
    walks = {id(program): task_walk(program, distributed_binding(program, args), HALO_MODULE)}
    for closed in bodies_of(program):
        body = closed.program
        if id(body) not in walks:
            vals = list(closed.consts) + [None] * (len(body.in_binders) - len(closed.consts))
            walks[id(body)] = task_walk(body, distributed_binding(body, vals), HALO_MODULE)
    return walks


def _halo_pages(program: GraphProgram, args: list, walks: dict) -> dict:
    """{id(propagate): the one-page Task module its halo plan unrolls} for a distributed
    call: what the walks' lowering bound, else (a body's propagate over a relation it is
    handed, known only as the body runs; a program its stages do not walk) the equation's
    own, kept per equation (page_module). A top-level propagate over a relation that is not
    distributed runs no halo plan."""
    pages: dict = {}
    for walk in walks.values():
        if isinstance(walk, TaskWalk):
            pages.update(walk.pages)
    local = {id(v) for v, a in zip(program.in_binders, args)
             if isinstance(v.type, GraphType) and getattr(a, "tiga_distributed", False)
             is not True}
    for e, _, _ in propagates_of(program, args):
        if id(e) not in pages and id(e.inputs[0]) not in local:
            pages[id(e)] = page_module(e, HALO_MODULE)
    return pages


def _local_launches(program: GraphProgram, args: list) -> dict:
    """{id(propagate): the Kernel op it binds} for the propagates of a distributed call over
    a relation that is not distributed (a rank's own graph beside the DistributedGraph)."""
    if not any(isinstance(a, Graph) for a in args):
        return {}
    return _bound_launches(program, args, None, lambda g: isinstance(g, Graph))


def _local_pages(program: GraphProgram, args: list) -> dict:
    """{id(propagate): the one-page Task module of its page walk} for a distributed call
    whose ranks hold their local relation paged (tg.distributed's local stores), else {}."""
    if not any(getattr(a, "local_store", None) is not None for a in args):
        return {}
    return {id(e): page_module(walked_eqn(e))
            for e, _, _ in propagates_of(program, args)}


def _run(program: GraphProgram, args: list) -> list:
    """The program's Task IR interpreted: its launches by the launch handler (_propagate),
    from the Kernel ops the module holds, other equations and loops by the runtime's eval
    rules (eval_program with the same rules when the IR does not express the program)."""
    walk = task_walk(program, call_binding(program, args))
    generates = (walk.generates if isinstance(walk, TaskWalk) else
                 bool(generated_relations(program)))
    routes = None
    if config.strict or generates:
        # planned before anything runs: strict mode refuses a fallback up front, and a
        # relation generated in the program takes the route planned from its parameters
        # (its fused walk), not one chosen after a propagate materialised its CSR
        routes = plan_routes(program, args,
                             walk.launches if isinstance(walk, TaskWalk) else None)
        _strict_check(routes)
    if isinstance(walk, NoWalk):
        return eval_program(program, *args, overrides={
            **OVERRIDES, propagate_p: partial(_propagate, routes, None)})
    # (its launches hold Kernel ops scheduled for this pool size, or are planned afresh)
    held = walk if walk.launches and walk.threads == num_threads() else None
    if held is None or routes is not None:
        return run_walk(walk, program, args, OVERRIDES, launch=partial(_propagate, routes, held))
    outs = run_walk(walk, program, args, OVERRIDES, launch=_launcher(program, walk))
    _prepare(program, walk, args)      # (the same handler every call: a warm launch list)
    return outs


def run_prepared(program: GraphProgram, args: list, *, host_args: bool = False) -> list | None:
    """The outputs of a warm call of `program` on `args` by its prepared launch list (what
    `execute` runs then), or None when it has none for them (the caller runs `execute`).
    `host_args`: the caller checked that `args` are the program's arguments, each a numpy
    array or a tg.Graph (a layer's warm call: trace/warm_calls.py)."""
    prep = _prepared(program, args, host_args)
    if prep is None:
        return None
    if config.check:     # (TIGA_CHECK: every executed program is checked first)
        check_program(program)
    return run_walk(prep, program, args, OVERRIDES, prep.prepared, _LAUNCH)


def prepared_for(program: GraphProgram, args: list) -> bool:
    """Whether a call of `program` on `args` now runs its prepared launch list."""
    return _prepared(program, args) is not None


def _prepared(program: GraphProgram, args: list, host_args: bool = False):
    """The prepared launch list of a warm call of `program` on relations it was prepared
    for, or None (first call, other relations, strict mode or a profile: the full path)."""
    prep = prepared_walk(program, args, selected_backend(), host_args)
    if prep is None or config.strict or profiled():
        return None
    return prep


def _prepare(program: GraphProgram, walk: TaskWalk, args: list) -> None:
    """After a call that ran every propagate on the interpreter's held rules: its launch
    list for the next call on the same relations (None remembered: not preparable)."""
    remember_prepared(program, args, lambda: prepare_walk(
        walk, program, args, partial(_prepared_launch, walk), selected_backend()))


def _prepared_launch(walk: TaskWalk, eqn, graph):
    """A propagate's prepared launch over a stored or implicit relation held in memory
    (generated and paged relations plan per call): the generic cpu-llvm kernel or a Triton
    interpreter kernel bound to the relation (backends/*/prepared.py), else the plan itself
    (a Triton GPU kernel, a specialised walk), run as planned."""
    kind = getattr(graph, "kind", None)
    if kind in GENERATED or kind == "paged" or kind is None:
        return None
    route = planned(eqn, graph, held=walk.launches.get(id(eqn)))
    if isinstance(route, Fallback):
        return None
    launch = prepare(route, eqn, graph)
    if launch is None:
        launch = prepare_triton(route, eqn, graph)
    if launch is not None:
        return launch.run
    return None if isinstance(route, Executable) else partial(_run_plan, route, eqn)


def _run_plan(route, eqn, values: list) -> list:
    return route.run(eqn, values[0], values[1:])


def _launcher(program: GraphProgram, walk: TaskWalk):
    """The launch handler running the Kernel ops `walk` (one of `program`'s) holds: made
    once per walk (a warm call reuses it)."""
    per_walk = memo_of(program).setdefault("launchers", {})   # id(walk) -> (walk, handler)
    found = per_walk.get(id(walk))
    if found is not None and found[0] is walk:
        return found[1]
    handler = partial(_propagate, None, walk)
    per_walk[id(walk)] = (walk, handler)
    return handler


def _propagate(routes, walk, eqn, vals):
    """A propagate on its planned route (`routes`: planned up front, else now, for its
    relation value, from the Kernel op the call's TaskWalk `walk` holds for it), or by pages
    when its disk-tier fields and result would not fit the host budget; None: the reference
    impl rule runs it. A paged plan runs the one-page Task module `walk` holds."""
    # fields over the host budget: by pages
    paged = plan_resident(eqn, vals[0], vals[1:])
    if paged is not None:
        return _bound(paged, walk, eqn, vals[0]).run(eqn, vals[0], vals[1:])
    route = routes.get(id(eqn)) if routes is not None else None
    if route is None or (isinstance(route, Fallback) and
                         getattr(vals[0], "kind", None) in GENERATED):
        # (a relation generated inside the program is concrete only now)
        held = walk.launches.get(id(eqn)) if walk is not None else None
        route = planned(eqn, vals[0], held=held)
    if isinstance(route, Fallback):
        return None
    if isinstance(route, PagedPlan):
        route = _bound(route, walk, eqn, vals[0])
    return run_propagate(route, eqn, vals[0], vals[1:])


def _bound(route: PagedPlan, walk, eqn, graph) -> PagedPlan:
    """A paged plan with what the call's lowering gives it: the one-page Task module its
    pages unroll and, on a Triton backend, the page kernel's Kernel op (the one that module
    holds); for a grouping pages cannot complete, the Kernel op of the CSR it reads whole
    (the call's module holds it: the binding reads it as a CSR)."""
    target = "triton" if route.backend is not None else "cpu-llvm"
    if pageable(eqn.params):
        page = _page(walk, eqn)
        if target == "cpu-llvm":
            return route.bound(page, None)
        held = next((held_kernel(op) for op in page.body.ops
                     if isinstance(op, TaskLaunchOp)), None)
        if held is None or held.schedule.target != target:     # (a page lowered here)
            walked = walked_eqn(eqn)
            held = _lowered_or_none(walked, _csr(walked, graph, target), target)
        return route.bound(page, held)
    held = walk.launches.get(id(eqn)) if isinstance(walk, TaskWalk) else None
    if (held is None or held.comp.relation.type.kind != "csr"
            or held.schedule.target != target):
        held = _lowered_or_none(eqn, _csr(eqn, graph, target), target)
    return route.bound(None, held)


def _csr(eqn, graph, target: str):
    """The relation type a kernel over `graph`'s CSR walks (a Triton kernel's carries the
    relation's index dtype: it renders per index width)."""
    gtype = replace(eqn.inputs[0].type, kind="csr", coord_dims=None)
    return gtype if target == "cpu-llvm" else replace(gtype, index_dtype=graph.index_dtype)


def _lowered_or_none(eqn, relation, target: str):
    try:
        return kernel_op(eqn, relation, target=target)
    except TigaError:
        return None


def _call(closed, args: list) -> list:
    args = list(closed.consts) + list(args)
    prep = _prepared(closed.program, args)    # (a loop body's warm iterations)
    return (run_walk(prep, closed.program, args, OVERRIDES, prep.prepared, _LAUNCH)
            if prep is not None else _run(closed.program, args))


def _regions(run):
    """The rule of a control-flow primitive (run_repeat, run_while, run_cond) whose bodies or
    branches run through this executor, so their propagates compile."""
    return lambda eqn, vals: run(_call, vals, **eqn.params)


def _degrees(eqn, vals):
    """Degrees of a generated relation counted by its fused walk (the relation stays
    unmaterialised), of a paged one by row ranges of its store (never the CSR whole);
    None: the impl rule counts them."""
    kind = getattr(vals[0], "kind", None)
    if kind not in GENERATED and kind != "paged":
        return None
    deg = (paged_degrees(vals[0], eqn.params["by"]) if kind == "paged" else
           fused_degrees(vals[0], eqn.params["by"], count_launch(vals[0])))
    return None if deg is None else [deg]


def count_launch(graph):
    """The Kernel op of the degree count over a radius relation (count_eqn: one equation per
    coordinate dims and dtype, so kernel_op lowers it once), or None (a kNN relation's degrees
    are k; an equation the stages do not express)."""
    if graph.kind != "radius":
        return None
    try:
        return kernel_op(count_eqn(graph))
    except TigaError:
        return None


# (dot_rule: an entity-level matmul as tile_matmul on a Triton backend; it declines in
# under a microsecond elsewhere, so the numpy impl rule runs it as before)
# the eval rules of the equations that are not launches (a propagate is a launch: _LAUNCH,
# the handler of a call whose module holds no Kernel op for it, plans it from its relation)
OVERRIDES = {repeat_p: _regions(run_repeat), while_loop_p: _regions(run_while),
             cond_p: _regions(run_cond), degrees_p: _degrees, dot_general_p: dot_rule}
_LAUNCH = partial(_propagate, None, None)


def call_backend(call) -> str | None:
    """The backend a call's inputs put it on (None: host inputs; "triton" for CUDA inputs),
    or the UnsupportedError naming the field that cannot run there (api.py asks here: the
    facade imports no backend)."""
    return triton_call_backend(call)


def set_tensor_hook(fn) -> None:
    """How a Triton launch gets the torch bridge's tensor helpers (`fn()`: the module), set
    by the facade so the runtime never imports torch."""
    TRITON_HOOKS["tensors"] = fn


def explain_program(program: GraphProgram, args: list) -> Explanation:
    """What a call of `program` on `args` runs, without running it (TIGA_DUMP stays quiet:
    it writes the IR of calls that run)."""
    with quiet_dumps():
        if distributed_call(program, args):
            from .distributed.report import explain_distributed
            local = [getattr(a, "full", a) if getattr(a, "tiga_distributed", False) is True
                     else a for a in args]
            walk = _distributed_walks(program, args)[id(program)]
            return explain_distributed(program, args, CACHE, walk, _pages(program, local),
                                       _bound_launches(program, local, None))
        walk = task_walk(program, call_binding(program, args))
        return describe_program(program, args, CACHE, walk, _pages(program, args, walk),
                                _bound_launches(program, args, walk))


def _bound_launches(program: GraphProgram, args: list, walk, wanted=None) -> dict:
    """{id(propagate): the Kernel op it binds} for every propagate of a call (loop bodies
    too; `wanted(relation)`: only those over such relations): the call's Task module's, else
    the one its planner names (an Unbound), lowered here."""
    held = walk.launches if isinstance(walk, TaskWalk) else {}
    out = {}
    for eqn, graph, _ in propagates_of(program, args):
        if wanted is not None and not wanted(graph):
            continue
        op = held.get(id(eqn))
        route = plan(eqn, graph, compile=False, held=op)
        if isinstance(route, Unbound):
            try:
                op = kernel_op(route.eqn, route.relation, target=route.target)
            except TigaError:
                op = None
        out[id(eqn)] = op
    return out


def paged_task_ir(program: GraphProgram, args: list) -> str | None:
    """The page plan a call of `program` runs when it is one propagate over a paged relation
    (what ir("task") prints for it), else None."""
    return task_ir(program, args, _call_pages(program, args))


def _call_pages(program: GraphProgram, args: list) -> dict:
    """_pages of a call, with the walk its lowering binds (task_walk: built once)."""
    if not paged_propagates(program, args):
        return {}
    return _pages(program, args, task_walk(program, call_binding(program, args)))


def call_task_ir(program: GraphProgram, args: list, name: str = "main") -> str:
    """What `ir("task")` prints for a call of `program` on `args`: the page plan of one paged
    propagate, else the program's Task module bound to the call's relations (the module the
    interpreter walks: launches hold the Kernel ops that run, tasks name the fixed kernels
    beside them). Nothing runs."""
    if distributed_call(program, args):
        from .distributed.report import distributed_task_ir
        return distributed_task_ir(program, args, _halo_pages(
            program, args, _distributed_walks(program, args)))
    text = task_ir(program, args, _call_pages(program, args))
    if text is not None:
        return text
    # (TIGA_DUMP writes the stages of what is printed, as for any ir() of a program)
    return str(pipeline.lower(lifted(program), until="task", name=name,
                              binding=call_binding(program, args), target=call_target()))


__all__ = ["execute", "run_prepared", "prepared_for", "explain_program",
           "plan_routes", "NUMPY_NOTE",
           "task_walk", "kernel_op", "task_module", "page_module", "paged_task_ir",
           "call_task_ir", "call_backend", "set_tensor_hook",
           "ir_text", "ir_module_name"]

