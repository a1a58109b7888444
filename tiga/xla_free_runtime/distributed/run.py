"""runtime/distributed: run a program whose relation is a DistributedGraph.

A propagate runs its Task-IR plan (plan.py: built once per equation and graph, kept on the
graph, printed by explain()): this module walks its ops. Grouped by destination: the halo
transfers post each peer's messages (the owned rows it reads packed and sent, this rank's
ghost rows received), the interior launches run the same compiled kernel as one process on
the rows that read no ghost, testing the transfers between launches, then the boundary
launch waits on the halo events and reads owned + ghost rows. Grouped by source (VJP source
cotangents): exchange, one launch over the local relation, then the result's ghost rows go
back to their owners, who add them. Other equations are local (row-wise tensor code); a
reduction over rows is this rank's part.
"""
from __future__ import annotations

import time
import weakref

import numpy as np

from ...core.config import config
from ...core.errors import DistributedError, UnsupportedError
from ...core.primitive import impl_rules
from ...core.prims.control import repeat_p, run_repeat, run_while, while_loop_p
from ...core.prims.graph import degrees_p, edge_ids_p, propagate_p
from ...core.program import ClosedProgram, GraphProgram, Lit
from ...lower.ir.task import JoinOp, ReleaseOp, TaskLaunchOp, TransferOp
from ..backend_table import plan_cpu as plan_propagate  # (the cpu-llvm route table)
from ..backends.cpu.propagate import Fallback, run_propagate
from ..run_report import record
from .comm import mpi
from .exchange import ALIGN, HaloExchange, ReverseAdd, aligned_empty
from .graph import DistributedGraph, is_distributed
from .plan import exchanged, task_module

_LITS: dict = {}     # id(program) -> (weak program, whether a literal is distributed)


def distributed_call(program: GraphProgram, args: list) -> bool:
    """The program reads a DistributedGraph: as an argument, or captured by the trace (a
    literal, also inside loop bodies). Memoised per program."""
    for a in args:     # (a loop, not any(): this runs on every warm call)
        if is_distributed(a):
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


def run_distributed(program: GraphProgram, args: list, lower) -> list:
    """Run `program` over its DistributedGraph(s) on this rank; `lower`: the executor's
    Lowering (the one-page Task module the halo plans unroll, the kernels' launches)."""
    graphs = _graphs(list(args) + _literal_graphs(program))
    for dg in graphs:
        if dg.broken:
            raise DistributedError(f"rank {dg.comm.rank}: this DistributedGraph's exchange "
                                   f"failed earlier ({dg.broken}); partition again")
        _agree(dg, program, args)
    try:
        return _Runner(graphs[0], lower).run(program, list(args))
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
    def __init__(self, dg: DistributedGraph, lower):
        self.dg, self.lower = dg, lower

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
                return propagate(eqn, vals[0], vals[1:], self.lower)
            return launch(eqn, vals[0], vals[1:], self.lower)
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


def launch(eqn, graph, values: list, lower, outs: list | None = None) -> list:
    """The equation on one (local, concrete) relation: the compiled kernel, else the
    reference interpreter (strict mode refuses that). The kernel writes into `outs` (row
    ranges of the whole result) when given and they fit; the caller copies otherwise."""
    if graph.num_dst == 0 and eqn.params["reduce_by"] in ("dst", "edge") or \
            graph.num_src == 0 and eqn.params["reduce_by"] == "src":
        lead = 0
        return [np.zeros((lead,) + tuple(v.type.shape[1:]), v.type.dtype.np)
                for v in eqn.outputs]
    route = plan_propagate(eqn, graph, lower=lower)
    if isinstance(route, Fallback):
        if config.strict:
            raise UnsupportedError(f"strict mode: a distributed propagate would fall back to "
                                   f"the reference interpreter: {route.reason}",
                                   hint="unset TIGA_STRICT / tg.config.strict")
        return impl_rules[propagate_p](graph, *values, **eqn.params)
    got = run_propagate(route, eqn, graph, values, outs)
    if graph.kind == "paged":       # a paged partition's results: tensors, on host or disk
        return [np.asarray(g) for g in got]
    return got


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


