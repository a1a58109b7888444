"""torch_bridge: run a propagate call on torch tensors, differentiable through torch.autograd.

The forward runs the call's staged GraphProgram on numpy views of the tensors; the backward
runs Tiga's own VJP program (`vjp_program`), not a torch replay of the edge function.
Eager autograd (and one torch.func.grad / vjp level) goes through `_PropagateFunction`,
whose backward reuses the forward's residuals. Under torch.func.vmap, forward mode
(torch.autograd.forward_ad, torch.func.jvp / jacfwd) and nested differentiation (hessian,
grad of grad, create_graph) the call is a `ProgramFunction` node (program_node.py): its
`vmap`, `jvp` and `backward` rules run Tiga's batched, JVP and VJP programs of the call's
program, each again such a node, so every composition torch builds runs Tiga's rules.
"""
from __future__ import annotations

import copy
import inspect

import numpy as np
import torch

from .. import opt
from ..autodiff import vjp_program
from ..core.dtypes import bfloat16
from ..core.errors import TigaError
from ..core.eval import eval_program, on_device
from ..core.passes import dce
from ..core.prims.graph import propagate_p
from ..core.program import Eqn, GraphProgram, Var
from ..core.types import GraphType
from ..lower.backends import using_backend
from ..trace import call_cache
from ..trace.staging import leaf_value
from ..trace.tracer import resolving
from ..xla_free_runtime.backends.triton.launch import call_backend
from ..xla_free_runtime.executor import execute, explain_program
from .dlpack import PLAIN_TYPES, host_view, is_torch, to_numpy, to_torch
from .nn import TracedModule
from .program_node import (
    Node,
    ProgramFunction,
    node_jvp,
    node_vjp,
    node_vmap,
    plain_tangents,
)
from .transforms import (
    backward_differentiated,
    needs_program_node,
    plain,
    staging_types,
    transform_depth,
)

ROUTES = ("auto", "reference")


def run_call_torch(call, route: str = "auto"):
    """Run a PropagateCall whose fields, params or captured values hold torch tensors.

    Returns torch tensors (one, or a tuple for several outputs) on the device of the torch
    inputs. When grad mode is on and an input requires grad, the outputs carry a grad_fn
    whose backward runs Tiga's VJP program on the same route.
    """
    if route not in ROUTES:
        raise TigaError(f"route: expected one of {ROUTES}, found {route!r}")
    # CUDA inputs: the triton backend, or an error before _prepare copies them to the host
    backend = _backend(call) if route == "auto" else None
    keep = backend == "triton"
    program, np_args, originals, vjps = _prepare(call, keep_device=keep, convert=False)
    if needs_program_node(originals):
        # torch.func.vmap, forward mode, nested differentiation: a node whose vmap, jvp
        # and backward run Tiga's batching, JVP and VJP rules (ProgramFunction)
        slots = [k for k, o in enumerate(originals) if is_torch(o)]
        node = Node(program, np_args, slots, route, backend, _device_of(originals),
                    _runner, plain_tangents(originals, slots))
        outs = ProgramFunction.apply(node, *[originals[k] for k in slots])
        return outs[0] if len(outs) == 1 else tuple(outs)
    np_args = _host_args(np_args, originals, (len(originals) - len(call.values()), call), keep)
    run = _Run(program, np_args, originals, route, vjps, backend)
    if not any(run.wrt):
        outs = run.forward()
    else:
        inputs = [o for o, w in zip(originals, run.wrt) if w]
        outs = _PropagateFunction.apply(run, *inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)


STATS = {"stagings": 0}   # traces of a call's functions by the bridge (tests count them)


def _resolved_first(graph) -> bool:
    """Whether a call resolves this generated relation's CSR before running: radius and
    low-dim kNN (cheap cell searches). kNN above FAST_DIMS dims knows its edge count
    (num_dst * k) and selects its neighbours in the call (knn-tiled-scan), whose VJP adopts
    them; resolving first would run the O(N*M*d) numpy reference selection."""
    from ..core.graph_generated import FAST_DIMS

    if getattr(graph, "tiga_distributed", False) is True:
        return False    # its CSR lives on several ranks; its type is already concrete
    if graph.kind == "paged":
        return False    # its CSR stays on disk (read by page); the store knows its counts
    return graph.kind != "knn" or int(graph.params.get("dims", 0)) <= FAST_DIMS


