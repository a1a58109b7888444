"""torch_bridge: a Tiga call inside torch.compile, as one opaque torch custom op.

Dynamo does not trace Tiga (numpy, ctypes, compiled kernels). `tg.propagate` and
`MessagePassing.__call__` ask `hooks["compiling"]` first (set by `tiga/api.py`); while
Dynamo traces, they hand their arguments to `compiled_propagate` (with `compiled_call`, the
only code here Dynamo traces), which puts the call's tensors into one `tiga::call` op.
Everything else about the call (functions, relation, reducer, Python-number params, the
tensors its edge function captures) is registered once per call site by `_register`, which
Dynamo runs for real (`assume_constant_result`) and whose integer key the op carries. The
op's fake implementation gives the staged program's output types; its autograd
registration runs Tiga's VJP through the eager bridge (`tiga::call_vjp`, itself opaque),
recomputing the forward's residuals there (a compiled graph carries tensors, not a `_Run`).

Dynamo guards on the identity of the relation, layer and reducer objects (like module
attributes): a new `tg.Graph` object recompiles. A call that cannot be one op (a numpy
field, a tensor computed from a parameter while Tiga traces) runs eagerly behind a graph
break that names the reason (with fullgraph=True, Dynamo's error names it).
"""
from __future__ import annotations

import operator
import secrets
import threading
import types

import numpy as np
import torch

from ..core import reducers
from ..core.errors import UnsupportedError
from ..core.reducers import Reducer
from ..trace.call_checks import check_keywords
from ..trace.generated import GENERATED_KINDS, POS, QPOS
from ..trace.message_passing import PropagateCall, run_call
from .autograd import run_call_torch, stage_call_torch
from .dlpack import is_torch, to_torch

ROLES = ("src", "dst", "edge")
_FLOAT = "tiga-float-hex"   # marks a float passed to _register as its exact hex text
_ENTRIES: dict[int, _Entry] = {}     # key -> entry; one per distinct compiled call site
_KEYS: dict[tuple, int] = {}
_LOCK = threading.Lock()
_FALLBACKS: dict[str, str] = {}      # reason -> attribute of _CAPTURED (a disabled runner)
_CAPTURED = types.SimpleNamespace()   # k<key> -> the entry's captured tensors (Dynamo reads)


def compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing right now (constant-folded by Dynamo)."""
    return torch.compiler.is_compiling()


def compiled_propagate(graph, edge_fn, reducer, update, src, dst, edge, params):
    """`tg.propagate` / a MessagePassing call met by Dynamo, before any Tiga code runs
    (traced by Dynamo: plain loops and attribute reads, no Tiga internals)."""
    fields = {"src": dict(src or {}), "dst": dict(dst or {}), "edge": dict(edge or {})}
    if getattr(graph, "kind", None) in GENERATED_KINDS:
        # a radius/kNN relation's coordinates are operands (positions may require grad)
        pos, query = graph.params["inputs"]
        fields["src"][POS], fields["dst"][QPOS] = pos, pos if query is None else query
    return _op_call(graph, edge_fn, reducer, update, "dst", fields, params, True)


def compiled_call(call):
    """A PropagateCall met by Dynamo in the runtime (edge_map, other constructors)."""
    return _op_call(call.graph, call.edge_fn, call.reducer, call.update, call.reduce_by,
                    call.fields, call.params, False)


def _op_call(graph, edge_fn, reducer, update, reduce_by, fields, params, lattice: bool):
    """The call's tensors into one `tiga::call` op; everything else into `_register`."""
    tensors, slots, shapes, skipped = [], [], [], []
    for role in ROLES:
        for name, value in fields[role].items():
            if isinstance(value, torch.Tensor):
                slots.append((role, name))
                shapes.append((_static(value), value.dtype))
                tensors.append(value)
            else:
                skipped.append(f"{role}.{name}")
    consts = []
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            slots.append(("param", name))
            shapes.append((_static(value), value.dtype))
            tensors.append(value)
        else:
            consts.append((name, _const(value)))
    key, fallback = _register(graph, *_split(edge_fn), *_split(update),
                              _reducer_arg(reducer), reduce_by, tuple(slots), tuple(shapes),
                              tuple(consts), tuple(skipped), lattice)
    if fallback is not None:   # a graph break that names why (fullgraph: the error)
        return getattr(_CAPTURED, fallback)(graph, edge_fn, reducer, update, reduce_by,
                                            fields, params, lattice)
    # (an attribute per key: Dynamo reads it when it gets here, after _register made it;
    # a dict would be read once per frame, before a second layer's key existed)
    captured = getattr(_CAPTURED, f"k{key}")
    outs = torch.ops.tiga.call(key, tensors + list(captured))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _const(value):
    """A Python number as a constant Dynamo can pass to `_register`: under dynamic shapes
    it may hold a number read from a source (a default argument) as a SymInt / SymFloat;
    operator.index and float.hex make it specialise (a guard on the value)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return operator.index(value)
    if isinstance(value, float):
        return (_FLOAT, value.hex())
    return value


def _unconst(value):
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == _FLOAT:
            return float.fromhex(value[1])
        return tuple(_unconst(v) for v in value)
    return value


def _static(t) -> tuple:
    """The traced shape as Python ints: operator.index makes Dynamo specialise a dynamic
    size (a guard; int() would keep a SymInt, which `_register` cannot take)."""
    return tuple(operator.index(d) for d in t.shape)


class _Entry:
    """A compiled call site: how to rebuild the call from the op's tensors, the captured
    tensors gradients flow to, and the output types (for the fake implementation)."""

    def __init__(self, parts, slots, consts, lattice: bool):
        self.parts, self.slots, self.consts = parts, slots, consts
        self.lattice = lattice          # fields as the caller gave them: stencil results too
        self.captured: tuple = ()
        self.out_types: list = []       # [(shape, torch dtype)]

    def run(self, tensors) -> list:
        """The eager bridge on the op's tensors (torch.autograd through Tiga's VJP when
        they require grad); a stencil result comes back in lattice shape when its fields
        came in it, as from an eager call."""
        call = self.call_with(tensors)
        outs = run_call_torch(call)
        if self.lattice:
            outs = call.restore_lattice(outs)
        return list(outs) if isinstance(outs, tuple) else [outs]

    def call_with(self, tensors) -> PropagateCall:
        graph, edge_fn, reducer, update, reduce_by = self.parts
        fields = {r: {} for r in ROLES}
        params = {k: _unconst(v) for k, v in self.consts}
        for (role, name), t in zip(self.slots, tensors):
            (params if role == "param" else fields[role])[name] = t
        call = PropagateCall(graph, edge_fn, reducer, fields["src"], fields["dst"],
                             fields["edge"], update, params, reduce_by=reduce_by)
        for (role, name), t in zip(self.slots, tensors):
            if role != "param":   # a generated relation's coordinates: the op's tensor
                call.fields[role][name] = t
        return call


def _split(fn) -> tuple:
    """(owner, function) of a bound method, (None, fn) otherwise: Dynamo passes objects
    and functions to `_register`, not bound methods."""
    if isinstance(fn, types.MethodType):
        return fn.__self__, fn.__func__
    return None, fn


def _reducer_arg(reducer):
    """A built-in reducer as its settings: `tg.sum()` is often made inside the compiled
    region, where Dynamo holds the object's attributes, not the object (rebuilt by
    `_reducer`). A user reducer (callables) is passed as the object it is."""
    if reducer.builtin:   # (not its identity: a float Dynamo may make symbolic)
        return ("builtin", reducer.name, _const(reducer.prune_threshold),
                _const(reducer.empty), reducer.of)
    return reducer


def _reducer(arg) -> Reducer:
    if not isinstance(arg, tuple):
        return arg
    _, name, prune_threshold, empty, of = _unconst(arg)
    identity = getattr(reducers, name)().identity   # every built-in's factory has defaults
    return Reducer(name, identity, _builtin=True, prune_threshold=prune_threshold,
                   empty=empty, of=of)


def _join(owner, fn):
    return fn if owner is None else types.MethodType(fn, owner)


@torch._dynamo.assume_constant_result
def _register(*parts) -> tuple:
    """(key of this call site's entry, None), or (-1, the name of an eager fallback) when
    the call cannot be one op (Dynamo would turn an exception raised here into an internal
    error; the fallback's graph break names the reason instead)."""
    try:
        return _entry_key(*parts), None
    except Exception as exc:   # noqa: BLE001 - any failure here becomes an eager fallback
        # (e.g. a layer object made inside the compiled region: Dynamo hands us its shell)
        reason = f"Tiga: this call cannot be one torch op: {type(exc).__name__}: {exc}"
    with _LOCK:
        name = _FALLBACKS.setdefault(reason, f"fallback{len(_FALLBACKS)}")
        if not hasattr(_CAPTURED, name):
            setattr(_CAPTURED, name, torch._dynamo.disable(_eager_call, reason=reason))
    return -1, name


def _eager_call(graph, edge_fn, reducer, update, reduce_by, fields, params, lattice):
    """The call run by Tiga outside Dynamo (torch.autograd through the bridge), where it
    runs, or raises its own error."""
    if lattice:   # met at tg.propagate / MessagePassing.__call__: check as they do
        check_keywords("tg.propagate", ("graph", "src", "dst", "edge"), edge_fn, update,
                       params)
    call = PropagateCall(graph, edge_fn, reducer, fields["src"], fields["dst"],
                         fields["edge"], update, params, reduce_by=reduce_by)
    return run_call(call) if lattice else run_call_torch(call)


def _entry_key(graph, edge_owner, edge_fn, update_owner, update, reducer, reduce_by, slots,
               shapes, consts, skipped, lattice) -> int:
    """The key of a call site's entry (made once: staged on stand-in tensors of the traced
    shapes, which gives the captured tensors and the output types)."""
    ident = (id(graph), id(edge_owner), edge_fn, id(update_owner), update,
             reducer if isinstance(reducer, tuple) else id(reducer), reduce_by, slots, shapes,
             consts, lattice)
    edge_fn, update = _join(edge_owner, edge_fn), _join(update_owner, update)
    reducer = _reducer(reducer)
    with _LOCK:
        if ident in _KEYS:
            return _KEYS[ident]
    stand_ins = [torch.zeros((), dtype=dtype).expand(shape) for shape, dtype in shapes]
    entry = _Entry((graph, edge_fn, reducer, update, reduce_by), slots, consts, lattice)
    call = entry.call_with(stand_ins)
    _check_tensor_fields(call, skipped)
    program, _, originals, _ = stage_call_torch(call)
    captured = entry.captured = tuple(originals[:len(originals) - len(call.values())])
    _check_captured(captured)
    flat = tuple(torch.empty(tuple(int(d) for d in t.shape), dtype=_torch_dtype(t.dtype.np))
                 for t in program.out_types)
    entry.out_types = [(tuple(t.shape), t.dtype)
                       for t in (call.restore_lattice(flat) if lattice else flat)]
    with _LOCK:
        key = _KEYS.setdefault(ident, _fresh_key())
        if _ENTRIES.setdefault(key, entry) is entry:
            setattr(_CAPTURED, f"k{key}", captured)
    return key


def _check_tensor_fields(call, skipped) -> None:
    """A field that is not a tensor reaches the op only if the call makes it itself (a
    generated relation's coordinates, arg-reducer ids); a user's numpy field would not."""
    lost = [n for n in skipped if n.split(".", 1)[1] not in call.fields[n.split(".")[0]]]
    if lost:
        raise UnsupportedError(
            f"{lost[0]}: is not a torch tensor; inside torch.compile a Tiga call's fields "
            "are torch tensors (they become inputs of its torch op)",
            hint="pass torch.as_tensor(array) instead of the numpy array")


def _check_captured(captured) -> None:
    """A captured tensor computed while tracing (`w * 2` in the edge function) would be a
    constant of the compiled graph, its gradient sent once into a stale autograd graph."""
    for i, t in enumerate(captured):
        if t.grad_fn is not None:
            raise UnsupportedError(
                f"captured value {i}: the edge/update function computes a tensor from a "
                "parameter while it is traced (e.g. `w * 2`); inside torch.compile that "
                "value would be fixed when the model compiles",
                hint="capture parameters directly (tg.nn.trace modules or tensors the layer "
                     "holds) and compute with tg.math inside the edge function, or pass the "
                     "tensor as a keyword parameter of the call")


def _fresh_key() -> int:
    """A random key, not a counter: the key is a constant of the compiled graph, and
    inductor's on-disk cache must never pair one process's graph (its output shapes) with
    another process's entry that happened to get the same number."""
    while True:
        key = secrets.randbits(62)
        if key not in _ENTRIES:
            return key


def _torch_dtype(np_dtype):
    return to_torch(np.zeros(0, np_dtype)).dtype   # (bfloat16 included)


@torch.library.custom_op("tiga::call", mutates_args=())
def _call_op(key: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    entry = _ENTRIES[key]
    n = len(entry.slots)     # the captured tensors after them are read from their owners
    with torch.no_grad():
        outs = entry.run(list(tensors[:n]))
    # a custom op's outputs may not alias its inputs (an update returning a field as is)
    return [o.clone() if any(_aliases(o, t) for t in tensors) else o for o in outs]


@_call_op.register_fake
def _call_fake(key, tensors):
    device = tensors[0].device if tensors else torch.device("cpu")
    return [torch.empty(shape, dtype=dtype, device=device)
            for shape, dtype in _ENTRIES[key].out_types]


@torch.library.custom_op("tiga::call_vjp", mutates_args=())
def _vjp_op(key: int, tensors: list[torch.Tensor], cts: list[torch.Tensor],
            wrt: list[bool]) -> list[torch.Tensor]:
    """Gradients for the tensors marked in `wrt`, by the eager bridge (Tiga's VJP program)."""
    entry = _ENTRIES[key]
    n = len(entry.slots)
    leaves = [t.detach().requires_grad_(w) for t, w in zip(tensors[:n], wrt)]
    targets = [x for x, w in zip(leaves + list(entry.captured), wrt) if w]
    with torch.enable_grad():
        outs = entry.run(leaves)
        pairs = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], targets, [c for _, c in pairs],
                                    allow_unused=True) if pairs else [None] * len(targets)
    return [torch.zeros_like(x) if g is None else g.detach() for g, x in zip(grads, targets)]


def _vjp_fake(key, tensors, cts, wrt):
    """Shapes of a VJP op's results: one per input it differentiates (`wrt`)."""
    return [torch.empty_like(t) for t, w in zip(tensors, wrt) if w]


_vjp_op.register_fake(_vjp_fake)


def _setup(ctx, inputs, output):
    """Saves a (key, tensors) op's inputs for its backward (tiga::call and tiga::layer)."""
    key, tensors = inputs
    ctx.key = key
    ctx.save_for_backward(*tensors)


def _backward(ctx, grads):
    tensors = ctx.saved_tensors
    wrt = [bool(w) and t.is_floating_point()
           for w, t in zip(ctx.needs_input_grad[1], tensors)]
    shapes = _ENTRIES[ctx.key].out_types
    cts = [torch.zeros(shape, dtype=dtype, device=tensors[0].device) if g is None else g
           for g, (shape, dtype) in zip(grads, shapes)]
    got = iter(torch.ops.tiga.call_vjp(ctx.key, list(tensors), cts, wrt) if any(wrt) else [])
    return None, [next(got) if w else None for w in wrt]


_call_op.register_autograd(_backward, setup_context=_setup)


def _aliases(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (is_torch(b) and a.device == b.device and a.numel() > 0 and b.numel() > 0 and
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
