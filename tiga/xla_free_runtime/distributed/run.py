"""runtime/distributed: run a program whose relation is a DistributedGraph.

The per-call plan of a destination-grouped propagate is data (`Task` list, kept on the
graph for explain()): pack + send the owned rows peers read, receive the ghost rows, launch
the interior rows (the same compiled kernel as one process, on the interior relation)
testing the transfers between launches, wait, launch the boundary rows on owned + ghost
rows. Source-grouped propagates (VJP source cotangents) run after the exchange on the
local relation and send their ghost rows back to the owners (`reverse_add`). Other
equations are local (row-wise tensor code); a reduction over rows is this rank's part.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np

from ...core.config import config
from ...core.errors import DistributedError, UnsupportedError
from ...core.primitive import impl_rules
from ...core.prims.control import repeat_p, run_repeat, run_while, while_loop_p
from ...core.prims.graph import degrees_p, edge_ids_p, propagate_p
from ...core.program import ClosedProgram, GraphProgram, Lit
from ..launch import plan_cpu as plan_propagate  # (the cpu-llvm route table)
from ..propagate import Fallback, run_propagate
from .exchange import HaloExchange, reverse_add, wait_exchanges
from .graph import DistributedGraph, is_distributed


@dataclass(frozen=True)
class Task:
    """One step of a distributed propagate: pack | send | recv | interior | wait |
    boundary | local | reverse."""

    kind: str
    detail: str


_LITS: dict = {}     # id(program) -> (weak program, whether a literal is distributed)


def distributed_call(program: GraphProgram, args: list) -> bool:
    """The program reads a DistributedGraph: as an argument, or captured by the trace (a
    literal, also inside loop bodies). Memoised per program."""
    if any(is_distributed(a) for a in args):
        return True
    entry = _LITS.get(id(program))
    if entry is not None and entry[0]() is program:
        return entry[1]
    found = bool(_literal_graphs(program))
    if len(_LITS) > 1024:
        _LITS.clear()
    _LITS[id(program)] = (weakref.ref(program), found)
    return found


def _literal_graphs(program: GraphProgram) -> list:
    found = []
    for e in program.eqns:
        found += [a.value for a in e.inputs if isinstance(a, Lit) and is_distributed(a.value)]
        for p in e.params.values():
            if isinstance(p, ClosedProgram):
                found += [c for c in p.consts if is_distributed(c)]
                found += _literal_graphs(p.program)
    return found


def run_distributed(program: GraphProgram, args: list) -> list:
    graphs = _graphs(list(args) + _literal_graphs(program))
    for dg in graphs:
        if dg.broken:
            raise DistributedError(f"rank {dg.comm.rank}: this DistributedGraph's exchange "
                                   f"failed earlier ({dg.broken}); partition again")
        _agree(dg, program, args)
    try:
        return _Runner(graphs[0]).run(program, list(args))
    except DistributedError as exc:
        for dg in graphs:
            dg.broken = str(exc)
        raise


def _graphs(args) -> list:
    seen: dict = {}
    for a in args:
        if is_distributed(a):
            seen[id(a)] = a
    return list(seen.values())


def _agree(dg: DistributedGraph, program: GraphProgram, args: list) -> None:
    """Once per program and argument shapes: every rank runs the same thing (a mismatch
    would otherwise pair the wrong messages or wait forever)."""
    shapes = tuple((tuple(np.shape(a))[1:], str(getattr(a, "dtype", type(a).__name__)))
                   if not is_distributed(a) else ("graph",) for a in args)
    key = (id(program), shapes)
    if key in dg._agreed:
        return
    token = repr((_structure(program), shapes))
    dg.comm.agree(token, "the program and its field shapes")
    dg._agreed.add(key)


def _structure(program: GraphProgram) -> tuple:
    """The equations that communicate, in order (propagates, degrees, loops and their
    bodies): what must match across ranks. Other equations may differ with the local row
    counts (a trace at concrete sizes elides a broadcast to one row, say)."""
    out = []
    for e in program.eqns:
        p = e.params
        if e.primitive is propagate_p:
            out.append(("propagate", p["reduce_by"], p["reducer"].name, p["roles"]))
        elif e.primitive is degrees_p:
            out.append(("degrees", p["by"]))
        elif e.primitive in (repeat_p, while_loop_p):
            bodies = tuple(_structure(c.program) for c in p.values()
                           if isinstance(c, ClosedProgram))
            out.append((e.primitive.name, p.get("length"), p.get("max_iterations"), bodies))
    return tuple(out)


class _Runner:
    def __init__(self, dg: DistributedGraph):
        self.dg = dg

    def run(self, program: GraphProgram, args: list) -> list:
        env: dict = {}
        for v, x in zip(program.in_binders, args):
            env[id(v)] = x

        def read(a):
            return a.value if isinstance(a, Lit) else env[id(a)]

        for eqn in program.eqns:
            vals = [read(a) for a in eqn.inputs]
            for v, o in zip(eqn.outputs, self.equation(eqn, vals)):
                env[id(v)] = o
        return [read(a) for a in program.outs]

    def call(self, closed, args: list) -> list:
        return self.run(closed.program, list(closed.consts) + list(args))

    def equation(self, eqn, vals: list) -> list:
        prim = eqn.primitive
        if prim is propagate_p:
            if is_distributed(vals[0]):
                return propagate(eqn, vals[0], vals[1:])
            return launch(eqn, vals[0], vals[1:])
        if prim is repeat_p:
            return run_repeat(self.call, vals, **eqn.params)
        if prim is while_loop_p:
            return run_while(self._agreed_call(eqn.params["cond"]), vals, **eqn.params)
        if prim is degrees_p and is_distributed(vals[0]):
            return [vals[0].degrees(eqn.params["by"])]
        if prim is edge_ids_p and is_distributed(vals[0]):
            return [np.arange(vals[0].num_edges, dtype=np.int64)]   # local edge order
        if any(is_distributed(v) for v in vals):
            raise UnsupportedError(f"{prim.name} on a DistributedGraph: only propagate and "
                                   "degrees read a distributed relation",
                                   hint="pass the global tg.Graph outside tg.distributed")
        rule = impl_rules.get(prim)
        if rule is None:
            raise UnsupportedError(f"{prim.name} has no reference implementation")
        return rule(*[np.asarray(v) if not hasattr(v, "resolve_csr") else v for v in vals],
                    **eqn.params)

    def _agreed_call(self, cond):
        """The loop condition is agreed: every rank continues while any rank's does."""
        def call(closed, args):
            outs = self.call(closed, args)
            if closed is cond:
                return [np.asarray(self.dg.comm.any(bool(outs[0]), "a while_loop condition"))]
            return outs
        return call


