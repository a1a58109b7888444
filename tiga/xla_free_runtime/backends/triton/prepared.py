"""runtime/backends/triton: a Triton propagate plan bound once to its relation, for warm calls.

`prepare(plan, eqn, graph)` fixes what `TritonPlan.run` decides per call from the plan and
the relation alone: the relation's walk tensors in slot order, the rows and grid, the launch
meta-parameters, each field's dtype and the outputs to allocate. `run(values)` then hands the
fields to the kernel as they are and returns its outputs. Only the triton-interpreter route
is prepared (its tensors are CPU tensors over numpy memory: a field is wrapped without a
copy and an output allocated by numpy is the result the kernel wrote, no copy back). The GPU
route, a relation with rows above the split degree (the split path's launches), a combined
(reduce_by="all") launch and bfloat16 operands are not prepared; a field that is not a
writable, aligned, C-contiguous, non-empty numpy array of the kernel's dtype runs
`TritonPlan.run`.
The kernel is looked up per launch (`plan.kernel()`) and launched through the backend table,
as `TritonPlan.run` does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....lower.backends import BACKENDS
from .. import KernelArgs, launch
from .compile import tensors
from .launch import TritonPlan, _split_plan, _torch_walk


@dataclass(frozen=True)
class PreparedTritonLaunch:
    plan: TritonPlan
    eqn: object
    walk: tuple          # the relation's tensors, in the kernel's argument order
    fields: tuple        # per field: its numpy dtype
    outs: tuple          # per output: (shape, numpy dtype)
    rows: int
    grid: tuple
    meta: dict           # BLOCK_R, BLOCK_N, num_warps, num_stages
    wrap: object         # numpy array -> CPU tensor over its memory (the torch bridge's)

    def run(self, values: list) -> list:
        """The outputs of one launch on `values` (the relation, then its fields)."""
        fields = values[1:]
        wrap = self.wrap
        args = []     # (loops, not comprehensions: each costs a frame on CPython 3.11)
        for f, dtype in zip(fields, self.fields):
            # (carray: C-contiguous, aligned and writable, one flag read)
            if (type(f) is not np.ndarray or f.dtype != dtype or not f.size or
                    not f.flags.carray):
                return self.plan.run(self.eqn, values[0], fields)
            args.append(wrap(f))
        outs = []
        for shape, dtype in self.outs:
            o = np.zeros(shape, dtype)
            args.append(wrap(o))
            outs.append(o)
        if self.rows > 0:
            plan = self.plan
            launch(plan.artifact, plan.op, KernelArgs(jobs=(
                (plan.kernel(), self.grid, (*self.walk, *args, self.rows), self.meta),)))
        return outs


def prepare(plan, eqn, graph) -> PreparedTritonLaunch | None:
    """The prepared launch of `plan` (a TritonPlan planned for `eqn` over `graph`) on the
    triton-interpreter route, or None (see the module docstring)."""
    if not isinstance(plan, TritonPlan) or not BACKENDS[plan.backend].interpreter:
        return None
    sig = plan.source.signature
    if (sig.combine or "bfloat16" in sig.field_dtypes or "bfloat16" in sig.out_dtypes or
            not hasattr(tensors(), "wrap_host")):
        return None
    walk = _torch_walk(graph, sig, "cpu")
    rows = graph.num_src if sig.walk == "src" else graph.num_dst
    if sig.split_degree and rows > 0 and (walk.get("row_ptr") is None or _split_plan(
            graph, sig, "cpu", walk["row_ptr"]) is not None):
        return None     # (rows above the split degree: the split path's two more launches)
    lead = {"dst": graph.num_dst, "src": graph.num_src, "edge": graph.num_edges,
            "all": graph.num_dst}[sig.reduce_by]
    outs = tuple(((lead,) + tuple(s), np.dtype(d))
                 for s, d in zip(sig.out_shapes, sig.out_dtypes))
    if any(not int(np.prod(shape)) for shape, _ in outs):
        return None    # (from_array never hands the kernel an empty tensor)
    return PreparedTritonLaunch(
        plan, eqn, tuple(walk[s] for s in sig.slots if not s.startswith(("field:", "out:"))),
        tuple(np.dtype(d) for d in sig.field_dtypes), outs, rows,
        (-(-rows // sig.block_rows),) if rows > 0 else (0,),
        {"BLOCK_R": sig.block_rows, "BLOCK_N": sig.block_neighbors,
         "num_warps": sig.num_warps, "num_stages": sig.num_stages}, tensors().wrap_host)


__all__ = ["PreparedTritonLaunch", "prepare"]
