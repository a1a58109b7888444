"""runtime/distributed: run a program whose relation is a DistributedGraph.

The program is a Task walk like any other: the executor lowers it (and each loop body and cond
branch) once per binding, and the interpreter's loop runs the walk with this runtime's rules
(`_Rules`) for the equations that read a relation; this module has no loop over equations or
ops of its own. A propagate runs its halo plan (lower/passes/plan_halo_tasks over the rank's
share, which the call's binding holds: the executor's lowering gives it, ir("task") and
explain() print it) through the interpreter's loop with the halo handlers here. Grouped by
destination: the halo transfers post each peer's messages (the owned rows it reads packed and
sent, this rank's ghost rows received), the interior launches run the same compiled kernel as
one process on the rows that read no ghost, testing the transfers between launches, then the
boundary launch waits on the halo events and reads owned + ghost rows. Grouped by source (VJP
source cotangents): exchange, one launch over the local relation, then the result's ghost rows
go back to their owners, who add them. Other equations are local (row-wise tensor code); a
reduction over rows is this rank's part.
"""
from __future__ import annotations

import time

import numpy as np

from ...core.config import config
from ...core.errors import DistributedError, UnsupportedError
from ...core.eval import eval_program
from ...core.primitive import impl_rules
from ...core.prims.control import (
    branch_index,
    cond_p,
    repeat_p,
    run_cond,
    run_repeat,
    run_while,
    while_loop_p,
)
from ...core.prims.graph import degrees_p, edge_ids_p, propagate_p
from ...core.program import ClosedProgram, GraphProgram, Lit
from ...core.types import GraphType
from ..backends import Fallback
from ..backends.cpu.propagate import run_propagate
from ..caches.programs import memo
from ..calls.routes import plan
from ..interpreter import (
    JOIN,
    LAUNCH,
    RELEASE,
    TRANSFER,
    TaskWalk,
    held_kernel,
    interpret,
    run_walk,
)
from ..reports.runs import record
from .comm import mpi
from .exchange import ALIGN, HaloExchange, ReverseAdd, aligned_empty
from .graph import DistributedGraph, is_distributed
from .plan import exchanged, halo_plan

# what _Rules runs itself (the other primitives reading a relation are refused)
_OWN_RULES = frozenset({propagate_p, repeat_p, while_loop_p, cond_p, degrees_p, edge_ids_p})


def distributed_call(program: GraphProgram, args: list) -> bool:
    """The program reads a DistributedGraph: as an argument, or captured by the trace (a
    literal, also inside loop bodies). Memoised per program."""
    for a in args:     # (a loop, not any(): this runs on every warm call)
        if is_distributed(a):
            return True
    return bool(_facts(program)[0])


def _facts(program: GraphProgram) -> tuple:
    """(literal DistributedGraphs, primitives other than _OWN_RULES with a relation operand)
    of `program` and the programs in its parameters (the second: _Rules refuses them on a
    DistributedGraph), memoised per program."""
    entry = memo(program)
    found = entry.get("distributed_facts")
    if found is None:
        literals, readers = [], set()
        _scan(program, literals, readers)
        found = entry["distributed_facts"] = (tuple(literals),
                                              frozenset(readers - _OWN_RULES))
    return found


def _scan(program: GraphProgram, literals: list, readers: set) -> None:
    for e in program.eqns:
        literals += [a.value for a in e.inputs if isinstance(a, Lit) and is_distributed(a.value)]
        if any(isinstance(a.type, GraphType) for a in e.inputs):
            readers.add(e.primitive)
        for p in (q for v in e.params.values() for q in (v if isinstance(v, tuple) else (v,))):
            if isinstance(p, ClosedProgram):   # (a tuple: a cond's branches)
                literals += [c for c in p.consts if is_distributed(c)]
                _scan(p.program, literals, readers)