def launch(eqn, graph, values: list, outs: list | None = None) -> list:
    """The equation on one (local, concrete) relation: the compiled kernel, else the
    reference interpreter (strict mode refuses that). The kernel writes into `outs` (row
    ranges of the whole result) when given and they fit; the caller copies otherwise."""
    if graph.num_dst == 0 and eqn.params["reduce_by"] in ("dst", "edge") or \
            graph.num_src == 0 and eqn.params["reduce_by"] == "src":
        lead = 0
        return [np.zeros((lead,) + tuple(v.type.shape[1:]), v.type.dtype.np)
                for v in eqn.outputs]
    route = plan_propagate(eqn, graph)
    if isinstance(route, Fallback):
        if config.strict:
            raise UnsupportedError(f"strict mode: a distributed propagate would fall back to "
                                   f"the reference interpreter: {route.reason}",
                                   hint="unset TIGA_STRICT / tg.config.strict")
        return impl_rules[propagate_p](graph, *values, **eqn.params)
    return run_propagate(route, eqn, graph, values, outs)


def _read_fields(eqn) -> set:
    """Positions (among the field operands) the edge function reads."""
    closed = eqn.params["edge_fn"]
    read = {id(a) for e in closed.program.eqns for a in e.inputs}
    read |= {id(a) for a in closed.program.outs}
    binders = closed.program.in_binders[len(closed.consts):]
    return {i for i, v in enumerate(binders) if id(v) in read}


def _start(dg, eqn, fields: list) -> dict:
    """{field position: HaloExchange}: one exchange per distinct source array read."""
    read, by_id, out = _read_fields(eqn), {}, {}
    for i, role in enumerate(eqn.params["roles"]):
        if role != "src":
            continue
        if i not in read:
            out[i] = None
            continue
        key = id(fields[i])
        if key not in by_id:
            by_id[key] = HaloExchange(dg, fields[i])
        out[i] = by_id[key]
    return out


def _extended(dg, fields: list, exchanges: dict) -> list:
    """Source fields over owned + ghost rows (unread ones: uninitialised, never read)."""
    out = list(fields)
    n = dg.plan.n_owned + dg.plan.n_ghost
    for i, ex in exchanges.items():
        if ex is not None:
            out[i] = ex.extended()
        else:
            x = np.asarray(fields[i])
            out[i] = np.empty((n,) + x.shape[1:], x.dtype)
    return out


def _rows(eqn, fields: list, rows: tuple, edges: tuple) -> list:
    """Destination and edge fields cut to a row range (and its edge range)."""
    out = []
    for x, role in zip(fields, eqn.params["roles"]):
        if role == "dst":
            x = np.asarray(x)[rows[0]:rows[1]]
        elif role == "edge":
            x = np.asarray(x)[edges[0]:edges[1]]
        out.append(x)
    return out