def _prepare(call, keep_device: bool = False, convert: bool = True) -> tuple:
    """(program, host operands, the caller's objects, VJP programs by requires-grad
    pattern) for a call on torch tensors; staged, rewritten and cached once per signature.
    convert=False leaves None for the torch operands (`_host_args` converts them).

    The signature (call_cache's: functions, traced-module structure and parameter
    identities, relation type, field and param types, plus here the concrete sizes and
    which arguments are the same tensor) fixes the program; the captured parameters are
    program inputs, re-read on every call, so an optimizer step is seen without a retrace.
    """
    values = call.values()
    if hasattr(call.graph, "resolve_csr") and _resolved_first(call.graph) and not keep_device:
        # a generated relation (radius, knn) knows its edge count once resolved (cached on
        # it; the run needs it anyway): key on the resolved type, not on `E` then `3048`
        # (not on the GPU: its kernels walk the relation's cells there, never its CSR)
        call.graph.resolve_csr()
    extra = ("torch", call.graph.type(), _aliasing(values))
    fresh = {}

    def build():
        program, _, originals, _ = stage_call_torch(call)
        STATS["stagings"] += 1
        caps = tuple(originals[:len(originals) - len(values)])
        fresh["caps"] = caps
        return (program, {}), (caps if _persistent(caps, call) else None)

    with staging_types():   # (a tensor batched by torch.func.vmap: its instance's type)
        (program, vjps), held = call_cache.reuse(call, extra, build)
    caps = fresh.get("caps", held)
    originals = list(caps) + values
    np_args = [None if is_torch(a) else leaf_value(a) for a in originals]
    if convert:
        np_args = _host_args(np_args, originals, (len(caps), call), keep_device)
    return program, np_args, originals, vjps


def _host_args(np_args, originals, naming: tuple, keep_device: bool) -> list:
    """The operands with the torch tensors as host views (keep_device: the triton route's
    kernels read CUDA tensors where they are). naming: (captured count, call), the operand
    names for errors (built only where a tensor is not a plain host one)."""
    out = list(np_args)
    names = None
    for k, a in enumerate(originals):
        if not is_torch(a):
            continue
        view = None if keep_device else host_view(a)
        if view is None:
            if keep_device and on_device(a):
                view = a.detach()
            else:
                names = names or _names(*naming)
                view = to_numpy(a, names[k])
        out[k] = view
    return out


_HOST_LEAVES = (np.ndarray, float, int, bool)


def _backend(call) -> str | None:
    """call_backend's answer, decided without asking each operand's DLPack device where the
    relation and every operand are on the host (plain CPU torch tensors, numpy, numbers; a
    tensor subclass may say otherwise through its DLPack device, so it is asked)."""
    if str(getattr(call.graph, "device", "cpu") or "cpu") == "cpu" and all(
            (v.is_cpu if type(v) in PLAIN_TYPES else isinstance(v, _HOST_LEAVES))
            for v in call.values()[1:]):
        return None
    return call_backend(call)


def _device_of(originals):
    torch_in = [o for o in originals if is_torch(o)]
    return torch_in[0].device if torch_in else torch.device("cpu")


def _names(n_caps: int, call) -> list:
    """Operand names in binder order (captured values, graph, fields, params), for errors."""
    return ([f"captured value {i}" for i in range(n_caps)] + ["graph"] +
        [f"{r}.{n}" for r, n, _ in call.field_items()] + [k for k, _ in call.param_items()])


def _aliasing(values) -> tuple:
    """Which arguments are the same torch tensor (the staged program reads them once)."""
    first: dict = {}
    return tuple(first.setdefault(id(v), i) if is_torch(v) else i
                 for i, v in enumerate(values))


