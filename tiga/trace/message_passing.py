"""trace: tg.propagate and tg.MessagePassing: stage edge/update functions into propagate."""
from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from ..core.errors import FieldError, ShapeError, TigaError, UnsupportedError
from ..core.graph import Graph
from ..core.prims.graph import propagate_p, role_size, row_type
from ..core.program import ClosedProgram, GraphProgram, Var
from ..core.reducers import Reducer, ReducerMessage
from ..core.reducers import sum as sum_reducer
from ..core.types import GraphType
from . import generated
from .call_checks import (
    check_edge_output,
    check_fields,
    check_keywords,
    check_operand,
    checked_region,
    field_dict,
)
from .staging import leaf_aval, leaf_value, trace_flat
from .tracer import Tracer, bind, current_builder

ROLE_ORDER = ("src", "dst", "edge")
# the hidden field holding the ids an arg-reducer returns (source ids or edge ids)
ARG_ID = "_tg_arg_id"

# The runtime registers how concrete (non-traced) calls execute; trace cannot import it.
hooks: dict[str, Callable | None] = {"execute": None, "explain": None, "reference": None,
                                     "ir": None, "compiled": None, "warm": None}


def _compiling() -> bool:
    """Replaced by the runtime: whether torch.compile (Dynamo) is tracing this call."""
    return False


hooks["compiling"] = _compiling


class FieldView:
    """`src.x`, `dst.h`, `edge.w`: the rows of one role's fields seen by one edge."""

    def __init__(self, role: str, fields: dict, lazy: dict | None = None):
        object.__setattr__(self, "_role", role)
        object.__setattr__(self, "_fields", fields)
        # computed attributes (edge.displacement / edge.distance of generated relations)
        object.__setattr__(self, "_lazy", lazy or {})

    def __getattr__(self, name: str):
        fields = object.__getattribute__(self, "_fields")
        if name in fields:
            return fields[name]
        lazy = object.__getattribute__(self, "_lazy")
        if name in lazy:
            return lazy[name]()
        if name.startswith("__"):
            raise AttributeError(name)
        role = object.__getattribute__(self, "_role")
        have = ", ".join(sorted(fields)) or "none"
        raise FieldError(f"{role}.{name}: no {role} field named {name!r}; available {role} "
                         f"fields: {have} (pass it as {role}={{'{name}': array}})")

    __getitem__ = __getattr__

    def __setattr__(self, name, value):
        raise TigaError("field views are read-only inside edge and update functions")

    def __contains__(self, name) -> bool:
        return name in object.__getattribute__(self, "_fields")


