"""runtime: explain() for a program: route per propagate, traversal, schedule, bytes, cache.

Nothing is compiled or run here: a propagate's support is decided by generating its code
(cheap), and the cache is only looked up. The IR it reads (the call's bound Task walk, the
Kernel ops its propagates hold, the bound page plans) is handed down by the executor, which
lowered it under explain's quiet dumps: nothing here lowers.
"""
from __future__ import annotations

import numpy as np

from ...core.prims.control import cond_p, repeat_p, while_loop_p
from ...core.prims.graph import propagate_p
from ...core.program import GraphProgram, Lit
from ...core.types import GraphType
from ...lower.backends import selected_backend, targets_triton
from ..backends import Fallback, backend_for
from ..backends.cpu.generated import GeneratedType, generated_relations
from ..backends.cpu.propagate import chunk_row_ptr, launch_op, staging_candidates
from ..backends.triton.launch import relabel_routes
from ..backends.walk_tables import chunks_of
from ..interpreter import describe_walk
from ..paging.plan import describe_plan
from ..paging.resident import RESIDENT_KINDS
from ..paging.run import call_plan, describe_stats, plan_paged
from ..reports.explain import Explanation, launch_facts, schedule_line
from ..reports.runs import measured
from .binding import call_target
from .threads import num_threads

WALK = {"dst": "destination rows walk their CSR edges",
        "src": "source rows walk the transposed CSR (built once per relation and cached; "
               "no atomics)",
        "edge": "destination rows walk their CSR edges; each message is stored at its edge id",
        "all": "one state folds every edge (a sum without update: one partial state per "
               "row chunk, chunks shared by the threads, partials added once; other "
               "reducers: a single call over all rows)"}

VJP_ROUTE = ("the VJP program is lowered the same way: source cotangents are a propagate "
             "grouped by source (dense, triangular, cu_seqlens and stencil relations walk "
             "their transpose natively, as the forward walks them: no CSR, no index arrays; "
             "stored relations are compiled over the transposed CSR, sized by the edges where "
             "sources are sparse; over a symmetric radius relation the fused cell walk with "
             "roles swapped), edge cotangents per edge, parameter cotangents one fold over all "
             "edges")


def plan(eqn, graph, *, compile: bool = True, held=None, target: str | None = None):
    """The route of one propagate over `graph`: by pages where the relation is stored (on
    every target), else the plan of the backend of the call's target (`target`: default the
    selected backend's) binding `held`, the Kernel op handed down for it; a Fallback naming
    why the reference interpreter runs it (`graph` None: decided from the relation's type;
    compile=False: nothing is compiled, as explain() before a call)."""
    paged = plan_paged(eqn, graph)
    if paged is not None:
        return paged
    return backend_for(target or call_target()).plan(eqn, graph, compile=compile, held=held)


def describe_program(program: GraphProgram, args: list, cache, walk, pages: dict,
                     held: dict) -> Explanation:
    """What a call of `program` on `args` runs (`walk`: the call's Task walk, as the executor
    binds it: its launches hold the Kernel ops the kernels render, loop bodies are bound when
    they run; `pages`: {id(propagate): its PagedPlan, bound
    by the executor} for the propagates over a stored relation; `held`: {id(propagate): the
    Kernel op it binds}, loop bodies too: what the executor hands down)."""
    given = {id(v): a for v, a in zip(program.in_binders, args)}
    ex = Explanation(route="reference", backend="numpy reference interpreter", reason="",
                     program=str(program))
    compiled = fallen = 0
    for eqn, graph, where in propagates_of(program, args):
        found = pages.get(id(eqn)) or plan(eqn, graph, compile=False, held=held.get(id(eqn)))
        if getattr(found, "lazy_fields", False):    # paged: its plan reads the fields' tiers
            compiled += 1
            found.describe(ex, eqn, graph, where, [given.get(id(a)) for a in eqn.inputs[1:]])
        elif hasattr(found, "describe"):
            compiled += 1
            found.describe(ex, eqn, graph, where)
        elif isinstance(found, Fallback):
            fallen += 1
            typed = isinstance(graph, GeneratedType)   # edge count known only at the call
            _explain_reference(ex, eqn, None if typed else graph, found.reason, where)
        else:
            compiled += 1
            typed = isinstance(graph, GeneratedType)   # concrete only at the call
            _explain_compiled(ex, eqn, None if typed else graph, cache.status(found), where,
                              held.get(id(eqn)))
            last = (measured("paged", graph)
                    if getattr(graph, "kind", None) in RESIDENT_KINDS else None)
            if last is not None:
                ex.traversal.append(f"{where}paged when the call's disk-tier fields and "
                                    "result exceed the host budget (resident_pages); "
                                    + describe_stats(last))
            if typed:
                ex.materialized.append((
                    f"CSR of the {graph.kind} relation generated in the program"
                    + (" and its transpose" if eqn.params["reduce_by"] == "src" else ""),
                    0, "resolved at the call (this propagate needs edge ids or is "
                    "asymmetric and grouped by source: transposed where needed); size "
                    "known then"))
    others = sorted({e.primitive.name for e in program.eqns
                     if e.primitive not in (propagate_p, repeat_p, while_loop_p, cond_p)})
    loops = sorted({e.primitive.name for e in program.eqns
                    if e.primitive in (repeat_p, while_loop_p, cond_p)})
    _summarise(ex, compiled, fallen, others)
    relabel_routes(ex)
    if loops:
        ex.reason += (f"; {', '.join(loops)} steps run in the executor, so the propagates in "
                      "their bodies take the routes listed")
    ex.estimated_bytes = sum(b for _, b, _ in ex.materialized)
    paged = call_plan(program, args, pages)   # one paged propagate: its plan is the Task IR
    ex.tasks = describe_plan(paged) if paged is not None else describe_walk(walk)
    ex.vjp_route = VJP_ROUTE
    stats = cache.stats.as_dict()
    ex.cache = "; ".join(ex.cache_lines) + (f" | process totals {stats}" if ex.cache_lines
                                            else f"process totals {stats}")
    return ex