def _persistent(caps, call) -> bool:
    """Every captured tensor is one the cache key pins: a parameter or buffer of a
    tg.nn.trace module, or a tensor held by the edge/update function's owner or closure.
    Tensors made while tracing (`w * 2`) would be stale on a reuse: such calls restage."""
    known = set()
    for fn in (call.edge_fn, call.update):
        for obj in _held_objects(fn):
            if is_torch(obj):
                known.add(id(obj))
            elif isinstance(obj, TracedModule):
                known.update(id(t) for t in obj.module.parameters())
                known.update(id(t) for t in obj.module.buffers())
    return all(id(c) in known for c in caps)


def _held_objects(fn) -> list:
    if fn is None:
        return []
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        return list(getattr(owner, "__dict__", {}).values())
    out = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:
            pass
    return out


def explain_call_torch(call):
    """`explain()` of a call on torch tensors: the route it would take, without running."""
    if getattr(call.graph, "kind", None) in ("radius", "knn") and _resolved_first(call.graph):
        call.graph.resolve_csr()   # as the call does (_prepare), so the routes are its own
    program, np_args, originals, notes = stage_call_torch(call)
    explanation = explain_program(program, np_args)
    for note in notes:
        explanation.traversal.append(note)
    if getattr(call.graph, "kind", None) in ("radius", "knn") and _resolved_first(call.graph):
        explanation.traversal.append(
            f"the {call.graph.kind} relation's CSR is materialised (the call resolves it to "
            "key on its edge count; searched once per relation), so its propagates walk "
            "that CSR with the stored-CSR kernel instead of the cell directory: no "
            "candidate distance tests per call")
    names = ([f"captured value {i}" for i in range(len(originals) - len(call.values()))] +
        ["graph"] + [f"{r}.{n}" for r, n, _ in call.field_items()] +
        [k for k, _ in call.param_items()])
    read_by_kernels = {id(a) for e in program.eqns if e.primitive is propagate_p
                       for a in e.inputs}
    for name, obj, binder in zip(names, originals, program.in_binders):
        if (is_torch(obj) and not obj.is_contiguous() and id(binder) in read_by_kernels
                and id(binder) not in explanation.strided_reads):
            # imported zero-copy with its strides; the compiled kernels read C-order rows
            explanation.materialized.append(
                (f"contiguous copy of {name} (torch strides {tuple(obj.stride())})",
                 obj.numel() * obj.element_size(), "compiled kernels read C-contiguous rows"))
            explanation.estimated_bytes += obj.numel() * obj.element_size()
    edge_params = any(r == "param" for e in program.eqns if e.primitive is propagate_p
                      for r in e.params["roles"])
    reducers = sorted({e.params["reducer"].name for e in program.eqns
                       if e.primitive is propagate_p})
    reading = [r for r in reducers if r not in ("sum", "mean")]
    primal = ("primal outputs are not recomputed (sum/mean VJPs do not read them)"
              if not reading else
              f"the VJP reads the forward output of {', '.join(reading)}: the backward "
              "reads the output the forward returned (saved for backward) instead of "
              "recomputing it")
    generated = getattr(call.graph, "kind", None) in ("radius", "knn")
    explanation.vjp_route = (
        "torch.autograd backward runs Tiga's compiled VJP program (not a torch replay); "
        f"{primal}; forward intermediates the VJP would replay (hoisted entity rows, "
        "propagate results, degrees) are returned by the forward and saved for backward"
        + ("; the VJP's sum propagates over the relation share one walk (source-grouped "
           "ones too when it is symmetric)" if generated else "")
        + ". Edge functions (MLPs from tg.nn.trace "
        "included) are re-evaluated per edge inside the VJP kernels, so no "
        "(num_edges, hidden) activation tape exists; " + (
            "parameters still read per edge get their gradients folded over all edges "
            "into one partial sum per row chunk (per thread), added once. " if edge_params
            else "no parameter is read per edge (linear layers run per entity), so "
                 "parameter gradients are entity-level products, not per-edge folds. ")
        + "Generic lowering of the VJP program: " + explanation.vjp_route)
    return explanation


