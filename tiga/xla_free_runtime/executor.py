"""runtime: run a call: lower its signature once, walk its Task IR, explain the route.

The executor is the runtime's one caller of lower/pipeline. A call signature (the program and
its binding for the selected backend's target: binding.call_binding) is lowered once by
`pipeline.lower_call`, giving the bound Task module, whose launches hold the Kernel ops that
run, the one-page modules of the propagates it runs by pages or halo plans, and the launches
of the degree counts over radius relations, handed down as data (TaskWalk.pages,
PagedPlan.bound, run_distributed's pages, the count equation's memo). Loop bodies and cond
branches are lowered the same way, once per binding, when they run. Nothing else lowers:
where the bound module holds no launch that fits (a program its stages do not walk), the
planner answers an Unbound, a Fallback that strict mode refuses and explain() names.
Equations that are not kernels run through the eval rules (OVERRIDES); loops and conds run
their bodies through this executor. Strict mode refuses a propagate that would fall back to
the reference interpreter before anything runs.
"""
from __future__ import annotations

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
from ..lower.ir.task import TaskLaunchOp
from ..lower.passes.plan_halo_tasks import NAME as HALO_MODULE
from .backends import Fallback
from .backends.cpu.generated import (
    count_eqn_of,
    count_signature,
    fused_degrees,
    generated_relations,
)
from .backends.cpu.native.heap import pin_once
from .backends.cpu.prepared import prepare
from .backends.cpu.propagate import run_propagate
from .backends.triton.compile import HOOKS as TRITON_HOOKS
from .backends.triton.launch import call_backend as triton_call_backend
from .backends.triton.linear import dot_rule
from .backends.triton.prepared import prepare as prepare_triton
from .caches.equations import kept
from .caches.executables import CACHE, Executable
from .caches.programs import memo as memo_of
from .calls.binding import call_binding, call_target, distributed_binding
from .calls.routes import (
    bodies_with_relations,
    describe_program,
    paged_propagates,
    plan,
    propagates_of,
)
from .calls.threads import num_threads, pin_threads, unpin_threads
from .distributed.run import distributed_call, run_distributed
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
from .paging.pages import pageable
from .paging.resident import plan_resident
from .paging.run import PagedPlan, plan_paged, task_ir
from .reports.explain import Explanation
from .reports.runs import profiled, reporting

# what the runtime asks of lower/pipeline, from here only (api.py prints IR through ir_text
# and ir_module_name); lowering itself is asked as `pipeline.<function>` at the call, so a
# test counting the calls into the pipeline sees every one
ir_text, ir_module_name, quiet_dumps = pipeline.ir_text, pipeline.module_name, pipeline.quiet_dumps

GENERATED = ("radius", "knn")
NUMPY_NOTE = "numpy impl rules (tensor code outside propagate is not compiled yet)"


# ---- lowering: the runtime asks lower/pipeline here only -----------------------------------

def task_module(program: GraphProgram, name: str, binding: tuple = (),
                page_name: str = "paged", counts: tuple = ()) -> tuple:
    """(the Task module of `program` through every stage, bound by the call's `binding`
    (binding.call_binding, or distributed_binding: a rank's halo plans): its launches hold
    the Kernel ops that run, so every stage is dumped from here; {k: the one-page Task
    module, named `page_name`, of the k-th propagate} for those it runs by pages or halo
    plans; the same for the page walks of a rank's paged local relation; the launches of
    the degree counts `counts` names (count_signature)), from one lowering. Raises what the
    pipeline raises (the interpreter records it as a NoWalk)."""
    return pipeline.lower_call(program, name=name, binding=binding, page_name=page_name,
                               target=call_target(),
                               counts=tuple(count_eqn_of(*c) for c in counts))


def task_walk(program: GraphProgram, binding: tuple = (), page_name: str = "paged",
              counts: tuple = ()):
    """The interpreter's walk of `program` under the call's `binding` (and the coordinate
    signatures of the radius relations its degrees count, `counts`): built once per program
    and binding from the one lowering of the call (task_module); a NoWalk naming why when
    the IR stages do not express the program (eval_program then runs the same rules)."""
    key = (call_target(), page_name) + binding + counts
    found = cached_walk(program, key)
    if found is not None:
        return found
    threads = num_threads()      # (what the schedule pass reads: read before it runs)
    try:
        module, pages, local_pages, count_ops = task_module(
            lifted(program), module_name(program), binding, page_name, counts)
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
    for c, op in zip(counts, count_ops):      # (what the degrees rule reads: _degrees)
        kept(count_eqn_of(*c), "count_launch")[threads] = op
    return remember_walk(program, key, build_walk(program, module, pages, threads,
                                                  local_pages))