def propagate(eqn, dg: DistributedGraph, fields: list) -> list:
    by = eqn.params["reduce_by"]
    if by == "dst":
        return _overlapped(eqn, dg, fields)
    exchanges = _start(dg, eqn, fields)
    live = [ex for ex in set(exchanges.values()) if ex is not None]
    wait_exchanges(dg, live, "the halo exchange")
    outs = launch(eqn, dg.full, _extended(dg, fields, exchanges))
    tasks = [Task("exchange", f"{len(live)} source field(s), then one launch over owned + "
                              f"ghost rows grouped by {by}")]
    if by == "src":
        r = eqn.params["reducer"]
        if not (r.builtin and r.name == "sum"):
            raise UnsupportedError(f"a source-grouped {r.name} propagate over a "
                                   "DistributedGraph: ghost rows can only be added back",
                                   hint="use tg.sum() (VJP source cotangents are sums)")
        outs = [reverse_add(dg, o, "the reverse halo exchange (ghost cotangents)")
                for o in outs]
        tasks.append(Task("reverse", "ghost rows sent back to their owners and added"))
    dg.last_call = {"tasks": tasks, "reduce_by": by}
    return outs


def _overlapped(eqn, dg: DistributedGraph, fields: list) -> list:
    """pack/send/recv, interior launches (testing the transfers between them), wait,
    boundary launch; or, with dg.overlap False, wait before any launch."""
    p = dg.plan
    t0 = time.perf_counter()
    exchanges = _start(dg, eqn, fields)
    live = [ex for ex in dict.fromkeys(exchanges.values()) if ex is not None]
    waited = wait_exchanges(dg, live, "the halo exchange") if not dg.overlap else 0.0
    owned = list(fields)
    for i, ex in exchanges.items():
        if ex is not None:
            owned[i] = ex.owned()       # aligned: no per-launch staging copy
    outs = _outputs(eqn, p.n_owned)
    t1 = time.perf_counter()
    for (a, b), g in dg.interior_chunks:
        e = (int(p.row_ptr[a]), int(p.row_ptr[b]))
        _into(outs, a, b, launch(eqn, g, _rows(eqn, owned, (a, b), e),
                                 [o[a:b] for o in outs]))
        for ex in live:
            ex.test()
    t2 = time.perf_counter()
    if dg.overlap:
        waited = wait_exchanges(dg, live, "the halo exchange")
    ext = _extended(dg, fields, exchanges)
    a, b = p.n_interior, p.n_owned
    _into(outs, a, b, launch(eqn, dg.boundary,
                             _rows(eqn, ext, (a, b), (p.interior_edges, len(p.col_idx))),
                             [o[a:b] for o in outs]))
    t3 = time.perf_counter()
    _record(dg, live, t0, t1, t2, t3, waited)
    return outs


def _outputs(eqn, rows: int) -> list:
    """The whole results (owned rows), written a row range per launch: no concatenation."""
    return [np.empty((rows,) + tuple(int(d) for d in v.type.shape[1:]), v.type.dtype.np)
            for v in eqn.outputs]


def _into(outs: list, a: int, b: int, got: list) -> None:
    """Rows [a, b) of the results from a launch (a copy unless it wrote them in place)."""
    for o, g in zip(outs, got):
        rows = o[a:b]
        if not (isinstance(g, np.ndarray) and g.shape == rows.shape and
                g.ctypes.data == rows.ctypes.data):
            rows[...] = np.asarray(g).reshape(rows.shape)


def _record(dg, live, t0, t1, t2, t3, waited) -> None:
    p = dg.plan
    nbytes_in = sum(ex.bytes_in for ex in live)
    nbytes_out = sum(ex.bytes_out for ex in live)
    order = "overlapped" if dg.overlap else "communicate-then-compute"
    tasks = [Task("pack", f"{len(live)} source field(s): {nbytes_out} B of owned rows for "
                          f"{len(p.send)} peer(s)"),
             Task("send", f"Isend to ranks {[q for q, _ in p.send]}"),
             Task("recv", f"Irecv {p.n_ghost} ghost rows ({nbytes_in} B) from ranks "
                          f"{[q for q, _, _ in p.recv]}"),
             Task("interior", f"{len(dg.interior_chunks)} launch(es) over rows [0, "
                              f"{p.n_interior}), MPI progress tested between them"),
             Task("wait", "all halo requests (bounded by TIGA_DIST_TIMEOUT)"),
             Task("boundary", f"1 launch over rows [{p.n_interior}, {p.n_owned}) reading "
                              "owned + ghost rows")]
    if not dg.overlap:
        tasks = tasks[:3] + [tasks[4], tasks[3], tasks[5]]
    dg.last_call = {"tasks": tasks, "order": order, "bytes_in": nbytes_in,
                    "bytes_out": nbytes_out, "interior_s": t2 - t1, "wait_s": waited,
                    "boundary_s": t3 - t2, "total_s": t3 - t0}


__all__ = ["run_distributed", "distributed_call", "Task", "launch", "propagate"]