def propagates_of(program: GraphProgram, args: list):
    """(eqn, its relation: concrete, a GeneratedType or None, location) for every propagate of
    a call of `program` on `args`, loop bodies too."""
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    known.update(generated_relations(program))   # radius/knn generated in the program
    return _propagates(program, known, "")


def paged_propagates(program: GraphProgram, args: list) -> list:
    """(eqn, its relation) for the propagates (loop bodies too) a call of `program` on `args`
    runs over a stored relation: the ones whose bound page plan its explanation prints."""
    return [(e, g) for e, g, _ in propagates_of(program, args)
            if getattr(g, "kind", None) == "paged"]


def _propagates(program: GraphProgram, graphs: dict, where: str):
    """(eqn, concrete relation or None, location) for every propagate, loop bodies too."""
    for eqn in program.eqns:
        if eqn.primitive is propagate_p:
            yield eqn, _graph_of(eqn.inputs[0], graphs), where
            continue
        for label, closed, inner in _bodies(eqn, graphs):
            yield from _propagates(closed.program, inner, f"{where}{label}: ")


def bodies_with_relations(program: GraphProgram, args: list):
    """(ClosedProgram, its arguments with the relation values the call hands it, None for
    the others) for every loop body and cond branch of a call of `program` on `args`,
    nested ones too: what a body's binding is decided from before it runs."""
    known = {id(v): a for v, a in zip(program.in_binders, args) if isinstance(v.type, GraphType)}
    yield from _bodies_of(program, known)


def _bodies_of(program: GraphProgram, graphs: dict):
    for eqn in program.eqns:
        for _, closed, inner in _bodies(eqn, graphs):
            binders = closed.program.in_binders[len(closed.consts):]
            yield closed, list(closed.consts) + [inner.get(id(v)) for v in binders]
            yield from _bodies_of(closed.program, inner)


def _graph_of(a, graphs: dict):
    return a.value if isinstance(a, Lit) else graphs.get(id(a))


def _bodies(eqn, graphs: dict):
    """(label, ClosedProgram, {id(binder): relation value} of its relation binders) for the
    bodies and branches of a loop or cond equation (none for other equations)."""
    p = eqn.params
    if eqn.primitive is repeat_p:
        bodies = [("repeat body", p["body"], list(eqn.inputs))]
    elif eqn.primitive is while_loop_p:
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        carry = list(eqn.inputs[nc + nb:])
        bodies = [("while cond", p["cond"], list(eqn.inputs[:nc]) + carry),
                  ("while body", p["body"], list(eqn.inputs[nc:nc + nb]) + carry)]
    elif eqn.primitive is cond_p:
        bodies = [(f"cond branch {k}", b, list(eqn.inputs[1:]))
                  for k, b in enumerate(p["branches"])]
    else:
        return
    for label, closed, operands in bodies:
        binders = closed.program.in_binders[len(closed.consts):]
        inner = {id(v): _graph_of(a, graphs) for v, a in zip(binders, operands)
                 if isinstance(v.type, GraphType)}
        inner.update((id(v), c) for v, c in zip(closed.program.in_binders, closed.consts)
                     if isinstance(v.type, GraphType))
        inner.update(generated_relations(closed.program))
        yield label, closed, inner