def call_walk(program: GraphProgram, args: list):
    """task_walk of a call of `program` on `args` on one host (every lowering of a call
    asks here: the binding and degree counts are read off the call's relations)."""
    return task_walk(program, call_binding(program, args), counts=count_signatures(program, args))


def _pages(program: GraphProgram, args: list, walk=None) -> dict:
    """{id(propagate): its PagedPlan, bound (_bound)} for every propagate a call runs by
    pages of a stored relation (loop bodies too): what explain() and ir("task") print."""
    found = {id(e): _bound(plan_paged(e, g), walk, e) for e, g in paged_propagates(program, args)}
    return {k: plan for k, plan in found.items() if plan is not None}


def _graph_of(eqn, env_or_args):
    """The relation value `eqn` reads (its first operand) among `env_or_args`, or None."""
    src = eqn.inputs[0]
    if isinstance(src, Lit):
        return src.value
    return env_or_args.get(id(src))


def plan_routes(program: GraphProgram, args: list, walk=None, *, compile: bool = True) -> dict:
    """{id(eqn): its route} for every top-level propagate of a call of `program` on `args`,
    each binding the Kernel op the call's walk (`walk`; default: call_walk) holds for it: an
    Executable or plan, or a Fallback (an Unbound where the walk holds none that fits: the
    runtime never lowers an equation on its own). compile=False: nothing is compiled."""
    walk = call_walk(program, args) if walk is None else walk
    launches = walk.launches if isinstance(walk, TaskWalk) else {}
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    # radius/knn generated inside the program: planned from their static parameters (the
    # fused kernel depends on them only), so strict mode sees the route that will run
    known.update(generated_relations(program))
    return {id(e): plan(e, _graph_of(e, known), held=launches.get(id(e)), compile=compile)
            for e in program.eqns if e.primitive is propagate_p}


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
        return run_distributed(program, list(args), walks, _halo_pages(walks),
                               _local_pages(walks), _local_launches(program, args, walks))
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
    for closed, vals in bodies_with_relations(program, args):
        body = closed.program
        if id(body) not in walks:
            walks[id(body)] = task_walk(body, distributed_binding(body, vals), HALO_MODULE)
    return walks


def _halo_pages(walks: dict) -> dict:
    """{id(propagate): the one-page Task module its halo plan unrolls} for a distributed
    call: what the lowering of its walks bound (bodies and branches are bound from the
    relations the call hands them: bodies_with_relations)."""
    pages: dict = {}
    for walk in walks.values():
        if isinstance(walk, TaskWalk):
            pages.update(walk.pages)
    return pages


def _local_launches(program: GraphProgram, args: list, walks: dict) -> dict:
    """{id(propagate): the Kernel op it binds} for the propagates of a distributed call over
    a relation that is not distributed (a rank's own graph beside the DistributedGraph)."""
    if not any(isinstance(a, Graph) for a in args):
        return {}
    return _bound_launches(program, args, list(walks.values()), lambda g: isinstance(g, Graph))


def _local_pages(walks: dict) -> dict:
    """{id(propagate): the one-page Task module of its page walk} for a distributed call
    whose ranks hold their local relation paged (tg.distributed's local stores): what the
    lowering of its walks bound."""
    pages: dict = {}
    for walk in walks.values():
        if isinstance(walk, TaskWalk):
            pages.update(walk.local_pages)
    return pages


def _run(program: GraphProgram, args: list) -> list:
    """The program's Task IR interpreted: its launches by the launch handler (_propagate),
    from the Kernel ops the module holds, other equations and loops by the runtime's eval
    rules (eval_program with the same rules when the IR does not express the program)."""
    walk = call_walk(program, args)
    generates = (walk.generates if isinstance(walk, TaskWalk) else
                 bool(generated_relations(program)))
    routes = None
    if config.strict or generates:
        # planned before anything runs: strict mode refuses a fallback up front, and a
        # relation generated in the program takes the route planned from its parameters
        # (its fused walk), not one chosen after a propagate materialised its CSR
        routes = plan_routes(program, args, walk)
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
    return run_walk(prep, program, args, OVERRIDES, prep.prepared, prep.handler)


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
        walk, program, args, partial(_prepared_launch, walk), selected_backend(),
        _launcher(program, walk)))


