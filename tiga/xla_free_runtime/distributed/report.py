"""runtime/distributed: explain() of a program over a DistributedGraph: the local routes,
the halo plan (ghost rows and bytes per neighbour rank), the Task IR the latest call ran
(one line per op, then the module text) and the measured overlap."""
from __future__ import annotations

import numpy as np

from ...core.prims.graph import propagate_p
from ...lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TransferOp
from ..reports.explain import Explanation
from ..reports.runs import measured
from .graph import is_distributed
from .run import _graphs


def _src_row_bytes(program) -> int:
    """Bytes per row of the source fields the program's propagates exchange."""
    total = 0
    for e in program.eqns:
        if e.primitive is not propagate_p:
            continue
        for a, role in zip(e.inputs[1:], e.params["roles"]):
            if role == "src":
                shape = [int(d) for d in a.type.shape[1:]]
                total += int(np.prod(shape, dtype=np.int64)) * a.type.dtype.itemsize
    return total


def op_lines(module) -> list:
    """One readable line per op of a plan (the module text follows in explain())."""
    out = []
    for op in module.body.ops:
        if isinstance(op, TransferOp):
            peer = f" peer {op.peer}, {op.ghosts} ghost rows" if op.kind == "halo" else ""
            out.append(f"gf_storage.transfer {op.kind} %{op.value.name} rows "
                       f"[{op.rows[0]}, {op.rows[1]}){peer}")
        elif isinstance(op, TaskLaunchOp):
            wait = f" after {', '.join('%' + d.name for d in op.deps)}" if op.deps else ""
            out.append(f"gf_task.launch {op.task_kind} rows [{op.page_rows[0]}, "
                       f"{op.page_rows[1]}){wait}")
        elif isinstance(op, JoinOp):
            out.append(f"gf_storage.join %{op.event.name} of {len(op.deps)} event(s)")
    released = sum(isinstance(op, ReleaseOp) for op in module.body.ops)
    if released:
        out.append(f"gf_storage.release of {released} operand(s)")
    return out


def explain_distributed(program, args: list, cache, walk, pages: dict,
                        held: dict) -> Explanation:
    from ..calls.routes import describe_program

    local = [a.full if is_distributed(a) else a for a in args]
    ex = describe_program(program, local, cache, walk, pages, held)
    row_bytes = _src_row_bytes(program)
    for dg in _graphs(args):
        ex.traversal.extend(f"distributed halo: {line}" for line in dg.halo_lines(row_bytes))
        ex.traversal.append(f"distributed interior relation: {dg.plan.n_interior} rows run "
                            "while the halo is in flight; boundary rows after the wait")
        last = measured("halo", dg) or {}
        if "module" in last:       # the plan the latest propagate ran, op by op
            ex.traversal.extend(f"distributed task: {line}" for line in op_lines(last["module"]))
            ex.task_ir = str(last["module"])
        if "interior_s" in last:
            hidden = last["interior_s"] / max(last["interior_s"] + last["wait_s"], 1e-12)
            ex.traversal.append(
                f"distributed measured ({last['order']}): interior {last['interior_s']*1e3:.3f}"
                f" ms, blocked in wait {last['wait_s']*1e3:.3f} ms, boundary "
                f"{last['boundary_s']*1e3:.3f} ms; {last['bytes_in']} B received, "
                f"{last['bytes_out']} B sent; compute covered {100 * hidden:.0f}% of the "
                "exchange window")
        ex.schedule += ("; distributed: one exchange per source field read, interior rows "
                        "overlapped with it" if dg.overlap else
                        "; distributed: communicate, then compute")
    ex.reason += "; the relation is a DistributedGraph (MPI halo exchange)"
    return ex


def distributed_task_ir(program, args: list, pages: dict) -> str:
    """What ir("task") prints for a call over DistributedGraph(s): the halo plan of each
    propagate over one, on this rank (the modules its halo handlers walk), in program
    order (`pages`: those halo plans, from the call's lowering)."""
    known = {id(v): a for v, a in zip(program.in_binders, args)}
    texts = []
    for e in program.eqns:
        if e.primitive is not propagate_p:
            continue
        rel = e.inputs[0]
        dg = known.get(id(rel), getattr(rel, "value", None))
        if is_distributed(dg):
            texts.append(str(pages[id(e)]))
    return "".join(texts)


__all__ = ["explain_distributed", "distributed_task_ir"]
