"""torch_bridge: a tg.nn layer's relation work as one opaque torch op inside torch.compile.

Building a relation from an edge_index tensor (and PyG's self-loop edits, gcn_norm's
per-edge weights) reads the tensor's values, which Dynamo cannot trace. So a layer hands
everything that depends on its relation (the relation, its loops, the per-edge data and the
Tiga aggregations) to `region`: eagerly it is a plain call; while Dynamo traces it is one
`tiga::layer` op whose inputs are the edge_index and node-shaped tensors (features,
parameters) and whose outputs are node-shaped. The fake implementation shapes each output
from the inputs the layer names (rows of one, trailing dims and dtype of another). Where
the inputs require grad the op is `tiga::layer_saved`: the region runs with torch.autograd
on (its Tiga calls record Tiga's VJP) and the backward (`tiga::layer_saved_vjp`, opaque)
differentiates that recorded graph; without it (`tiga::layer_vjp`, a second backward) the
region is recomputed with autograd on. A tg.Graph given directly is a constant of the region:
`_register` (run for real by Dynamo) keys it with the region, and Dynamo guards on its
identity like a module attribute (a new Graph object recompiles).

Outputs may also be per edge (attention weights, the relation's edge_index): their edge
count is data-dependent, so the fake implementation gives them one unbacked size shared by
all of them. Tensors a region reads through a module (an edge network's Parameters, which
Tiga captures by object) are passed to the op for Dynamo's data flow and named by `live`:
the VJP differentiates the region with respect to those objects.
"""
from __future__ import annotations

import secrets
import threading
import weakref

import torch

from ...core.graph import Graph
from ..compiled import _aliases, _const, _fresh_key, _setup, _unconst, _vjp_fake, compiling

_REGIONS: dict = {}      # key -> _Region; one per (function, relation object, settings)
_KEYS: dict = {}
_LOCK = threading.Lock()
_CONSTANTS = (bool, int, float, str, type(None))


def region(fn, edge_index, settings: tuple, tensors: tuple, outs: tuple, live=None):
    """fn(edge_index, settings, *tensors): node (or edge) outputs, one op while Dynamo traces.

    edge_index: a tg.Graph, a (2, E) integer tensor, or None (fn builds its relation from
    the tensors; anything else is called eagerly, behind the graph break of `relation()`);
    tensors may hold None (absent optionals). outs, per output: (i, j), shaped
    (tensors[i].shape[0],) + tensors[j].shape[1:] with tensors[j]'s dtype; (i, j, tail),
    the same with trailing dims `tail`; ("edges", j, stop, count), shaped (E,) +
    tensors[j].shape[1:stop]; ("edge_index", count), (2, E) int64. E: `count` where it is
    known (a constant relation's edges), else one unbacked size shared by those outputs
    (Dynamo traces through it with fullgraph=True or capture_dynamic_output_shape_ops;
    otherwise, torch's default, it breaks the graph at the op).
    Settings: Python constants (part of the key; another value, e.g. a tensor fill_value,
    runs fn eagerly, behind relation()'s graph break). live: a function of the settings
    giving the tensors fn reads instead of the last len(live(settings)) tensors."""
    if (not compiling() or not isinstance(edge_index, (Graph, torch.Tensor, type(None))) or
            not all(isinstance(s, _CONSTANTS) for s in settings)):   # e.g. a tensor fill
        return fn(edge_index, settings, *tensors)
    if not isinstance(edge_index, torch.Tensor):
        static, args, shift = edge_index, tuple(tensors), 0
    else:
        static, args, shift = None, (edge_index,) + tuple(tensors), 1
    present = tuple(t is not None for t in args)
    spec = tuple(_shifted(o, shift) for o in outs)
    key = _register(fn, static, tuple(_const(s) for s in settings), present, spec,
                    isinstance(edge_index, torch.Tensor), live)
    tensors = [t for t in args if t is not None]
    if _differentiated(tensors):
        result = torch.ops.tiga.layer_saved(key, tensors)[:-1]   # (the last: its token)
    else:
        result = torch.ops.tiga.layer(key, tensors)
    return result[0] if len(result) == 1 else tuple(result)


def _differentiated(tensors) -> bool:
    """Whether the op's forward will be differentiated (Dynamo guards on grad mode and on
    the inputs' requires_grad): then it keeps its autograd graph (tiga::layer_saved)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _shifted(rule: tuple, shift: int) -> tuple:
    """An output rule with its tensor indices counted from the op's first tensor."""
    if rule[0] == "edge_index":
        return rule
    if rule[0] == "edges":
        return (rule[0], rule[1] + shift) + rule[2:]
    return (rule[0] + shift, rule[1] + shift) + rule[2:]