def _accepted(fn: Callable, params: dict) -> dict:
    """Pass a function only the keyword parameters its signature takes."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return params
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return params
    return {k: v for k, v in params.items() if k in sig.parameters}


class PropagateCall:
    """One message-passing call: relation, fields by role, reducer, functions, params."""

    def __init__(self, graph, edge_fn, reducer, src, dst, edge, update, params,
                 reduce_by="dst"):
        if not isinstance(reducer, Reducer):
            raise TigaError(f"reducer: expected a tg.Reducer such as tg.sum(), found "
                            f"{reducer!r}")
        if not callable(edge_fn):
            raise TigaError(f"edge function: expected a callable, found {edge_fn!r}")
        self.graph, self.edge_fn, self.reducer = graph, edge_fn, reducer
        self.update, self.reduce_by = update, reduce_by
        self.fields = {"src": field_dict("src", src), "dst": field_dict("dst", dst),
                       "edge": field_dict("edge", edge)}
        # the MessagePassing layer making the call (MessagePassing._call), and the call
        # cache's (guards, generation) of the entry it ran (call_cache.staged_program)
        self.layer, self.cached = None, None
        hidden = generated.hidden_fields(graph)
        # the fields are the caller's as given: no hidden operand added, none reshaped below
        self.plain = hidden is None and not reducer.is_arg
        if hidden is not None:   # a generated relation: its coordinates are field operands
            for role, extra in hidden.items():
                self.fields[role].update(extra)
        if reducer.is_arg:
            self.fields[reducer.of][ARG_ID] = _arg_ids(graph, reducer)
        self.params = dict(params)
        self.lattice = _flatten_lattice_fields(graph, self.fields)
        for role, fields in self.fields.items():
            check_fields(role, fields)
        for name, value in self.params.items():
            check_operand(name, value)

    def restore_lattice(self, out):
        """Rows of a stencil result back in lattice shape when its fields came in it."""
        if self.lattice is None:
            return out
        if isinstance(out, tuple):
            return tuple(self.restore_lattice(o) for o in out)
        shape = tuple(out.shape)
        if not shape or shape[0] != self.graph.num_dst:
            return out
        return out.reshape(self.lattice + shape[1:])

    def field_items(self) -> list[tuple[str, str, object]]:
        return [(role, name, self.fields[role][name])
                for role in ROLE_ORDER for name in sorted(self.fields[role])]

    def param_items(self) -> list[tuple[str, object]]:
        return sorted(self.params.items())

    def values(self) -> list:
        return ([self.graph] + [v for _, _, v in self.field_items()]
                + [v for _, v in self.param_items()])

    def is_traced(self) -> bool:
        return current_builder() is not None and any(
            isinstance(v, Tracer) for v in self.values())

    def check_sizes(self, gtype: GraphType) -> None:
        for role, name, value in self.field_items():
            t = leaf_aval(value)
            want = role_size(gtype, role)
            if t.ndim == 0 or t.shape[0] != want:
                lattice = ""
                if getattr(self.graph, "kind", None) == "stencil" and role != "edge":
                    lattice = f" or leading axes {tuple(self.graph.params['shape'])} (lattice)"
                raise ShapeError(f"{role}.{name}: {role} fields need a leading axis of "
                                 f"{want} ({role} entities of the relation){lattice}, found "
                                 f"shape {tuple(t.shape)}")

    def stage(self, graph, fields: list, params: list):
        """Bind one propagate equation on (possibly traced) operands; returns outputs."""
        gtype = graph.aval if isinstance(graph, Tracer) else graph.type()
        if not isinstance(gtype, GraphType):
            raise TigaError(f"graph: expected a tg.Graph, found {gtype}")
        items = self.field_items()
        ftypes = [leaf_aval(v) for v in fields]
        for (role, name, _), t in zip(items, ftypes):
            want = role_size(gtype, role)
            if t.ndim == 0 or t.shape[0] != want:
                raise ShapeError(f"{role}.{name}: {role} fields need a leading axis of "
                                 f"{want}, found shape {t}")
        rows = [row_type(t) for t in ftypes]
        ptypes = [leaf_aval(v) for v in params]
        edge_prog, edge_caps, n_out = self._trace_edge(items, rows, ptypes)
        update_prog, upd_caps, reducer = None, [], self._traced_reducer(edge_prog)
        if self.update is not None:
            update_prog, upd_caps = self._trace_update(items, rows, ptypes, edge_prog, reducer,
                                                      n_out)
        n_fixed = len(rows) + len(ptypes)
        edge_prog = _pad_binders(edge_prog, n_fixed + len(edge_caps), upd_caps)
        if update_prog is not None:
            n_dst = sum(1 for r, _, _ in items if r == "dst")
            update_prog = _pad_binders(update_prog, n_dst + n_out + len(ptypes), edge_caps)
        caps = edge_caps + upd_caps
        roles = tuple(r for r, _, _ in items) + ("param",) * (len(ptypes) + len(caps))
        names = (tuple(n for _, n, _ in items) + tuple(k for k, _ in self.param_items()) +
            tuple(f"captured{i}" for i in range(len(caps))))
        operands = [leaf_value(v) for v in list(fields) + list(params) + list(caps)]
        outs = bind(propagate_p, graph, *operands,
                    edge_fn=ClosedProgram(edge_prog), reducer=reducer, roles=roles,
                    names=names, reduce_by=self.reduce_by,
                    update=None if update_prog is None else ClosedProgram(update_prog))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def staged_program(self, symbolic: bool = True) -> tuple[GraphProgram, list]:
        """The call as a program over symbolic graph sizes (N, S, E), and its arguments.

        Arrays captured by the edge/update functions become leading binders, so new values
        of captured weights never change the program's structure. `symbolic=False` keeps
        the concrete sizes (VJP rules that build shapes, e.g. mean, need them).
        """
        if not hasattr(self.graph, "resolve_csr"):
            raise TigaError(f"graph: expected a tg.Graph, found {type(self.graph).__name__}")
        concrete = self.graph.type()
        self.check_sizes(concrete)
        gtype = self.graph.type(symbolic=symbolic)
        items = self.field_items()
        avals = [gtype]
        for role, _, value in items:
            t = leaf_aval(value).strong()
            avals.append(t.update(shape=(role_size(gtype, role),) + tuple(t.shape[1:])))
        avals += [leaf_aval(v) for _, v in self.param_items()]
        n_f = len(items)

        def fn(graph, *rest):
            return self.stage(graph, list(rest[:n_f]), list(rest[n_f:]))

        prog, caps, _ = trace_flat(fn, avals, top=False)
        return prog, [leaf_value(c) for c in caps] + [leaf_value(v) for v in self.values()]

    def _views(self, items, tracers):
        by_role = {r: {} for r in ROLE_ORDER}
        for (role, name, _), t in zip(items, tracers):
            by_role[role][name] = t
        return by_role

    def _trace_edge(self, items, rows, ptypes):
        names = [k for k, _ in self.param_items()]
        n_out = [0]

        def fn(*args):
            views = self._views(items, args[:len(rows)])
            kw = _accepted(self.edge_fn, dict(zip(names, args[len(rows):])))
            lazy = generated.edge_geometry(views["src"], views["dst"])
            out = self.edge_fn(FieldView("src", views["src"]), FieldView("dst", views["dst"]),
                               FieldView("edge", views["edge"], lazy), **kw)
            parts = self._message_parts(out)
            if self.reducer.is_arg:   # each message with the id of its source / edge
                ident = views[self.reducer.of][ARG_ID]
                parts = [p for m in parts for p in (m, ident)]
            n_out[0] = len(parts) // self.reducer.arity
            return parts

        prog, caps, _ = trace_flat(fn, rows + ptypes, top=False)
        return _captures_last(prog, len(caps)), caps, n_out[0]

    def _message_parts(self, out) -> list:
        check_edge_output(out, self.edge_fn)
        if isinstance(out, ReducerMessage):
            if out.reducer.name != self.reducer.name:
                raise TigaError(f"edge function packaged a message for {out.reducer.name} but "
                                f"the reducer is {self.reducer.name}")
            return list(out.parts)
        if self.reducer.arity != 1 and not self.reducer.is_arg:
            raise TigaError(f"the {self.reducer.name} reducer needs its parts packaged in the "
                            "edge function: return reducer(score, value), calling the reducer "
                            "object itself (self.reducer in a MessagePassing subclass; with "
                            "tg.propagate, the one you pass: r = tg.online_softmax(); "
                            "tg.propagate(g, lambda s, d, e: r(score, value), r, ...))")
        if isinstance(out, (tuple, list)):
            return list(out)
        return [out]

    def _traced_reducer(self, edge_prog: GraphProgram) -> Reducer:
        r = self.reducer
        if r.builtin:
            return r
        (m,) = edge_prog.out_types[:1]
        m = m.strong()

        def region(fn, n_in, what):
            if fn is None:
                return None
            fn = checked_region(fn, r.name, what, None if what == "finalize" else m)
            prog, caps, _ = trace_flat(fn, [m] * n_in, top=False)
            if caps:
                raise TigaError(f"reducer {r.name!r}: {what} must not close over arrays")
            return ClosedProgram(prog)

        return r.with_regions((region(r.lift, 1, "lift"), region(r.combine, 2, "combine"),
                               region(r.finalize, 1, "finalize")))

    def _trace_update(self, items, rows, ptypes, edge_prog, reducer, n_out):
        from ..core.prims.graph import _reduced_type

        msgs, k = edge_prog.out_types, reducer.arity
        aggs = [_reduced_type(reducer, msgs[i:i + k], "propagate")
                for i in range(0, k * n_out, k)]
        dst_items = [(n, t) for (r, n, _), t in zip(items, rows) if r == "dst"]
        names = [k for k, _ in self.param_items()]
        nd = len(dst_items)

        def fn(*args):
            view = FieldView("dst", {n: a for (n, _), a in zip(dst_items, args[:nd])})
            agg = args[nd:nd + n_out]
            kw = _accepted(self.update, dict(zip(names, args[nd + n_out:])))
            return self.update(view, agg[0] if n_out == 1 else tuple(agg), **kw)

        prog, caps, _ = trace_flat(fn, [t for _, t in dst_items] + aggs + ptypes, top=False)
        return _captures_last(prog, len(caps)), caps


def _arg_ids(graph, reducer: Reducer) -> np.ndarray:
    """0..n-1 for the sources (of="src") or the edges (of="edge", in the relation's edge
    order: an edge field is read through the stored permutation, so row k holds edge k)."""
    t = (graph.aval if isinstance(graph, Tracer) else graph.type()
         if hasattr(graph, "type") else None)
    n = None if t is None else (t.num_src if reducer.of == "src" else t.num_edges)
    if not isinstance(n, (int, np.integer)) and isinstance(graph, Graph):
        n = int(graph.resolve_csr()[0][-1])   # a generated relation's edges, listed once
    if not isinstance(n, (int, np.integer)):
        raise UnsupportedError(f"{reducer.pp_param()}: the relation's number of "
                               f"{'sources' if reducer.of == 'src' else 'edges'} is {n!r}, "
                               "not known when the call is traced",
                               hint="call it on a relation with concrete sizes")
    return np.arange(int(n), dtype=np.int64)


def _flatten_lattice_fields(graph, fields: dict) -> tuple | None:
    """A stencil relation's src/dst fields may come in lattice shape (*shape, ...): they
    are flattened in C order (the relation's point order). A field whose first axis already
    counts the points is read as flat. Returns the lattice shape when any field came in it."""
    if getattr(graph, "kind", None) != "stencil" or not isinstance(graph, Graph):
        return None
    shape = tuple(graph.params["shape"])
    points, k, found = graph.num_dst, len(shape), False
    for role in ("src", "dst"):
        for name, value in fields[role].items():
            if isinstance(value, (list, tuple)):
                value = np.asarray(value)
            # .shape, not the traced type: a torch tensor that requires grad has no
            # numpy view until the torch bridge takes the call
            have = getattr(value, "shape", None)
            have = tuple(leaf_aval(value).shape if have is None else have)
            if k > 1 and len(have) >= k and have[:k] == shape and have[0] != points:
                fields[role][name] = value.reshape((points,) + have[k:])
                found = True
    return shape if found else None


def _captures_last(prog: GraphProgram, n_caps: int) -> GraphProgram:
    b = prog.in_binders
    return GraphProgram(b[n_caps:] + b[:n_caps], prog.eqns, prog.outs)


def _pad_binders(prog: GraphProgram, at: int, extra_values) -> GraphProgram:
    """Add unused binders (for operands only another region reads)."""
    extra = tuple(Var(leaf_aval(v)) for v in extra_values)
    b = prog.in_binders
    return GraphProgram(b[:at] + extra + b[at:], prog.eqns, prog.outs)


def propagate(graph, edge_fn, reducer, *, src=None, dst=None, edge=None, update=None,
              **params):
    """Functional message passing: `y[i] = update(finalize(reduce(edge_fn(e) for e -> i)))`.

    Args:
        graph (tg.Graph | DistributedGraph): the relation (`num_src` -> `num_dst`).
        edge_fn (Callable): `edge_fn(src, dst, edge, **params)` -> the message of one edge;
            `src.<name>` / `dst.<name>` / `edge.<name>` are rows of the fields below.
        reducer (tg.Reducer): how a destination's messages combine (`tg.sum()`, ...).
        src (dict[str, array] | None): source fields by name, `(num_src, ...)` each:
            numpy arrays, Python lists, `tg.Tensor`s on any tier, or torch tensors.
        dst (dict[str, array] | None): destination fields, `(num_dst, ...)` each.
        edge (dict[str, array] | None): edge fields, `(num_edges, ...)`, in edge order.
        update (Callable | None): `update(dst, aggregated, **params)` -> the row's result.
        **params: runtime operands (scalars or arrays) passed to edge_fn and update; a new
            value does not recompile.

    Returns:
        tg.Tensor | torch.Tensor: one row per destination, `(num_dst, ...)`; a torch
            tensor (differentiable by torch.autograd) when the inputs are torch tensors.
    """
    if hooks["compiling"]():    # torch.compile's trace: one opaque torch op (torch_bridge)
        return hooks["compiled"](graph, edge_fn, reducer, update, src, dst, edge, params)
    check_keywords("tg.propagate", ("graph", "edge_fn", "reducer", "src", "dst", "edge",
                                    "update"), edge_fn, update, params)
    call = PropagateCall(graph, edge_fn, reducer, src, dst, edge, update, params)
    return run_call(call)


def edge_map(graph, edge_fn, *, src=None, dst=None, edge=None, **params):
    """Per-edge values `edge_fn(src, dst, edge)`, shape `(num_edges, ...)`, in the relation's
    edge order (row k is edge k: the order of `from_coo` / `from_edge_index` input, or of
    `col_idx` for CSR): messages, attention weights, neighbour distances. Differentiable.

    Args:
        graph (tg.Graph): the relation. edge_fn (Callable): as for `tg.propagate`.
        src (dict[str, array] | None): source fields, as for `tg.propagate`.
        dst (dict[str, array] | None): destination fields.
        edge (dict[str, array] | None): edge fields.
        **params: runtime operands passed to edge_fn.

    Returns:
        tg.Tensor | torch.Tensor: `(num_edges, ...)`, row k for edge k.
    """
    check_keywords("tg.edge_map", ("graph", "edge_fn", "src", "dst", "edge"), edge_fn, None,
                   params)
    call = PropagateCall(graph, edge_fn, sum_reducer(), src, dst, edge, None, params,
                         reduce_by="edge")
    return run_call(call)


def run_call(call: PropagateCall):
    if call.is_traced():
        out = call.stage(call.graph, [v for _, _, v in call.field_items()],
                         [v for _, v in call.param_items()])
    elif hooks["execute"] is None:
        raise TigaError("no runtime registered; import tiga (not tiga.trace) to run programs")
    else:
        out = hooks["execute"](call)
    return call.restore_lattice(out)


class MessagePassing:
    """Subclass with `reducer = tg.sum()` and `def edge(self, src, dst, edge, **params)`;
    optionally `def update(self, dst, aggregated, **params)`."""

    reducer: Reducer | None = None

    def edge(self, src, dst, edge, **params):
        """The message of one edge from the rows `src.<name>`, `dst.<name>`, `edge.<name>`
        and the call's keyword parameters; subclasses must define it."""
        raise TigaError(f"{type(self).__name__} must define edge(self, src, dst, edge)")

    def _call(self, graph, src, dst, edge, params) -> PropagateCall:
        if self.reducer is None:
            raise TigaError(f"{type(self).__name__}: set a class attribute reducer, e.g. "
                            "reducer = tg.sum()")
        update = self.update if type(self).update is not MessagePassing.update else None
        check_keywords(f"{type(self).__name__}()", ("graph", "src", "dst", "edge"), self.edge,
                       update, params)
        call = PropagateCall(graph, self.edge, self.reducer, src, dst, edge, update, params)
        call.layer = self
        return call

    def update(self, dst, aggregated, **params):  # replaced by subclasses that need it
        """A destination's result from its reduced messages (default: `aggregated`)."""
        return aggregated

    def __call__(self, *, graph, src=None, dst=None, edge=None, **params):
        update = self.update if type(self).update is not MessagePassing.update else None
        if hooks["compiling"]():    # torch.compile's trace: one opaque torch op (torch_bridge)
            return hooks["compiled"](graph, self.edge, self.reducer, update, src, dst, edge,
                                     params)
        warm = hooks["warm"]    # the signature this layer last ran, prepared: its launch list
        out = (None if warm is None else
            warm(self, graph, self.edge, update, self.reducer, src, dst, edge, params))
        if out is not None:
            return out
        call = self._call(graph, src, dst, edge, params)
        return run_call(call)

    def explain(self, run: bool = False, **call_kwargs):
        """Explain the call with these arguments: route, traversal, schedule, what is
        materialised, estimated bytes. Without running it by default; `run=True` also runs it
        and adds what the run measured (pages, bytes per tier, halo overlap, pruned blocks)."""
        call = self._call_for(call_kwargs)
        return hooks["explain"](call, run)

    def ir(self, stage: str = "domain", **call_kwargs) -> str:
        """IR text of the call with these arguments at `stage`:
        "program", "domain", "iter", "kernel" or "task"."""
        return hooks["ir"](self._call_for(call_kwargs, "ir"), stage)

    def reference(self, *, graph, src=None, dst=None, edge=None, **params):
        """Run the semantic oracle (the reference interpreter); differentiable."""
        call = self._call(graph, src, dst, edge, params)
        return call.restore_lattice(hooks["reference"](call))

    def _call_for(self, call_kwargs, what: str = "explain") -> PropagateCall:
        if call_kwargs:
            kw = dict(call_kwargs)
            return self._call(kw.pop("graph"), kw.pop("src", None), kw.pop("dst", None),
                              kw.pop("edge", None), kw)
        raise TigaError(f"{type(self).__name__}.{what}(): pass the call's arguments "
                        "(graph=..., src=..., dst=..., edge=..., params) to see that call; a "
                        "layer keeps nothing of its past calls (it may be called from several "
                        "threads at once; tg.profile() reports what calls measured)")