def propagate(eqn, dg: DistributedGraph, fields: list, lower) -> list:
    """Walk the equation's Task-IR plan (plan.py) on this call's fields."""
    r = eqn.params["reducer"]
    if eqn.params["reduce_by"] == "src" and not (r.builtin and r.name == "sum"):
        raise UnsupportedError(f"a source-grouped {r.name} propagate over a "
                               "DistributedGraph: ghost rows can only be added back",
                               hint="use tg.sum() (VJP source cotangents are sums)")
    return _Walk(eqn, dg, fields, task_module(eqn, dg, lower), lower).run()


class _Walk:
    """One call's interpretation of a plan: halo transfers start a peer's messages of a
    HaloExchange (a ReverseAdd for a launch's result), launches wait on their events, run
    the kernel over their rows and test the transfers in flight (MPI progresses only
    inside MPI calls), writes store rows of the result, joins wait."""

    def __init__(self, eqn, dg: DistributedGraph, fields: list, module, lower):
        self.eqn, self.dg, self.fields, self.module = eqn, dg, list(fields), module
        self.lower = lower
        self.by = eqn.params["reduce_by"]
        self.position = {v.name: i - 1 for i, v in enumerate(module.body.args)}
        self.supply = exchanged(eqn)
        self.pending: dict = {}       # event name -> MPI requests not yet waited on
        self.moving: dict = {}        # value name -> its HaloExchange / ReverseAdd
        self.exchanges: list = []     # every HaloExchange of the call (for the byte counts)
        self.results: dict = {}       # launch result name -> (output index, array)
        self.outs = _outputs(eqn, dg.plan.n_owned) if self.by == "dst" else \
            [None] * len(eqn.outputs)
        self.seconds = {"interior": 0.0, "boundary": 0.0, "wait": 0.0}
        p = dg.plan
        self.pieces = {rows: (g, False) for rows, g in dg.interior_chunks}
        self.pieces[(p.n_interior, p.n_owned)] = (dg.boundary, True)
        self.compact = self._compact()

    def _compact(self):
        """dg.compact when this call's boundary launch can read the compact buffers: a
        stored relation grouped by destination whose exchanged fields are all aligned and
        contiguous (the interior launches read them as given); else None."""
        dg = self.dg
        if self.by != "dst" or dg.kind != "csr" or dg.compact is None:
            return None
        xs = [np.asarray(self.fields[i]) for i in set(self.supply.values())]
        ok = all(x.flags.c_contiguous and not x.ctypes.data % ALIGN for x in xs)
        return dg.compact if xs and ok else None

    def run(self) -> list:
        t0 = time.perf_counter()
        for op in self.module.body.ops:
            if isinstance(op, TransferOp):
                self.transfer(op)
            elif isinstance(op, TaskLaunchOp):
                self.launch(op)
            elif isinstance(op, JoinOp):
                self.wait(op.deps)
            elif isinstance(op, ReleaseOp):
                self.moving.pop(op.value.name, None)
        self._record(time.perf_counter() - t0)
        return self.outs

    def wait(self, events) -> None:
        reqs = [r for e in events for r in self.pending.pop(e.name, ())]
        if reqs:
            t0 = time.perf_counter()
            self.dg.comm.wait(reqs, "the halo exchange")
            self.seconds["wait"] += time.perf_counter() - t0

    def transfer(self, op) -> None:
        name = op.value.name
        if op.kind == "halo":
            mover = self.moving.get(name)
            if mover is None:
                if name in self.results:        # a result's ghost rows go back home
                    self.wait(op.deps)
                    mover = ReverseAdd(self.dg, self.results[name][1])
                else:
                    mover = HaloExchange(self.dg, self.fields[self.position[name]],
                                         start=False, compact=None if self.compact is None
                                         else self.compact[0])
                    self.exchanges.append(mover)
                self.moving[name] = mover
            self.pending[op.event.name] = mover.start(op.peer)
            return
        self.wait(op.deps)
        j, got = self.results[name]
        if op.kind == "accumulate":             # the peers' contributions added on
            mover = self.moving.pop(name, None) or ReverseAdd(self.dg, got)   # no peers
            self.outs[j] = mover.finish()
        elif self.by == "dst":
            _into([self.outs[j]], op.rows[0], op.rows[1], [got])
        else:
            self.outs[j] = got

    def launch(self, op) -> None:
        self.wait(op.deps)
        p = self.dg.plan
        a, b = op.page_rows
        if self.by == "dst":
            graph, ghosts = self.pieces[(a, b)]
            compact = ghosts and self.compact is not None and bool(self.exchanges)
            if compact:         # the boundary rows over their owned sources + the ghosts
                graph = self.compact[1]
            fields = _rows(self.eqn, self._sources(ghosts, graph.num_src if compact else None),
                           (a, b), (int(p.row_ptr[a]), int(p.row_ptr[b])))
            into = [o[a:b] for o in self.outs]
        else:
            graph, fields, into = self.dg.full, self._sources(True), None
        t0 = time.perf_counter()
        got = launch(self.eqn, graph, fields, self.lower, into)
        self.seconds["boundary" if op.task_kind == "boundary" else "interior"] += \
            time.perf_counter() - t0
        for j, (v, g) in enumerate(zip(op.results[:-1], got)):
            self.results[v.name] = (j, g)
        for mover in self.moving.values():      # drive MPI's progress
            if mover.requests:
                mpi().Request.Testall(mover.requests)

    def _sources(self, ghosts: bool, rows: int | None = None) -> list:
        """The field operands; source fields over owned (+ ghost) rows: an exchanged one
        from its buffer, a read one without peers as it is (no ghost rows), an unread one
        over owned + ghost rows (`rows` of them for the compact boundary relation)
        uninitialised (never read)."""
        out = list(self.fields)
        n = rows if rows is not None else self.dg.plan.n_owned + self.dg.plan.n_ghost
        for i, role in enumerate(self.eqn.params["roles"]):
            if role != "src":
                continue
            ex = self.moving.get(self.module.body.args[1 + self.supply[i]].name) \
                if i in self.supply else None
            if ex is not None:
                out[i] = ex.extended() if ghosts else ex.owned()
            elif ghosts and i not in self.supply:
                x = np.asarray(out[i])
                out[i] = np.empty((n,) + x.shape[1:], x.dtype)
        return out

    def _record(self, total: float) -> None:
        live = self.exchanges
        last = {"module": self.module, "reduce_by": self.by}
        if self.by == "dst":
            s = self.seconds
            last.update(order="overlapped" if self.dg.overlap else "communicate-then-compute",
                        bytes_in=sum(ex.bytes_in for ex in live),
                        bytes_out=sum(ex.bytes_out for ex in live),
                        interior_s=s["interior"], wait_s=s["wait"], boundary_s=s["boundary"],
                        total_s=total)
        record("halo", self.dg, last)


def _outputs(eqn, rows: int) -> list:
    """The whole results (owned rows), written a row range per launch: no concatenation."""
    return [aligned_empty((rows,) + tuple(int(d) for d in v.type.shape[1:]), v.type.dtype.np)
            for v in eqn.outputs]


def _into(outs: list, a: int, b: int, got: list) -> None:
    """Rows [a, b) of the results from a launch (a copy unless it wrote them in place)."""
    for o, g in zip(outs, got):
        rows = o[a:b]
        if not (isinstance(g, np.ndarray) and g.shape == rows.shape and
                g.ctypes.data == rows.ctypes.data):
            rows[...] = np.asarray(g).reshape(rows.shape)


__all__ = ["run_distributed", "distributed_call", "launch", "propagate"]
