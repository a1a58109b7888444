"""lower: the ordered lowering stages (GraphProgram -> Domain -> Iter -> Kernel -> Task) and
`TIGA_DUMP=<stage>[,<stage>...|all]`, which writes a stage's IR text to stderr, or to
`$TIGA_DUMP_DIR/<name>.<stage>.mlir` when TIGA_DUMP_DIR is set."""
from __future__ import annotations

import contextlib
import os
import re
import sys
from contextvars import ContextVar

from ..core.config import ConfigError
from ..core.errors import TigaError, UnsupportedError
from . import ir
from .binding import HaloLayout, bind_program, bind_tasks, page_program, paged_propagates
from .passes import (
    lower_domain_to_iter,
    lower_iter_to_kernel,
    lower_program_to_domain,
    plan_distributed_tasks,
    select_kernel_schedule,
)
from .passes.plan_halo_tasks import plan_halo_tasks

STAGES = {
    "domain": (lower_program_to_domain,),
    "iter": (lower_domain_to_iter,),
    "kernel": (lower_iter_to_kernel, select_kernel_schedule),
    "task": (plan_distributed_tasks,),
}


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise UnsupportedError(f"IR stage {stage!r} does not exist",
                               hint=f"use one of {', '.join(STAGES)} (or 'program' for the "
                                    "GraphProgram)")


def lower(program, until: str = "task", *, name: str = "main",
          target: str = "cpu-llvm", dump: tuple | None = None,
          binding: tuple | None = None) -> ir.Module:
    """Run the stages up to `until`. `program` is a GraphProgram/ClosedProgram, or a module
    of an earlier level (its later stages run). `target` is the backend the Kernel stage
    schedules for (ir/kernel.TARGET_KEYS). `dump`: the stages TIGA_DUMP may write from this
    lowering (None: all), so that a caller dumps only the IR that runs. `binding`: the call's
    binding (binding.RelationBinding per propagate, in program order): the stages lower the
    walks it binds, and the Task module lists the fixed kernels each task runs."""
    _check_stage(until)
    if binding:
        program = bind_program(program, binding)
    module = program
    start = 0
    if isinstance(program, ir.Module):
        start = list(STAGES).index(program.level) + 1
        if start > list(STAGES).index(until):
            raise UnsupportedError(f"cannot lower a {program.level} module to {until!r}",
                                   hint="stages only go forward: domain, iter, kernel, task")
    for stage in list(STAGES)[start:]:
        for step in STAGES[stage]:
            if step is lower_program_to_domain:
                module = step(module, name=name)
            elif step is select_kernel_schedule:
                module = step(module, target=target)
            else:
                module = step(module)
        if stage == "task" and binding:
            module = bind_tasks(module, binding)
        if dump is None or stage in dump:
            _dump(stage, module)
        if stage == until:
            break
    return module


def lower_call(program, *, name: str = "main", binding: tuple = (),
               page_name: str = "paged", target: str = "cpu-llvm", counts: tuple = ()) -> tuple:
    """What a call signature lowers, in one go: (the Task module of `program` bound by
    `binding`; {k: the one-page Task module, named `page_name`, of the k-th propagate} for
    every propagate the binding runs by pages, or that module unrolled over the rank's
    share of a partition where the binding gives one (its halo plan); the same, named "paged", for
    the page walks of a rank's paged local relation; the scheduled launch of each equation
    of `counts`: the degree counts its degrees equations run as fused walks over the
    generated relations they read, on the host)."""
    module = lower(program, until="task", name=name, binding=binding, target=target)
    found = paged_propagates(program, binding)
    return (module,
            {k: _halo(lower(page_program(e, b.page or b), until="task", name=page_name,
                            target=target), e, b.halo) for k, e, b in found},
            {k: lower(page_program(e, b.local), until="task", name="paged", target=target)
             for k, e, b in found if b.local is not None},
            tuple(lower_launch(e, name="degree_count") for e in counts))