class _Region:
    """A registered region: its function, constant relation (None: the first tensor is
    the edge_index, or fn builds its own), settings, which arguments are present, the
    output shapes' rule and the live tensors' function."""

    def __init__(self, fn, graph, settings, present, spec, tensor_relation, live):
        self.fn, self.graph, self.settings = fn, graph, _unconst(settings)
        self.present, self.spec, self.live = present, spec, live
        self.tensor_relation = tensor_relation

    def args(self, tensors) -> list:
        it = iter(tensors)
        return [next(it) if p else None for p in self.present]

    def run(self, tensors) -> list:
        args = self.args(tensors)
        if not self.tensor_relation:
            args = [self.graph] + args
        outs = self.fn(args[0], self.settings, *args[1:])
        return list(outs) if isinstance(outs, tuple) else [outs]

    def live_tensors(self) -> list:
        return [] if self.live is None else list(self.live(self.settings))

    def fake(self, tensors) -> list:
        args = self.args(tensors)
        edges = []   # one data-dependent edge count, shared by every edge output
        return [self._fake(rule, args, edges) for rule in self.spec]

    @staticmethod
    def _fake(rule, args, edges):
        if rule[0] in ("edges", "edge_index"):
            count = rule[1] if rule[0] == "edge_index" else rule[3]
            if count is None:
                if not edges:
                    edges.append(torch.library.get_ctx().new_dynamic_size())
                count = edges[0]
            if rule[0] == "edge_index":
                return torch.empty((2, count), dtype=torch.int64, device=_device(args))
            like = args[rule[1]]
            return like.new_empty((count,) + tuple(like.shape[1:rule[2]]))
        i, j = rule[:2]
        tail = tuple(args[j].shape[1:]) if len(rule) == 2 else rule[2]
        return args[j].new_empty((args[i].shape[0],) + tail)


def _device(args):
    return next((t.device for t in args if t is not None), torch.device("cpu"))


@torch._dynamo.assume_constant_result
def _register(fn, graph, settings, present, spec, tensor_relation, live) -> int:
    # the region holds graph: its id is unique while the entry lives
    ident = (fn, id(graph), settings, present, spec, tensor_relation, live)
    with _LOCK:
        if ident not in _KEYS:
            key = _KEYS[ident] = _fresh_key()
            _REGIONS[key] = _Region(fn, graph, settings, present, spec, tensor_relation,
                                    live)
        return _KEYS[ident]


def _unaliased(outs, tensors) -> list:
    # a custom op's outputs may not alias its inputs
    return [o.clone() if any(_aliases(o, t) for t in tensors) else o for o in outs]