def _summarise(ex, compiled, fallen, others) -> None:
    if compiled and not fallen:
        ex.route = "cpu-llvm"
        ex.backend = "fused LLVM kernels (llvmlite codegen, native shared objects)"
        ex.reason = f"all {compiled} propagate(s) compile"
    elif compiled:
        ex.route, ex.backend = "mixed", "cpu-llvm + numpy reference interpreter"
        ex.reason = f"{compiled} propagate(s) compile, {fallen} fall back (see routes)"
    elif fallen:
        ex.reason = f"{fallen} propagate(s) fall back to the reference interpreter (see routes)"
    else:
        ex.reason = "the program has no propagate"
    tiled = ([o for o in others if o == "dot_general"]
             if targets_triton(selected_backend()) else [])
    rest = [o for o in others if o not in tiled]
    if rest:
        ex.reason += f"; other equations ({', '.join(rest)}) run on the numpy impl rules"
    if tiled:   # (backends/triton/linear.dot_rule, the executor's override)
        ex.reason += ("; dot_general runs as the Triton backend's tile_matmul (tl.dot tiles) "
                      "where its operands are 2-D float arrays the backend reads, else on "
                      "numpy")


def _explain_compiled(ex, eqn, graph, status: str, where: str, held=None) -> None:
    p = eqn.params
    kind = graph.kind if graph is not None else eqn.inputs[0].type.kind
    op = launch_op(eqn, graph, held)   # the scheduled Kernel IR it renders and runs by
    ex.routes.append((op.schedule.target if op is not None else "cpu-llvm",
                      f"{where}propagate[{p['reducer'].pp_param()}] by {p['reduce_by']}",
                      "compiles"))
    native = _native_walk(graph, p["reduce_by"])
    walk = WALK[p["reduce_by"]]
    if native is not None and p["reduce_by"] == "src":
        walk = f"source rows walk the {NATIVE_T[native]}"
    elif native is not None:
        walk = walk.replace("walk their CSR edges", f"walk the {NATIVE[native]}")
    facts = f"{launch_facts(op)}: " if op is not None else ""
    ex.traversal.append(f"propagate[{p['reducer'].pp_param()}] over {kind} relation, grouped "
                        f"by {p['reduce_by']}: {facts}{walk}")
    ex.schedule = _schedule(graph, p["reduce_by"], op)
    _explain_row_buffers(ex, p["edge_fn"])
    if graph is not None and kind not in ("csr", "cat") and native is None:
        ex.materialized.append(("CSR of the implicit relation",
                                8 * (graph.num_dst + 1) + graph.index_dtype.itemsize
                                * graph.num_edges, "the kernel walks resolved CSR"))
    elif kind == "cat":
        ex.materialized.append(("CSR of the cat relation", 8 * (graph.num_dst + 1)
                                + graph.index_dtype.itemsize * graph.num_edges,
                                "built by Graph.cat; the kernel walks it (compressed-row)"))
    if graph is not None and native is None:
        for name, nbytes in staging_candidates(eqn, graph):
            ex.materialized.append((
                f"64-byte aligned copy of {name}", nbytes,
                "only when the array starts mid cache line (rows gathered at random then "
                "touch an extra line); made per call into scratch kept between calls, "
                "skipped with several threads when it fits in one core's L2 (2 MiB)"))
    if graph is not None and p["reduce_by"] == "src":
        _explain_transpose(ex, graph, native)
    ex.cache_lines.append({"memory": "hit (memory)", "disk": "hit (disk cache, no LLVM run)",
                           "miss": "miss (compiled on the first call)"}[status])


def _explain_transpose(ex, graph, native) -> None:
    """The transposed CSR a walk by source stores (none for the implicit kinds)."""
    if native == "csr_rows":
        ex.materialized.append((
            "transposed CSR + permutation over the sources with edges",
            16 * graph.num_edges + 8 + (8 + graph.index_dtype.itemsize) * graph.num_edges,
            "at most; sources are sparse, so every array is sized by the edges (rows are "
            "found by a cursor into the source ids); cached on the relation"))
    elif native is None:
        ex.materialized.append(("transposed CSR + permutation",
                                8 * (graph.num_src + 1) + (8 + graph.index_dtype.itemsize)
                                * graph.num_edges, "cached on the relation; built once"))


