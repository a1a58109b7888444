"""torch_bridge: a tg.nn layer's relation work as one opaque torch op inside torch.compile.

Building a relation from an edge_index tensor (and PyG's self-loop edits, gcn_norm's
per-edge weights) reads the tensor's values, which Dynamo cannot trace. So a layer hands
everything that depends on its relation (the relation, its loops, the per-edge data and the
Tiga aggregations) to `region`: eagerly it is a plain call; while Dynamo traces it is one
`tiga::layer` op whose inputs are the edge_index and node-shaped tensors (features,
parameters) and whose outputs are node-shaped, so no data-dependent edge count crosses the
op boundary. The fake implementation shapes each output from the inputs the layer names
(rows of one, trailing dims and dtype of another); the autograd registration recomputes the
region with torch.autograd on (its Tiga calls differentiate through Tiga's VJP) inside
`tiga::layer_vjp`, itself opaque. A tg.Graph given directly is a constant of the region:
`_register` (run for real by Dynamo) keys it with the region, and Dynamo guards on its
identity like a module attribute (a new Graph object recompiles).
"""
from __future__ import annotations

import threading

import torch

from ...core.graph import Graph
from ..compiled import _aliases, _const, _fresh_key, _setup, _unconst, _vjp_fake, compiling

_REGIONS: dict = {}      # key -> _Region; one per (function, relation object, settings)
_KEYS: dict = {}
_LOCK = threading.Lock()
_CONSTANTS = (bool, int, float, str, type(None))


def region(fn, edge_index, settings: tuple, tensors: tuple, outs: tuple):
    """fn(edge_index, settings, *tensors): node outputs, one op while Dynamo traces.

    edge_index: a tg.Graph or a (2, E) integer tensor (anything else is called eagerly,
    behind the graph break of `relation()`); tensors may hold None (absent optionals);
    outs: per output (i, j), shaped (tensors[i].shape[0],) + tensors[j].shape[1:] with
    tensors[j]'s dtype. Settings: Python constants (part of the key; another value, e.g. a
    tensor fill_value, runs fn eagerly, behind relation()'s graph break)."""
    if not compiling() or not isinstance(edge_index, (Graph, torch.Tensor)) or \
            not all(isinstance(s, _CONSTANTS) for s in settings):   # e.g. a tensor fill
        return fn(edge_index, settings, *tensors)
    if isinstance(edge_index, Graph):
        static, args, shift = edge_index, tuple(tensors), 0
    else:
        static, args, shift = None, (edge_index,) + tuple(tensors), 1
    present = tuple(t is not None for t in args)
    spec = tuple((i + shift, j + shift) for i, j in outs)
    key = _register(fn, static, tuple(_const(s) for s in settings), present, spec)
    result = torch.ops.tiga.layer(key, [t for t in args if t is not None])
    return result[0] if len(result) == 1 else tuple(result)


class _Region:
    """A registered region: its function, constant relation (or None: the first tensor is
    the edge_index), settings, which arguments are present, and the output shapes' rule."""

    def __init__(self, fn, graph, settings, present, spec):
        self.fn, self.graph, self.settings = fn, graph, _unconst(settings)
        self.present, self.spec = present, spec

    def args(self, tensors) -> list:
        it = iter(tensors)
        return [next(it) if p else None for p in self.present]

    def run(self, tensors) -> list:
        args = self.args(tensors)
        if self.graph is not None:
            args = [self.graph] + args
        outs = self.fn(args[0], self.settings, *args[1:])
        return list(outs) if isinstance(outs, tuple) else [outs]

    def fake(self, tensors) -> list:
        args = self.args(tensors)
        return [args[j].new_empty((args[i].shape[0],) + tuple(args[j].shape[1:]))
                for i, j in self.spec]


@torch._dynamo.assume_constant_result
def _register(fn, graph, settings, present, spec) -> int:
    ident = (fn, id(graph), settings, present, spec)   # the region holds graph: id is unique
    with _LOCK:
        if ident not in _KEYS:
            key = _KEYS[ident] = _fresh_key()
            _REGIONS[key] = _Region(fn, graph, settings, present, spec)
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
    from it in the forward is found in `relation()`'s memo)."""
    leaves = [t.detach().requires_grad_() if w else t for t, w in zip(tensors, wrt)]
    targets = [t for t, w in zip(leaves, wrt) if w]
    with torch.enable_grad(), _autograd_dispatch():
        outs = _REGIONS[key].run(leaves)
        pairs = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
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
    shapes = _REGIONS[ctx.key].fake(list(tensors))
    cts = [torch.zeros_like(s) if g is None else g for g, s in zip(grads, shapes)]
    got = iter(torch.ops.tiga.layer_vjp(ctx.key, list(tensors), cts, wrt))
    return None, [next(got) if w else None for w in wrt]


_layer_op.register_autograd(_backward, setup_context=_setup)