def _prepared_launch(walk: TaskWalk, eqn, graph):
    """A propagate's prepared launch over a stored or implicit relation held in memory
    (generated and paged relations plan per call): the generic cpu-llvm kernel or a Triton
    interpreter kernel bound to the relation (backends/*/prepared.py), else the plan itself
    (a Triton GPU kernel, a specialised walk), run as planned."""
    kind = getattr(graph, "kind", None)
    if kind in GENERATED or kind == "paged" or kind is None:
        return None
    route = plan(eqn, graph, held=walk.launches.get(id(eqn)))
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
    # fields over the host budget: by pages (the binding lowered its page walk; without
    # one, a relation the program computes, in memory)
    paged = plan_resident(eqn, vals[0], vals[1:])
    paged = None if paged is None else _bound(paged, walk, eqn)
    if paged is not None:
        return paged.run(eqn, vals[0], vals[1:])
    route = routes.get(id(eqn)) if routes is not None else None
    if route is None or (isinstance(route, Fallback) and
                         getattr(vals[0], "kind", None) in GENERATED):
        # (a relation generated inside the program is concrete only now)
        held = walk.launches.get(id(eqn)) if walk is not None else None
        route = plan(eqn, vals[0], held=held)
    if isinstance(route, Fallback):
        return None
    if isinstance(route, PagedPlan):
        route = _bound(route, walk, eqn)
        if route is None:       # (no page walk was lowered: the reference rule reads it whole)
            if config.strict:
                raise UnsupportedError(
                    "strict mode: a propagate over a stored relation would fall back to the "
                    "reference interpreter: its program's Task stages bound no page walk",
                    hint="unset TIGA_STRICT / tg.config.strict")
            return None
    return run_propagate(route, eqn, vals[0], vals[1:])


def _bound(route: PagedPlan, walk, eqn) -> PagedPlan | None:
    """A paged plan with what the call's lowering gave it (`walk`: its TaskWalk): the
    one-page Task module its pages unroll and, on a Triton backend, the page kernel's Kernel
    op (the one that module holds); for a grouping pages cannot complete, the Kernel op of
    the CSR it reads whole (the call's module holds it: the binding reads it as a CSR).
    None where the lowering bound no such walk (a program its stages do not walk, a relation
    the program computes): the runtime never lowers, so that propagate takes its other
    route."""
    target = "triton" if route.backend is not None else "cpu-llvm"
    if not isinstance(walk, TaskWalk):
        return None
    if pageable(eqn.params):
        page = walk.pages.get(id(eqn))
        if page is None:
            return None
        held = next((held_kernel(op) for op in page.body.ops
                     if isinstance(op, TaskLaunchOp)), None)
        if target == "triton" and (held is None or held.schedule.target != target):
            return None
        return route.bound(page, held if target == "triton" else None)
    held = walk.launches.get(id(eqn))
    if (held is None or held.comp.relation.type.kind != "csr"
            or held.schedule.target != target):
        return None
    return route.bound(None, held)


def _call(closed, args: list) -> list:
    args = list(closed.consts) + list(args)
    prep = _prepared(closed.program, args)    # (a loop body's warm iterations)
    return (run_walk(prep, closed.program, args, OVERRIDES, prep.prepared, prep.handler)
            if prep is not None else _run(closed.program, args))


def _regions(run):
    """The rule of a control-flow primitive (run_repeat, run_while, run_cond) whose bodies or
    branches run through this executor, so their propagates compile."""
    return lambda eqn, vals: run(_call, vals, **eqn.params)


def _degrees(eqn, vals):
    """Degrees of a generated relation counted by its fused walk (the relation stays
    unmaterialised; a radius count's launch is lowered with the call: count_signature), of
    a paged one by row ranges of its store (never the CSR whole); None: the impl rule counts
    them."""
    kind = getattr(vals[0], "kind", None)
    if kind not in GENERATED and kind != "paged":
        return None
    if kind == "paged":
        deg = paged_degrees(vals[0], eqn.params["by"])
    else:
        sig = count_signature(vals[0])
        op = None if sig is None else kept(count_eqn_of(*sig), "count_launch").get(
            num_threads())
        deg = fused_degrees(vals[0], eqn.params["by"], op)
    return None if deg is None else [deg]