def stage_call_torch(call) -> tuple:
    """(program, host operands, the caller's objects, rewrite notes) for a call holding
    torch tensors.

    Operands and objects are in binder order: captured values, graph, fields, params.
    """
    local = _numpy_call(call)
    views = _CapturedTensors()
    with resolving(views):  # torch tensors the edge/update functions close over
        # concrete sizes: VJP rules that build shapes (mean, online_softmax) cannot yet
        # trace over the symbolic sizes N, S, E
        program, args = local.staged_program(symbolic=False)
    n_caps = len(args) - len(call.values())
    # gradients go back to these objects
    originals = [views.original(a) for a in args[:n_caps]] + call.values()
    program = _share_repeated_tensors(program, originals)
    # hoisted linear layers; the forward runs as staged, so `b - p W` is folded here
    program, notes = opt.optimize_program(program, opt.ProgramFacts("staged", bridge=True))
    names = ([f"captured value {i}" for i in range(n_caps)] + ["graph"] +
        [f"{r}.{n}" for r, n, _ in call.field_items()] + [f"{k}" for k, _ in call.param_items()])
    np_args = [to_numpy(a, n) if is_torch(a) else a for a, n in zip(args, names)]
    return program, np_args, originals, notes


def _share_repeated_tensors(program, originals):
    """Read a torch tensor passed in several places (positions as source and destination
    field) through its first binder, so that products of it are computed once (CSE); the
    other binders go unused, and their cotangents are zeros."""
    first, rename = {}, {}
    for v, o in zip(program.in_binders, originals):
        if is_torch(o):
            keep = first.setdefault(id(o), v)
            if keep is not v and keep.type == v.type:
                rename[id(v)] = keep
    if not rename:
        return program

    def sub(a):
        return rename.get(id(a), a)

    eqns = [Eqn(e.primitive, tuple(sub(a) for a in e.inputs), e.params, e.outputs)
            for e in program.eqns]
    return GraphProgram(program.in_binders, eqns, tuple(sub(a) for a in program.outs))


def _numpy_call(call):
    """A shallow copy of `call` whose torch fields and params are numpy views."""
    local = copy.copy(call)
    local.fields = {role: {name: _host(v, f"{role}.{name}") for name, v in fields.items()}
                    for role, fields in call.fields.items()}
    local.params = {k: _host(v, k) for k, v in call.params.items()}
    return local


def _host(value, name: str):
    return to_numpy(value, name) if is_torch(value) else value


class _CapturedTensors:
    """Resolver for the tracer: one read-only host view per captured torch tensor, and the
    way back from a captured view to its tensor."""

    def __init__(self):
        self._views: dict[int, tuple] = {}    # id(tensor) -> (tensor, view)
        self._tensors: dict[int, tuple] = {}  # id(view) -> (view, tensor)

    def view(self, x):
        if not is_torch(x):
            return None
        if id(x) not in self._views:
            view = to_numpy(x, "captured torch tensor")
            self._views[id(x)] = (x, view)  # both kept alive, so ids stay unique
            self._tensors[id(view)] = (view, x)
        return self._views[id(x)][1]

    def owns(self, x) -> bool:
        return is_torch(x) or id(x) in self._tensors

    def original(self, x):
        hit = self._tensors.get(id(x))
        return x if hit is None else hit[1]


def _runner(route: str, backend: str | None = None):
    if route == "reference":
        return lambda program, args: eval_program(program, *args)
    if backend is None:
        return execute  # "auto": the executor picks the route and honours strict mode

    def on_backend(program, args):   # the backend the call's CUDA inputs chose
        with using_backend(backend):
            return execute(program, args, keep_device=True)
    return on_backend