def _halo(page: ir.TaskModule, eqn, layout: HaloLayout | None) -> ir.TaskModule:
    """`page` unrolled over a rank's halo layout, where the binding gives one."""
    if layout is None:
        return page
    return plan_halo_tasks(page, layout, reduce_by=eqn.params["reduce_by"])


def lower_launch(eqn, relation_type=None, *, name: str = "propagate",
                 target: str = "cpu-llvm") -> ir.LaunchOp:
    """The scheduled `gf_kernel.launch` of one propagate equation, through the same stages
    as a whole program: the runtime renders from its schedule, so the Kernel IR TIGA_DUMP
    writes from here is what runs. `relation_type` replaces the equation's relation type
    (the runtime passes the walk it binds, e.g. a CSR for a relation it resolves)."""
    from ..core.program import Eqn, GraphProgram, Var

    binders = [Var(a.type) for a in eqn.inputs]
    if relation_type is not None:
        binders[0] = Var(relation_type)
    outs = [Var(v.type) for v in eqn.outputs]
    program = GraphProgram(binders, [Eqn(eqn.primitive, tuple(binders), eqn.params,
                                         tuple(outs))], outs)
    # (the program's Domain, Iter and Task IR are dumped where the runtime lowers the whole
    # program it interprets, xla_free_runtime/executor.py; this launch is the kernel it renders)
    module = lower(program, until="kernel", name=name, target=target, dump=("kernel",))
    launches = [op for op in ir.walk_ops(module.body) if isinstance(op, ir.LaunchOp)]
    if len(launches) != 1:
        raise TigaError(f"lower_launch: a propagate lowered to {len(launches)} launches, "
                        "expected 1; this is a Tiga bug")
    return launches[0]


def ir_text(program, stage: str, *, name: str = "main") -> str:
    from .backends import RENDER_STAGES, render_module
    if stage in RENDER_STAGES:   # a backend's source text ("triton", "llvm")
        return render_module(lower(program, until="kernel", name=name,
                                   target=RENDER_STAGES[stage]), stage)
    return str(lower(program, until=stage, name=name))


def module_name(raw: str) -> str:
    """A module name from a Python name (`<lambda>` -> `lambda`)."""
    name = re.sub(r"[^A-Za-z0-9_]", "", raw or "") or "main"
    return name if not name[0].isdigit() else f"m{name}"


def _dump_stages() -> set:
    raw = os.environ.get("TIGA_DUMP", "").strip()
    if not raw:
        return set()
    stages = {s.strip() for s in raw.split(",") if s.strip()}
    if "all" in stages:
        return set(STAGES)
    unknown = stages - set(STAGES)
    if unknown:
        raise ConfigError(f"TIGA_DUMP: unknown stage(s) {', '.join(sorted(unknown))}; use "
                          f"{', '.join(STAGES)} or all")
    return stages


def dumps_requested() -> bool:
    """Whether TIGA_DUMP asks for some stage here (ir("task") then lowers afresh under the
    name it prints, so the dump files carry that name)."""
    return not _QUIET.get() and bool(_dump_stages())


# explain() lowers what it describes without running it: TIGA_DUMP writes only the IR of
# what runs (a context variable, so another thread's call still dumps)
_QUIET: ContextVar[bool] = ContextVar("tiga_dump_quiet", default=False)


@contextlib.contextmanager
def quiet_dumps():
    """Lowering inside this block writes no TIGA_DUMP files (explain: nothing runs)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def _dump(stage: str, module: ir.Module) -> None:
    if _QUIET.get() or stage not in _dump_stages():
        return
    text = str(module)
    out_dir = os.environ.get("TIGA_DUMP_DIR", "").strip()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{module.name}.{stage}.mlir"), "w") as f:
            f.write(text)
    else:
        sys.stderr.write(f"// TIGA_DUMP {stage}\n{text}")