def count_signatures(program: GraphProgram, args: list) -> tuple:
    """The coordinate signatures (count_signature) of the radius relations the top-level
    degrees equations of a call read: their counts are lowered with the call's program."""
    if not any(e.primitive is degrees_p for e in program.eqns):
        return ()
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    known.update(generated_relations(program))
    found = {count_signature(_graph_of(e, known)) for e in program.eqns
             if e.primitive is degrees_p}
    return tuple(sorted(s for s in found if s is not None))


# (dot_rule: an entity-level matmul as tile_matmul on a Triton backend; it declines in
# under a microsecond elsewhere, so the numpy impl rule runs it as before)
# the eval rules of the equations that are not launches (a propagate is a launch: run by the
# walk's launch handler, _launcher)
OVERRIDES = {repeat_p: _regions(run_repeat), while_loop_p: _regions(run_while),
             cond_p: _regions(run_cond), degrees_p: _degrees, dot_general_p: dot_rule}


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
            whole = _call_walks(program, local)     # (the global relations' own routes)
            return explain_distributed(program, args, CACHE, walk,
                                       _pages(program, local, whole[0]),
                                       _bound_launches(program, local, whole))
        walks = _call_walks(program, args)
        return describe_program(program, args, CACHE, walks[0], _pages(program, args, walks[0]),
                                _bound_launches(program, args, walks))


def _bound_launches(program: GraphProgram, args: list, walks: list, wanted=None) -> dict:
    """{id(propagate): the Kernel op it binds} for every propagate of a call (loop bodies
    too; `wanted(relation)`: only those over such relations): what the call's `walks` (its
    program's and its bodies') hold, else None (the planner then says Unbound)."""
    held: dict = {}
    for walk in walks:
        if isinstance(walk, TaskWalk):
            held.update(walk.launches)
    return {id(e): held.get(id(e)) for e, g, _ in propagates_of(program, args)
            if wanted is None or wanted(g)}


def _call_walks(program: GraphProgram, args: list) -> list:
    """The walks a call of `program` on `args` runs: its program's and, bound from the
    relations the call hands them, its loop bodies' and cond branches' (what they lower to
    when they run)."""
    walks = [call_walk(program, args)]
    walks += [call_walk(closed.program, vals) for closed, vals in
              bodies_with_relations(program, args)]
    return walks


def paged_task_ir(program: GraphProgram, args: list) -> str | None:
    """The page plan a call of `program` runs when it is one propagate over a paged relation
    (what ir("task") prints for it), else None."""
    return task_ir(program, args, _call_pages(program, args))


def _call_pages(program: GraphProgram, args: list) -> dict:
    """_pages of a call, with the walk its lowering binds (task_walk: built once)."""
    if not paged_propagates(program, args):
        return {}
    return _pages(program, args, call_walk(program, args))


def call_task_ir(program: GraphProgram, args: list, name: str = "main") -> str:
    """What `ir("task")` prints for a call of `program` on `args`: the page plan of one paged
    propagate, else the program's Task module bound to the call's relations (the module the
    interpreter walks: launches hold the Kernel ops that run, tasks name the fixed kernels
    beside them). Nothing runs."""
    if distributed_call(program, args):
        from .distributed.report import distributed_task_ir
        return distributed_task_ir(program, args, _halo_pages(_distributed_walks(program, args)))
    text = task_ir(program, args, _call_pages(program, args))
    if text is not None:
        return text
    # (the call's one lowering, which a later call reuses; lowered under the printed name
    # where TIGA_DUMP writes its stages, or again to raise what its stages raise)
    walk = None if pipeline.dumps_requested() else call_walk(program, args)
    if not isinstance(walk, TaskWalk):
        module = pipeline.lower(lifted(program), until="task", name=name,
                                binding=call_binding(program, args), target=call_target())
        if walk is not None:
            raise UnsupportedError(f"no Task module: {walk.reason}")
        return str(module)
    return str(replace(walk.module, name=name))


__all__ = ["execute", "run_prepared", "prepared_for", "explain_program",
           "plan_routes", "NUMPY_NOTE",
           "task_walk", "call_walk", "task_module", "paged_task_ir",
           "call_task_ir", "call_backend", "set_tensor_hook",
           "ir_text", "ir_module_name"]