class _Run:
    """One call's program, host operands and the torch inputs gradients flow back to."""

    def __init__(self, program, np_args, originals, route, vjps=None, backend=None):
        self.program, self.args, self.route = program, np_args, route
        self.backend = backend   # "triton" for CUDA inputs (forward and backward run there)
        self.vjps = {} if vjps is None else vjps   # shared by calls of one signature
        grad_on = torch.is_grad_enabled()
        # differentiated inputs: those reverse mode reaches (a call with forward-mode
        # tangents runs as a ProgramFunction node, program_node.py)
        self.wrt = [is_torch(o) and grad_on and o.requires_grad for o in originals]
        self.inputs = [o for o, w in zip(originals, self.wrt) if w]
        self.originals = originals
        torch_in = [o for o in originals if is_torch(o)]
        self.device = torch_in[0].device if torch_in else torch.device("cpu")
        self.out_specs: list = []  # (shape, numpy dtype) per output; cotangents match them
        self.outs: list = []       # the forward's outputs, read by the VJP program
        self.read_outs: list = []  # per output: whether the VJP reads it (saved for backward)
        self.read_ins: list = []   # per operand: whether the backward reads it
        self.residuals: list = []  # forward intermediates the VJP program reads

    def forward(self) -> list:
        program = self.program
        if any(self.wrt):   # the forward also returns the values its VJP would recompute
            program = self._derived()[0]
        outs = _runner(self.route, self.backend)(program, self.args)
        n_out = len(self.program.outs)
        outs, self.residuals = outs[:n_out], list(outs[n_out:])
        # (outputs the triton route left on the GPU stay there, in the dtype it wrote)
        outs = [o if on_device(o) else np.asarray(o, t.dtype.np)
                for o, t in zip(outs, self.program.out_types)]
        # a residual viewing an output's memory (the output a reshape of it) would see an
        # in-place change to that output tensor before backward: keep its own copy
        self.residuals = [_own_copy(r) if any(_shares(r, o) for o in outs) else r
                          for r in self.residuals]
        self.out_specs = [(tuple(o.shape), o.dtype) for o in outs]
        if any(self.wrt):
            self.outs = outs
            self.read_outs = self._derived()[2]
            self.read_ins = [r or any(_shares(a, res) for res in self.residuals)
                             for r, a in zip(self._derived()[3], self.args)]
        # (on the device of the torch inputs, as for host results: a relation on the GPU
        # with fields on the host gives host results)
        return [_as_torch(o, self.device) for o in outs]

    def _derived(self) -> tuple:
        """(forward program returning its outputs then the residuals, VJP program taking
        (*ins, *cts, *outs, *residuals)); derived once per signature, requires-grad pattern
        and relation kinds (and looked up once per run: a call asks it three or four times)."""
        hit = self.__dict__.get("_hit")
        if hit is None:
            hit = self._hit = self._derive()
        return hit

    def _derive(self) -> tuple:
        # a DistributedGraph's walks never merge: a source-grouped one sends ghost rows back
        kinds = {id(v): None if getattr(a, "tiga_distributed", False) is True
                 else opt.relation_kind(a)
                 for v, a in zip(self.program.in_binders, self.args)
                 if isinstance(v.type, GraphType)}
        key = (tuple(self.wrt), tuple(kinds.values()))
        hit = self.vjps.get(key)
        if hit is not None:
            return hit
        n_out = len(self.program.outs)
        full = _reading_outputs(vjp_program(self.program, self.wrt), n_out)
        # only the cotangents: the primal outputs are already known, and a sum-like
        # reducer's VJP does not read them, so their recomputation is dead code
        vjp = dce(full, keep_outputs=range(n_out, len(full.outs)))
        n_vjp_in = len(vjp.in_binders)
        # values the VJP replays from the forward (hoisted entity rows, a propagate whose
        # result a rule reads) are returned by the forward and read, not recomputed
        vjp = opt.optimize_program(vjp, opt.ProgramFacts("vjp", forward=self.program))[0]
        forward = opt.forward_with_residuals(self.program, vjp, n_vjp_in)
        # a + (-b) as a - b; the VJP's walks over one radius/knn relation (destination and
        # source cotangents) become one walk; its graph binders are the forward's, in place
        by_pos = {id(v): kinds.get(id(w)) for v, w in zip(vjp.in_binders,
                                                         self.program.in_binders)}
        facts = opt.ProgramFacts("execute", relation_kinds=tuple(sorted(by_pos.items())))
        vjp = opt.optimize_program(vjp, facts)[0]   # as tg.grad / tg.vjp / tg.jit run theirs
        n_in = len(self.program.in_binders)
        used = _read_vars(vjp)
        reads = [id(b) in used for b in vjp.in_binders[n_in + n_out:n_in + 2 * n_out]]
        reads_in = [id(b) in used for b in vjp.in_binders[:n_in]]
        hit = self.vjps[key] = (forward, vjp, reads, reads_in)
        return hit

    def backward(self, grad_outs) -> list:
        """Gradients for `self.inputs` from output cotangents (None reads as zeros)."""
        cts = []
        for g, (shape, dtype) in zip(grad_outs, self.out_specs):
            if isinstance(dtype, torch.dtype):   # an output the triton route left on the GPU
                cts.append(torch.zeros(shape, dtype=dtype, device=self.device) if g is None
                           else g.detach().to(dtype=dtype, device=self.device))
            else:
                cts.append(np.zeros(shape, dtype) if g is None
                           else np.asarray(to_numpy(g, "output cotangent"), dtype))
        vjp = self._derived()[1]
        grads = _runner(self.route, self.backend)(vjp, list(self.args) + cts + list(self.outs) +
                                    list(self.residuals))
        return [_as_torch(g if on_device(g) else np.asarray(g), x.device).to(dtype=x.dtype)
                for g, x in zip(grads, self.inputs)]


