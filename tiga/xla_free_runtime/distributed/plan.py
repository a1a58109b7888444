"""runtime/distributed: the per-call plan of a propagate over a DistributedGraph, as Task IR.

The plan is the one-launch Task IR of the propagate (the same lowering as any program, the
kernel region every launch runs; the call's lowering gives it, the executor hands it down), expanded
over this rank's halo plan by the lowering pass lower/passes/plan_halo_tasks (its docstring
lists the ops). This module is the runtime's side: it hands the pass this rank's plan as plain
numbers, caches the module on the graph per (equation, schedule) and its interpreter steps
per module in the equation's weak cache, and verifies the module when tg.config.check.
`run.py`'s halo handlers run the steps.
"""
from __future__ import annotations

import weakref

from ...core.config import config
from ...lower.ir.task import TaskModule
from ...lower.passes.plan_halo_tasks import plan_halo_tasks
from ..caches.equations import kept
from ..interpreter import op_steps


def read_fields(eqn) -> set:
    """Positions (among the field operands) the edge function reads."""
    return eqn.params["edge_fn"].read_inputs()


def exchanged(eqn) -> dict:
    """{field position: position whose exchange supplies it}: one exchange per distinct
    source operand read (the same value on every rank: decided by the equation alone)."""
    read, first, out = read_fields(eqn), {}, {}
    for i, (a, role) in enumerate(zip(eqn.inputs[1:], eqn.params["roles"])):
        if role == "src" and i in read:
            out[i] = first.setdefault(id(a), i)
    return out


def halo_plan(eqn, dg, page) -> tuple:
    """(module, steps): the plan of `eqn` over `dg` and its ops as interpreter steps."""
    module = task_module(eqn, dg, page)
    # id(plan module) -> (weak module, its op_steps): a module is fixed once built, and its
    # steps are read on every call (dropped with the module, i.e. with its graph's plan
    # cache, or with the equation)
    per_module = kept(eqn, "halo_steps")
    key = id(module)
    entry = per_module.get(key)
    if entry is not None and entry[0]() is module:
        return module, entry[1]
    steps = op_steps(module)
    per_module[key] = (weakref.ref(module, lambda _, key=key: per_module.pop(key, None)),
                       steps)
    return module, steps


def task_module(eqn, dg, page: TaskModule) -> TaskModule:
    """The plan of `eqn` over `dg`, cached on the graph per equation and schedule (a module
    depends on both alone); `page`: the one-page Task module of `eqn` the plan unrolls."""
    plans = dg.task_plans.get(eqn)
    if plans is None:
        plans = dg.task_plans[eqn] = {}
    key = dg.overlap if eqn.params["reduce_by"] == "dst" else None
    module = plans.get(key)
    if module is None:
        module = plans[key] = build(eqn, dg, page)
        if config.check:
            module.verify()
    return module


def build(eqn, dg, page: TaskModule) -> TaskModule:
    """The pass over the propagate's one-page Task module and this rank's halo plan."""
    p = dg.plan
    return plan_halo_tasks(
        page, reduce_by=eqn.params["reduce_by"],
        fields=tuple(sorted(set(exchanged(eqn).values()))), overlap=bool(dg.overlap),
        rank=dg.comm.rank, num_ranks=dg.comm.size, n_owned=p.n_owned,
        n_interior=p.n_interior, num_edges=p.num_edges, recv=tuple(p.recv),
        peers=tuple(p.peers()), chunks=tuple(rows for rows, _ in dg.interior_chunks))


__all__ = ["halo_plan", "task_module", "build", "exchanged", "read_fields"]
