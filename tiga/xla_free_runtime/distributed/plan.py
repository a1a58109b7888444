"""runtime/distributed: a propagate's halo plan over a DistributedGraph, as Task IR.

The plan is the propagate's one-page Task module unrolled over this rank's share of the
partition by the lowering pass lower/passes/plan_halo_tasks (its docstring lists the ops): the
share is part of the call's binding (calls/binding.halo_layout), so the executor's one lowering
of the call gives the plan. This module keeps the plan's interpreter steps per module in the
equation's weak cache and verifies it when tg.config.check; `run.py`'s halo handlers run the
steps.
"""
from __future__ import annotations

import weakref

from ...core.config import config
from ...lower.ir.task import TaskModule
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


def halo_plan(eqn, module: TaskModule) -> tuple:
    """(module, steps): the halo plan of `eqn` the call's lowering gave (its one-page module
    unrolled over the rank's share: binding.halo_layout) and its ops as interpreter steps,
    verified once when tg.config.check."""
    # id(plan module) -> (weak module, its op_steps): a module is fixed once lowered, and its
    # steps are read on every call (dropped with the module, i.e. with the call's walk, or
    # with the equation)
    per_module = kept(eqn, "halo_steps")
    key = id(module)
    entry = per_module.get(key)
    if entry is not None and entry[0]() is module:
        return module, entry[1]
    if config.check:
        module.verify()
    steps = op_steps(module)
    per_module[key] = (weakref.ref(module, lambda _, key=key: per_module.pop(key, None)),
                       steps)
    return module, steps


__all__ = ["halo_plan", "exchanged", "read_fields"]