def _as_torch(o, device) -> torch.Tensor:
    """An output as a torch tensor on `device`: a fresh writeable host array is shared with
    torch as it is (the common case); anything else through to_torch."""
    if (type(o) is np.ndarray and device.type == "cpu" and o.flags.writeable
            and o.dtype.isnative and o.dtype != bfloat16.np and all(k >= 0 for k in o.strides)):
        return torch.from_numpy(o)
    return (o if on_device(o) else to_torch(o)).to(device)


def _shares(a, b) -> bool:
    """Whether two host arrays share memory (device tensors: never with a host array; the
    triton route allocates each output afresh)."""
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and
        np.may_share_memory(a, b))


def _own_copy(r):
    return r.clone() if is_torch(r) else np.array(r)


def _read_vars(program: GraphProgram) -> set:
    """ids of the values `program` reads. A propagate's operand counts only when its edge
    function reads the matching binder: a VJP walk takes every field of the forward call,
    and a tensor it does not read must stay free to change in place, as with torch ops."""
    used = {id(a) for a in program.outs}
    for e in program.eqns:
        unread = _unread_operands(e)
        used.update(id(a) for k, a in enumerate(e.inputs) if k not in unread)
    return used


def _unread_operands(eqn) -> set:
    if eqn.primitive is not propagate_p or eqn.params.get("update") is not None:
        return set()
    fn = eqn.params["edge_fn"]
    binders = fn.program.in_binders[len(fn.consts):]
    if len(binders) != len(eqn.inputs) - 1:     # operands after the relation, one each
        return set()
    read = ({id(a) for x in fn.program.eqns for a in x.inputs} |
        {id(a) for a in fn.program.outs})
    return {k + 1 for k, b in enumerate(binders) if id(b) not in read}


def _reading_outputs(full: GraphProgram, n_out: int) -> GraphProgram:
    """The VJP program `(*ins, *cts) -> (*outs, *grads)` as `(*ins, *cts, *outs) -> (*outs,
    *grads)`: the primal outputs the forward already computed become inputs, so a VJP that
    reads them (online_softmax, max, ...) does not recompute their propagates. Exact: the
    inputs are unchanged since the forward (torch checks the saved tensors' versions)."""
    known: dict = {}
    fresh = []
    for a in full.outs[:n_out]:
        b = Var(a.type)
        fresh.append(b)      # an output that is a binder or repeated: a binder left unread
        bound = any(a is x for x in full.in_binders)
        if isinstance(a, Var) and id(a) not in known and not bound:
            known[id(a)] = b

    def sub(a):
        return known.get(id(a), a) if isinstance(a, Var) else a

    eqns = [Eqn(e.primitive, tuple(sub(a) for a in e.inputs), e.params, e.outputs)
            for e in full.eqns]
    return GraphProgram(tuple(full.in_binders) + tuple(fresh), tuple(eqns),
                        tuple(sub(a) for a in full.outs))