def _explain_row_buffers(ex, edge_fn) -> None:
    """Row buffers past the kernel's stack budget live in a heap block (lower/llvm/emitter)."""
    from ...lower.llvm.emitter import STACK_BUDGET, row_value_bytes

    nbytes = row_value_bytes(edge_fn)
    if nbytes > STACK_BUDGET:
        ex.materialized.append((
            "edge-function row buffers past the stack budget", nbytes - STACK_BUDGET,
            f"at most; the edge function's row values take up to {nbytes} bytes, over the "
            f"{STACK_BUDGET}-byte stack budget per kernel: the rest live in one heap block "
            "each kernel call mallocs and frees (per thread), so the thread stack never "
            "overflows"))


NATIVE = {"dense": "dense coordinate hierarchy natively (row r owns edges [r*S, (r+1)*S), "
                   "sources 0..S-1; no index arrays)",
          "triangular": "triangular coordinate hierarchy natively (row r reads sources "
                        "0..r, edges from r(r+1)/2; no index arrays)",
          "cu_seqlens": "cu-seqlens coordinate hierarchy natively (sequence found by binary "
                        "search over cu_seqlens; no per-edge index arrays)",
          "stencil": "stencil coordinate hierarchy natively (lattice coordinates plus static "
                     "offsets give each neighbour; no column index array)"}

# walks by source (lower/llvm/walks_transposed.py): the transpose computed, not stored
NATIVE_T = {"dense": "transpose of dense(S, D), dense(D, S), natively (source r is read by "
                     "every destination d, edge d*S + r; no CSR, no index arrays)",
            "triangular": "transposed triangular relation natively, an upper triangular "
                          "walk (source r is read by destinations r..n-1, edge d(d+1)/2 + r; "
                          "no CSR, no index arrays)",
            "cu_seqlens": "cu-seqlens blocks natively with src and dst swapped (sequence by "
                          "binary search; source r is read by r..the sequence end (causal) "
                          "or the whole sequence; no per-edge index arrays)",
            "stencil": "stencil with negated offsets natively (destination p = r - offset, "
                       "outside points skipped or wrapped; edge ids computed from the "
                       "lattice; no index arrays)",
            "csr_rows": "transposed CSR stored over the sources that have edges only (a "
                        "cursor into their sorted ids finds each row; every array sized by "
                        "the edges, not by num_src)"}


def _native_walk(graph, reduce_by: str):
    """The implicit kind the kernel walks without CSR (by source too), "csr_rows" (a
    transposed CSR over the sources with edges), or None (compressed rows)."""
    if graph is None:
        return None
    from ...lower.abi import relation_descriptor

    kind = relation_descriptor(graph, "src" if reduce_by == "src" else "dst",
                               target="cpu-llvm")[0]
    kind = kind[:-2] if kind.endswith("_t") else kind
    return None if kind == "csr" else kind


def _schedule(graph, reduce_by: str, op) -> str:
    """The launch's schedule attributes, and the row chunks they cut this relation into."""
    if op is None:   # an equation the IR stages do not express: the kernel's own defaults
        return ("cpu-llvm fused kernel (not lowered through the Kernel IR: the renderer's "
                f"default schedule); row chunks on {num_threads()} thread(s)")
    line = schedule_line(op)
    s = op.schedule
    if s.parallel == "single":
        return line + "; one call over all rows"
    if graph is None:
        return line + "; row chunks cut per relation at the call"
    graph.ensure_valid()
    chunks = chunks_of(chunk_row_ptr(graph, reduce_by), s.threads, s.row_partition,
                       s.chunks_per_thread)
    if len(chunks) <= 1:
        return line + ("; 1 row chunk of this relation (below the parallel threshold or one "
                       "thread: one call on the caller's thread)")
    what = ("partial states added once" if s.parallel == "partial_sums" else
            "claimed by each thread inside native code")
    return line + f"; {len(chunks)} row chunks of this relation, {what}"


def _explain_reference(ex, eqn, graph, reason: str, where: str) -> None:
    p = eqn.params
    kind = graph.kind if graph is not None else eqn.inputs[0].type.kind
    ex.routes.append(("reference",
                      f"{where}propagate[{p['reducer'].pp_param()}] by {p['reduce_by']}",
                      reason))
    ex.traversal.append(f"propagate[{p['reducer'].pp_param()}] over {kind} relation, grouped "
                        f"by {p['reduce_by']}, visiting every edge in edge order (reference)")
    if graph is not None:
        ex.materialized.append((f"({graph.num_edges}, ...) message arrays",
                                _message_bytes(eqn, graph), "the interpreter gathers fields "
                                "per edge and evaluates the edge function on whole arrays"))


def _message_bytes(eqn, graph) -> int:
    out = 0
    for t in eqn.params["edge_fn"].out_types:
        n = int(np.prod([d for d in t.shape])) if t.shape else 1
        out += n * t.dtype.itemsize * graph.num_edges
    return out