@torch.library.custom_op("tiga::layer", mutates_args=())
def _layer_op(key: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        outs = _REGIONS[key].run(list(tensors))
    return _unaliased(outs, tensors)


@_layer_op.register_fake
def _layer_fake(key, tensors):
    return _REGIONS[key].fake(list(tensors))


@torch.library.custom_op("tiga::layer_vjp", mutates_args=())
def _vjp_op(key: int, tensors: list[torch.Tensor], cts: list[torch.Tensor],
            wrt: list[bool]) -> list[torch.Tensor]:
    """Gradients for the tensors marked in `wrt`: the region recomputed with autograd on
    (the others go in as they are: the edge_index keeps its identity, so the relation built
    from it in the forward is found in `relation()`'s memo). Outputs that are not floating
    (an edge_index) carry no gradient."""
    entry = _REGIONS[key]
    leaves = [t.detach().requires_grad_() if w else t for t, w in zip(tensors, wrt)]
    with torch.enable_grad(), _autograd_dispatch():
        outs = entry.run(leaves)
    return _grads(entry, leaves, outs, tensors, cts, wrt)


def _grads(entry, leaves, outs, tensors, cts, wrt) -> list:
    """<outs, cts> differentiated with respect to the leaves marked in `wrt` (the live
    tensors in place of the last ones: the region reads those)."""
    live = entry.live_tensors()
    stand = list(leaves[:len(leaves) - len(live)]) + live
    targets = [t for t, w in zip(stand, wrt) if w]
    with torch.enable_grad(), _autograd_dispatch():
        pairs = [(o, c) for o, c in zip(outs, cts) if o.requires_grad and
                 o.is_floating_point()]
        grads = torch.autograd.grad([o for o, _ in pairs], targets, [c for _, c in pairs],
                                    allow_unused=True) if pairs else [None] * len(targets)
    got = [torch.zeros_like(t) if g is None else g.detach() for g, t in zip(grads, targets)]
    return _unaliased(got, list(tensors) + list(cts))


def _autograd_dispatch():
    """Autograd recording inside an op's kernel: the dispatcher runs a kernel with the
    autograd keys excluded, so the region's torch ops (edge weights through the loop edit,
    gcn_norm) would record nothing and their inputs' gradients would be lost (Tiga's
    autograd.Function records regardless: only its direct inputs would get gradients)."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    exclude = exclude.remove(keys.AutogradFunctionality).remove(keys.ADInplaceOrView)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                           exclude)


# (the VJP op's shapes and the saved inputs are those of tiga::call's VJP: one definition)
_vjp_op.register_fake(_vjp_fake)


def _backward(ctx, grads):
    tensors = ctx.saved_tensors
    wrt = [bool(w) and t.is_floating_point()
           for w, t in zip(ctx.needs_input_grad[1], tensors)]
    if not any(wrt):
        return None, [None] * len(tensors)
    cts = [torch.zeros(shape, dtype=dtype, device=tensors[0].device) if g is None else g
           for g, (shape, dtype) in zip(grads, ctx.out_types)]
    got = iter(torch.ops.tiga.layer_vjp(ctx.key, list(tensors), cts, wrt))
    return None, [next(got) if w else None for w in wrt]


def _setup_layer(ctx, inputs, output):
    """tiga::call's setup, and the outputs' shapes (an edge output's is data-dependent:
    the backward makes a missing cotangent from the forward's own output)."""
    _setup(ctx, inputs, output)
    ctx.out_types = [(o.shape, o.dtype) for o in output]


_layer_op.register_autograd(_backward, setup_context=_setup_layer)


# ---- a differentiated forward keeps its residuals ---------------------------------------------
# tiga::layer_saved is tiga::layer for a forward whose inputs require grad: the region runs
# with autograd on and its graph (Tiga's saved residuals included) is kept under a token, the
# op's last output, which the backward receives; the backward then differentiates that graph
# instead of recomputing the region. The entry leaves when the backward takes it or the
# token dies (the forward's autograd graph freed without a backward); a backward that finds
# none (a second one, retain_graph) recomputes, as tiga::layer_vjp.
_SAVED: dict = {}    # token -> (leaves, attached outputs)


@torch.library.custom_op("tiga::layer_saved", mutates_args=())
def _saved_op(key: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # copies of the floating inputs, kept with the graph: a compiled graph may recompute an
    # input in its backward rather than save it, and reuse its memory after this op; the
    # edge_index goes in as it is (relation()'s memo finds it by identity)
    leaves = [t.detach().clone().requires_grad_() if t.is_floating_point() else t
              for t in tensors]
    with torch.enable_grad(), _autograd_dispatch():
        outs = _REGIONS[key].run(leaves)
    token = secrets.randbits(62)
    marker = torch.tensor(token, dtype=torch.int64)
    _SAVED[token] = (leaves, outs)
    weakref.finalize(marker, _SAVED.pop, token, None)
    # copies: a compiled graph may reuse an output's memory once it is dead to it, and the
    # kept graph may hold the output itself (a softmax's VJP reads it)
    return [o.detach().clone() for o in outs] + [marker]


@_saved_op.register_fake
def _saved_fake(key, tensors):
    return _REGIONS[key].fake(list(tensors)) + [torch.empty((), dtype=torch.int64)]


@torch.library.custom_op("tiga::layer_saved_vjp", mutates_args=())
def _saved_vjp_op(key: int, marker: torch.Tensor, tensors: list[torch.Tensor],
                  cts: list[torch.Tensor], wrt: list[bool]) -> list[torch.Tensor]:
    saved = _SAVED.pop(int(marker), None)
    if saved is None:
        return _vjp_op(key, tensors, cts, wrt)
    leaves, outs = saved
    return _grads(_REGIONS[key], leaves, outs, tensors, cts, wrt)


@_saved_vjp_op.register_fake
def _saved_vjp_fake(key, marker, tensors, cts, wrt):
    return _vjp_fake(key, tensors, cts, wrt)


def _setup_saved(ctx, inputs, output):
    key, tensors = inputs
    ctx.key, ctx.n = key, len(tensors)
    ctx.save_for_backward(*tensors, output[-1])
    ctx.out_types = [(o.shape, o.dtype) for o in output[:-1]]


def _backward_saved(ctx, grads):
    *tensors, marker = ctx.saved_tensors
    wrt = [bool(w) and t.is_floating_point()
           for w, t in zip(ctx.needs_input_grad[1], tensors)]
    if not any(wrt):
        return None, [None] * len(tensors)
    cts = [torch.zeros(shape, dtype=dtype, device=tensors[0].device) if g is None else g
           for g, (shape, dtype) in zip(grads[:-1], ctx.out_types)]
    got = iter(torch.ops.tiga.layer_saved_vjp(ctx.key, marker, list(tensors), cts, wrt))
    return None, [next(got) if w else None for w in wrt]


_saved_op.register_autograd(_backward_saved, setup_context=_setup_saved)