def run_distributed(program: GraphProgram, args: list, walks: dict, pages: dict, paged: dict,
                    held: dict) -> list:
    """Run `program` over its DistributedGraph(s) on this rank. The executor hands down
    `walks`: {id(program): its TaskWalk} for the program and its loop bodies and branches
    (a NoWalk: its stages do not express it, and eval_program runs the same rules),
    `pages`: {id(propagate): its halo plan, from the call's lowering} (loop bodies'
    propagates too), `paged`: the same for the page walks of a rank's paged local relation,
    `held`: {id(propagate): its Kernel op} for the propagates over a relation that is not
    distributed (the halo plans' launches hold their own)."""
    graphs = _graphs(list(args) + list(_facts(program)[0]))
    for dg in graphs:
        if dg.broken:
            raise DistributedError(f"rank {dg.comm.rank}: this DistributedGraph's exchange "
                                   f"failed earlier ({dg.broken}); partition again")
        _agree(dg, program, args)
    try:
        return _Rules(graphs[0], program, walks, pages, paged, held).run(program, list(args))
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
        elif e.primitive is cond_p:
            out.append(("cond", tuple(_structure(b.program) for b in p["branches"])))
    return tuple(out)


class _Rules:
    """The runtime's rules for a program over a DistributedGraph, in front of the impl rules
    its Task walk runs the other equations with: a propagate over a DistributedGraph runs
    its halo plan, one over a local relation its
    kernel; repeat / while_loop bodies run through these same rules, a while condition
    agreed across ranks; degrees and edge ids of a DistributedGraph are this rank's; any
    other equation reading a DistributedGraph is refused. Built per call (it holds the
    call's graph): nothing of a call is kept."""

    def __init__(self, dg: DistributedGraph, program: GraphProgram, walks: dict, pages: dict,
                 paged: dict, held: dict):
        self.dg, self.walks, self.pages, self.paged, self.held = dg, walks, pages, paged, held
        self.rules = {prim: _refuse for prim in _facts(program)[1]}
        self.rules.update({propagate_p: self.propagate, repeat_p: self.repeat,
                           while_loop_p: self.while_loop, cond_p: self.cond,
                           degrees_p: self.degrees,
                           edge_ids_p: self.edge_ids})

    def run(self, program: GraphProgram, args: list) -> list:
        walk = self.walks.get(id(program))
        if isinstance(walk, TaskWalk):
            return run_walk(walk, program, args, self.rules, launch=self.propagate)
        return eval_program(program, *args, overrides=self.rules)

    def call(self, closed, args: list) -> list:
        return self.run(closed.program, list(closed.consts) + list(args))

    def propagate(self, eqn, vals: list) -> list:
        if is_distributed(vals[0]):
            return propagate(eqn, vals[0], vals[1:], self.pages[id(eqn)],
                             self.paged.get(id(eqn)))
        return launch(eqn, vals[0], vals[1:], held=self.held.get(id(eqn)),
                      page=self.paged.get(id(eqn)))

    def repeat(self, eqn, vals: list) -> list:
        return run_repeat(self.call, vals, **eqn.params)

    def while_loop(self, eqn, vals: list) -> list:
        """The loop condition is agreed: every rank continues while any rank's does."""
        cond = eqn.params["cond"]

        def call(closed, args):
            outs = self.call(closed, args)
            if closed is cond:
                return [np.asarray(self.dg.comm.any(bool(outs[0]), "a while_loop condition"))]
            return outs
        return run_while(call, vals, **eqn.params)

    def cond(self, eqn, vals: list) -> list:
        """The branch is agreed as a while condition is: every rank runs the highest branch
        any rank selects (tg.cond: true where any rank's predicate is), so the halo
        exchanges inside it match."""
        k = branch_index(vals[0], len(eqn.params["branches"]))
        every = self.dg.comm.allgather_array(np.array([k], np.int64), "a cond index")
        return run_cond(self.call, [np.int64(every.max())] + list(vals[1:]), **eqn.params)

    @staticmethod
    def degrees(eqn, vals: list):
        return [vals[0].degrees(eqn.params["by"])] if is_distributed(vals[0]) else None

    @staticmethod
    def edge_ids(eqn, vals: list):
        if is_distributed(vals[0]):
            return [np.arange(vals[0].num_edges, dtype=np.int64)]   # local edge order
        return None


def _refuse(eqn, vals: list):
    """Any other equation that reads a relation: refused on a DistributedGraph, else its
    impl rule (None)."""
    if any(is_distributed(v) for v in vals):
        raise UnsupportedError(f"{eqn.primitive.name} on a DistributedGraph: only propagate "
                               "and degrees read a distributed relation",
                               hint="pass the global tg.Graph outside tg.distributed")
    return None


