"""runtime: the route of one `propagate`, from one explicit, ordered table of planners.

`plan(eqn, graph)` is the one question every caller asks ("which plan runs this
propagate?"): the executor, explain(), the distributed runtime. The selected backend
(lower/backends.py) decides first, through the planner its launcher names (`launcher.plan`:
a Triton backend's is triton/launch.backend_plan, registered when this module imports it);
cpu-llvm tries the specialised planners of `PLANNERS` in order and then the generic fused
kernel (propagate.generic_plan). The planners import propagate.py, never this module, so
the dispatch sits above them.

A planner is `planner(eqn, graph, compile, held) -> None | Fallback | plan` (None: not
mine). A plan has `run(eqn, graph, values) -> outputs` and `describe(explanation, eqn, graph,
where)`; `compile=False` plans must not compile anything (explain() before a call). `held` is
the Kernel op handed down for the equation (the call's bound Task module's); a cpu-llvm
planner it does not fit answers an Unbound naming the launch to lower, which the executor
lowers and plans again with (executor.planned): nothing below the executor lowers.

Per target the table (lower/backends.BACKENDS) names the renderer; the launcher registered
here for it names the planner (`plan`) and the artifact kind its compiler produces
(`artifact`: cache.LLVMArtifact, a linked library or MCJIT object; compile.TritonArtifact,
the rendered module), which every backend keeps in the one artifact cache (cache.CACHE,
artifacts.py).
"""
from __future__ import annotations

import weakref

from ..lower import CPU_LLVM_AVAILABLE
from ..lower.backends import BACKENDS, register_launcher, selected_backend
from .backends.cpu import attention, generated
from .backends.cpu.propagate import Fallback, generic_plan
from .backends.triton import launch as _triton_launch  # noqa: F401  (its launcher: registered)
from .cache import CACHE, Executable, LLVMArtifact
from .equation_cache import kept
from .paging import run as paging
from .threads import num_threads


def _paged(eqn, graph, compile: bool, held=None):
    return paging.plan_paged(eqn, graph)   # (reads rows per page; nothing compiles ahead)


# Tried in this order before the generic fused kernel: a stored relation pages whatever its
# edge function; attention and generated (radius/knn) relations have their own walks.
PLANNERS = (_paged, attention.plan_attention, generated.plan_generated)


def plan_cpu(eqn, graph, *, compile: bool = True, held=None):
    """The cpu-llvm route: the first specialised planner that claims the equation, else the
    generic fused kernel (an Executable, its key when compile=False, or a Fallback; an
    Unbound when `held`, the Kernel op handed down, does not fit the walk it binds)."""
    if graph is not None and CPU_LLVM_AVAILABLE:
        for planner in PLANNERS:
            found = planner(eqn, graph, compile, held)
            if found is not None:
                return found
    return generic_plan(eqn, graph, compile=compile, held=held)


def plan(eqn, graph, *, compile: bool = True, held=None):
    """The plan of one propagate on the selected backend, or a Fallback naming why the
    reference interpreter runs it (`graph` None: decided from the relation's type; `held`:
    the Kernel op handed down for the equation; an Unbound when it does not fit the walk
    bound here: the executor lowers the launch it names and asks again)."""
    launcher = getattr(BACKENDS.get(selected_backend()), "launcher", None)
    if launcher is not None and launcher.plan is not plan_cpu:   # (a Triton backend's own)
        return launcher.plan(eqn, graph, compile=compile, held=held)
    if not compile or graph is None:
        return plan_cpu(eqn, graph, compile=compile, held=held)
    threads = num_threads()
    # {id(graph): (weak graph, pool threads, Executable)}: the generic kernel a warm call of
    # this propagate over this relation runs, reused while the cache still holds it (the
    # planners decide from the relation's kind and layout, both fixed at its construction)
    per_eqn = kept(eqn, "cpu_routes")
    found = per_eqn.get(id(graph))
    if (found is not None and found[0]() is graph and found[1] == threads
            and CACHE.current(found[2])):
        return found[2]
    route = plan_cpu(eqn, graph, held=held)
    # (a generated relation changes route once it is materialised: planned every call)
    if (isinstance(route, Executable)
            and getattr(graph, "kind", None) not in generated.GENERATED_KINDS):
        if len(per_eqn) > 64:
            per_eqn.clear()
        per_eqn[id(graph)] = (weakref.ref(graph), threads, route)
    return route


register_launcher("cpu-llvm", type("_LLVMLauncher", (), {"plan": staticmethod(plan_cpu),
                                                         "artifact": LLVMArtifact}))

__all__ = ["PLANNERS", "plan", "plan_cpu", "Fallback"]