class _PropagateFunction(torch.autograd.Function):
    """Outputs of one Tiga call as a torch autograd node; `inputs` are the tensors that
    require grad (fields, params, captured values), `run` holds everything else. forward /
    setup_context are separate (torch.func's form). Eager autograd and one torch.func.grad /
    vjp level run its backward, which reuses the forward's residuals; a differentiable
    backward (create_graph, nested levels), batched cotangents (jacrev), forward mode and
    vmap go to `ProgramFunction`'s rules (run_call_torch sends batched operands, tangents
    and nested levels there directly)."""

    @staticmethod
    def forward(run, *inputs):
        return tuple(run.forward())

    @staticmethod
    def setup_context(ctx, inputs, output):
        run, inputs = inputs[0], inputs[1:]
        ctx.run = run
        # saved so that an in-place change before backward to an input, to any other
        # tensor the backward reads (a field that needs no gradient, a residual's memory) or
        # to an output the VJP reads (online_softmax, max) raises torch's error; an output
        # the VJP does not read (sum, mean) may change in place (y.relu_())
        ctx.n_inputs = len(inputs)
        read = [o for o, w, r in zip(run.originals, run.wrt, run.read_ins)
                if r and not w and is_torch(o)]
        ctx.save_for_backward(*inputs, *[o for o, r in zip(output, run.read_outs) if r],
                              *read)
        ctx.save_for_forward(*inputs)
        ctx.mark_non_differentiable(*[o for o in output if not o.is_floating_point()])

    @staticmethod
    def vmap(info, in_dims, run, *inputs):
        # (run_call_torch sends batched operands to ProgramFunction; this is its rule)
        return node_vmap(_node_of(run), info.batch_size, in_dims[1:], inputs)

    @staticmethod
    def jvp(ctx, _run_tangent, *tangents):
        # forward mode (forward_ad, torch.func.jvp / jacfwd): Tiga's JVP program
        return node_jvp(_node_of(ctx.run), ctx.saved_tensors[:ctx.n_inputs], tangents)

    @staticmethod
    def backward(ctx, *grad_outs):
        inputs = ctx.saved_tensors[:ctx.n_inputs]
        # batched cotangents: jacrev, or vmap over a vjp function
        batched_cts = any(g is not None and transform_depth(g)[0] for g in grad_outs)
        differentiable = backward_differentiated(inputs, grad_outs)
        if differentiable or batched_cts:
            # Tiga's VJP program as a node of its own (its residuals are recomputed)
            return (None, *node_vjp(_node_of(ctx.run), inputs, ctx.needs_input_grad[1:],
                                    grad_outs))
        with torch.no_grad():
            grads = ctx.run.backward([None if g is None else plain(g, "output cotangent")
                                      for g in grad_outs])
        return (None, *grads)


# torch's Function.apply binds the arguments to forward's signature on every call (a Function
# with setup_context), and inspect.signature would rebuild it each time (~10 us of a warm
# call's ~0.3 ms host time): inspect returns a function's __signature__ as it is
_PropagateFunction.forward.__signature__ = inspect.signature(_PropagateFunction.forward)


def _node_of(run) -> Node:
    """The call of a `_Run` as a `Node` over its differentiated inputs (the others are
    constants of the node, as they are of the run)."""
    slots = [k for k, w in enumerate(run.wrt) if w]
    static = [None if w else a for a, w in zip(run.args, run.wrt)]
    return Node(run.program, static, slots, run.route, run.backend, run.device, _runner)