def launch(eqn, graph, values: list, outs: list | None = None, held=None,
           page=None) -> list:
    """The equation on one (local, concrete) relation: the compiled kernel (`held`: the
    Kernel op the plan's launch op holds; `page`: the one-page Task module a paged relation's
    pages unroll), else the reference interpreter (strict mode refuses that). The kernel
    writes into `outs` (row ranges of the whole result) when given and they fit; the caller
    copies otherwise."""
    if (graph.num_dst == 0 and eqn.params["reduce_by"] in ("dst", "edge") or
            graph.num_src == 0 and eqn.params["reduce_by"] == "src"):
        lead = 0
        return [np.zeros((lead,) + tuple(v.type.shape[1:]), v.type.dtype.np)
                for v in eqn.outputs]
    route = plan(eqn, graph, held=held, target="cpu-llvm")   # (a rank's kernels: host)
    if isinstance(route, Fallback):
        if config.strict:
            raise UnsupportedError(f"strict mode: a distributed propagate would fall back to "
                                   f"the reference interpreter: {route.reason}",
                                   hint="unset TIGA_STRICT / tg.config.strict")
        return impl_rules[propagate_p](graph, *values, **eqn.params)
    if hasattr(route, "bound"):     # (a paged plan: a paged partition's local relation)
        route = route.bound(page)
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


def propagate(eqn, dg: DistributedGraph, fields: list, plan, paged=None) -> list:
    """Walk the equation's halo plan (`plan`: its Task module, from the call's lowering) on
    this call's fields."""
    r = eqn.params["reducer"]
    if eqn.params["reduce_by"] == "src" and not (r.builtin and r.name == "sum"):
        raise UnsupportedError(f"a source-grouped {r.name} propagate over a "
                               "DistributedGraph: ghost rows can only be added back",
                               hint="use tg.sum() (VJP source cotangents are sums)")
    module, steps = halo_plan(eqn, plan)
    return _HaloHandlers(eqn, dg, fields, module, paged).run(steps)


class _HaloHandlers:
    """One call's handlers of a halo plan's ops, run by the interpreter's loop: halo
    transfers start a peer's messages of a HaloExchange (a ReverseAdd for a launch's
    result), launches wait on their events, run the kernel over their rows and test the
    transfers in flight (MPI progresses only inside MPI calls), writes store rows of the
    result, joins wait, releases drop an exchange."""

    def __init__(self, eqn, dg: DistributedGraph, fields: list, module, paged=None):
        self.eqn, self.dg, self.fields, self.module = eqn, dg, list(fields), module
        self.paged = paged      # the one-page module of a paged local relation's walk
        self.by = eqn.params["reduce_by"]
        self.position = {v.name: i - 1 for i, v in enumerate(module.body.args)}
        self.supply = exchanged(eqn)
        self.pending: dict = {}       # event name -> MPI requests not yet waited on
        self.moving: dict = {}        # value name -> its HaloExchange / ReverseAdd
        self.exchanges: list = []     # every HaloExchange of the call (for the byte counts)
        self.results: dict = {}       # launch result name -> (output index, array)
        self.outs = (_outputs(eqn, dg.plan.n_owned) if self.by == "dst" else
            [None] * len(eqn.outputs))
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

    def run(self, steps) -> list:
        """The plan's `steps` (op_steps of self.module) through the interpreter."""
        t0 = time.perf_counter()
        interpret(steps, {TRANSFER: self.transfer, LAUNCH: self.launch, JOIN: self.join,
                          RELEASE: self.release})
        self._record(time.perf_counter() - t0)
        return self.outs

    def join(self, op) -> None:
        self.wait(op.deps)

    def release(self, op) -> None:
        self.moving.pop(op.value.name, None)

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
        got = launch(self.eqn, graph, fields, into, held_kernel(op), self.paged)
        self.seconds["boundary" if op.task_kind == "boundary" else "interior"] += (
            time.perf_counter() - t0)
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
            ex = (self.moving.get(self.module.body.args[1 + self.supply[i]].name)
                if i in self.supply else None)
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
