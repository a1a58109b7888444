"""api: composes the layers into jit, grad, value_and_grad, vjp and the propagate hooks."""
from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable

import numpy as np

from . import opt
from .autodiff import vjp_program
from .autodiff.inlining import inline_custom_calls
from .autodiff.remat import residual_bytes
from .core.errors import DTypeError, ShapeError, TigaError
from .core.passes import bind_constants, dce
from .core.program import GraphProgram, Lit
from .core.types import GraphType, TensorType
from .lower.backends import using_backend
from .trace import call_cache, control, message_passing, warm_calls
from .trace.guards import pinned_ids
from .trace.pytree import tree_flatten, tree_unflatten
from .trace.staging import _as_tuple, inline_program, leaf_aval, leaf_value, trace_args, trace_flat
from .trace.tracer import NeedsTorchBridge, Tracer, current_builder, lifted
from .xla_free_runtime.executor import (
    call_backend,
    call_task_ir,
    execute,
    explain_program,
    ir_module_name,
    ir_text,
    prepared_for,
    run_prepared,
    set_tensor_hook,
)
from .xla_free_runtime.memory.tensor import Tensor, _wrap
from .xla_free_runtime.reports.runs import explaining, profile


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def run_program(program, args) -> list:
    """Inline into the current trace when an argument is traced, else execute."""
    if current_builder() is not None and any(isinstance(a, Tracer) for a in args):
        return inline_program(program, *args)
    return [_wrap(o) for o in execute(program, [leaf_value(a) for a in args])]


_STAGED = opt.ProgramFacts("staged")
_VJP = opt.ProgramFacts("vjp")


def _staged_passes(program):
    """A traced forward after the program passes of stage "staged" (before autodiff: the
    VJP is derived from the rewritten, edge-loop-lean program)."""
    return opt.optimize_program(program, _STAGED)[0]


def _executed_passes(program, kinds: dict):
    """`program` after the passes of stage "execute" (`kinds`: opt.relation_kinds), its
    custom_vjp / custom_jvp calls inlined first: their rules matter to the transformations
    only, and a call run as such would run its function on the reference interpreter (a
    tg.fixed_point's loop and propagates included) instead of compiling it."""
    facts = opt.ProgramFacts("execute", relation_kinds=tuple(sorted(kinds.items())))
    return opt.optimize_program(inline_custom_calls(program), facts)[0]


def run_staged(program, args, memo: dict | None = None) -> list:
    """`run_program` for a program tg.grad / tg.vjp / tg.jit traced: executed, it first gets
    the program passes of stage "execute" (tiga/opt: one walk for independent propagates
    over a radius/knn relation, a + (-b) as a - b, common subexpressions once), which
    depend on the concrete relations' kinds; inlined into an outer trace it stays as
    traced (the outer program is rewritten when it runs). `memo` keeps the rewritten
    program per kinds for a caller that runs the same program again."""
    if current_builder() is not None and any(isinstance(a, Tracer) for a in args):
        return inline_program(program, *args)
    values = [leaf_value(a) for a in args]
    return [_wrap(o) for o in execute(_executed(program, values, memo), values)]


def _executed(program, values: list, memo: dict | None):
    """`program` as a call on `values` executes it (`_executed_passes`), kept in `memo` per
    relation kinds: the same object for every call, so its lowering is found again."""
    kinds = opt.relation_kinds(program, values)
    key = tuple(sorted(kinds.items()))
    rewritten = None if memo is None else memo.get(key)
    if rewritten is None:
        rewritten = _executed_passes(program, kinds)
        if memo is not None:
            memo[key] = rewritten
    return rewritten


class Jitted:
    """`tg.jit(f)`: traced once per input signature (types, static args), then cached;
    Python values read at trace time stay baked in (JAX semantics, see `jit`)."""

    def __init__(self, fn: Callable, static_argnums=()):
        self.fn = fn
        self.static = _as_tuple(static_argnums)
        self._cache: dict = {}
        self.hits = self.misses = 0
        functools.update_wrapper(self, fn)

    def _signature(self, args):
        dyn = [a for i, a in enumerate(args) if i not in self.static]
        leaves, tree = tree_flatten(dyn)
        statics = tuple(args[i] for i in self.static if i < len(args))
        try:
            hash(statics)
        except TypeError as exc:
            raise TigaError("jit: static arguments must be hashable") from exc
        return (tree, tuple(leaf_aval(x) for x in leaves), statics), leaves

    def _program(self, args):
        key, leaves = self._signature(args)
        if key in self._cache:
            self.hits += 1
        else:
            self.misses += 1
            # (disk tensors fn closes over are lifted: the program's first inputs, kept
            # with the entry as a literal would be, paged when it runs)
            program, caps, out_tree = trace_args(self.fn, args, self.static, lift=True)
            program = _staged_passes(program)
            self._cache[key] = (program, out_tree, {}, tuple(caps))
        return (*self._cache[key], leaves)

    def __call__(self, *args):
        if current_builder() is not None:
            return self.fn(*args)  # inside another transformation: trace inline
        program, out_tree, memo, caps, leaves = self._program(args)
        return tree_unflatten(out_tree, run_staged(program, [*caps, *leaves], memo))

    def lower(self, *args) -> Lowered:
        program, out_tree, memo, caps, leaves = self._program(args)
        return Lowered(program, out_tree, ir_module_name(getattr(self.fn, "__name__", "main")),
                       caps, leaves, memo)

    def cache_info(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._cache)}


class Lowered:
    """`tg.jit(f).lower(*args)`: the traced program, before execution. It (and its IR
    levels) shows the program as traced: a VJP's cotangent propagates stay separate. A call
    runs it after the program passes of stage "execute" (`run_staged`), which `Compiled.explain()`
    describes: there, independent propagates over one radius/knn relation are one walk."""

    def __init__(self, program, out_tree, name: str = "main", caps=(), leaves=None,
                 memo: dict | None = None):
        self.program = program
        self._out_tree = out_tree
        self.name = name
        self.caps = tuple(caps)     # lifted disk tensors: the program's first inputs
        self._leaves = leaves       # the arguments it was lowered for (None: types only)
        self._memo = {} if memo is None else memo    # the jit entry's executed programs

    def ir(self, stage: str = "program") -> str:
        """"program" (the GraphProgram) or an IR level: "domain", "iter", "kernel", "task".
        With the arguments it was lowered for, "task" is the Task module a call on them runs:
        the program after the passes of stage "execute", bound to the call's relations."""
        if stage == "program":
            return str(self.program)
        if stage == "task" and self._leaves is not None:
            values = [leaf_value(a) for a in [*self.caps, *self._leaves]]
            # (the program a call runs: its lowering is the call's, printed, not redone)
            return call_task_ir(_executed(self.program, values, self._memo), values,
                                name=self.name)
        return ir_text(self.program, stage, name=self.name)

    def compile(self) -> Compiled:
        return Compiled(self.program, self._out_tree, self.caps)


class Compiled:
    def __init__(self, program, out_tree, caps=()):
        self.program = program     # as traced (what Lowered prints)
        self._out_tree = out_tree
        self._memo: dict = {}
        self.caps = tuple(caps)

    def __call__(self, *args):
        leaves, _ = tree_flatten(list(args))
        return tree_unflatten(self._out_tree, run_staged(self.program, [*self.caps, *leaves],
                                                         self._memo))

    def explain(self):
        # what a call executes: the relations the program generates have static kinds
        program = _executed_passes(self.program, opt.relation_kinds(self.program))
        ex = explain_program(program, [])
        kept = residual_bytes(program)
        if kept:     # a gradient through repeat / scan: the carries its backward reads
            ex.materialized.append((
                "loop carries kept for the backward pass", kept,
                "the VJP of repeat/scan/fori_loop stores them in the forward; "
                "tg.checkpoint(f, policy) keeps fewer and recomputes the rest"))
            ex.estimated_bytes += kept
        return ex


def jit(fn: Callable | None = None, static_argnums=()):
    """Trace `fn` once per input signature (argument types, static arguments), then run
    the cached program.

    Like `jax.jit`, the trace fixes every Python value `fn` reads outside its arguments
    (module globals, attributes, closure cells): a later change is not seen by calls with a
    known signature. Pass such values as arguments, or make a new `tg.jit(fn)`. Plain
    calls, `tg.grad`, `tg.value_and_grad` and `tg.vjp` instead check what their trace read
    on every call and trace again when it changed (trace/guards.py).

    Args:
        fn (Callable | None): the function; arrays (numpy, tg.Tensor, torch) and pytrees
            of them in, the same out. `tg.jit(static_argnums=...)` without `fn` returns a
            decorator.
        static_argnums (int | tuple[int, ...]): positions of hashable arguments that are
            part of the signature (a new value traces again) instead of traced.

    Returns:
        Jitted: callable like `fn`; `.lower(*args)` inspects the traced program,
            `.cache_info()` counts hits and misses.
    """
    if fn is None:
        return lambda f: Jitted(f, static_argnums)
    return Jitted(fn, static_argnums)


# ---- reverse mode ---------------------------------------------------------------------

class _Traced:
    """f traced at concrete argument types, with the positions to differentiate. Cached
    per (f, argnums, has_aux, input types) without its leaves; `at(leaves)` binds a call's."""

    def __init__(self, fn, args, argnums, has_aux):
        self.argnums = argnums
        leaves, self.in_tree = tree_flatten(list(args))
        self.leaves = leaves
        self.owner = _leaf_owner(args)
        self.has_aux = has_aux
        out_tree = []

        def flat(*xs):
            rebuilt = tree_unflatten(self.in_tree, list(xs))
            out = fn(*rebuilt)
            if has_aux:
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise TigaError("has_aux=True: the function must return (output, aux)")
                out, aux = out
            else:
                aux = None
            out_leaves, tree = tree_flatten(out)
            aux_leaves, aux_tree = tree_flatten(aux)
            out_tree.append((tree, aux_tree, len(out_leaves)))
            return out_leaves + aux_leaves

        # (disk tensors fn closes over are lifted: inputs of the program, paged like an
        # argument, never differentiated)
        self.program, self.caps, _ = trace_flat(flat, [leaf_aval(x) for x in leaves],
                                                lift=True)
        self.program = _staged_passes(self.program)
        self.out_tree, self.aux_tree, self.n_out = out_tree[0]
        self.wrt = [False] * len(self.caps) + [self._differentiated(i) for i in range(len(leaves))]
        self.leaves = None    # the tracing call's arrays: not kept alive by a cache entry

    def at(self, leaves) -> _Traced:
        bound = copy.copy(self)
        bound.leaves = leaves
        return bound

    def reusable(self, guards) -> bool:
        """The program reads no value of this trace only (an outer tracer, an array made
        while tracing): its array literals and lifted disk tensors are objects the guards
        pin by identity."""
        pinned = pinned_ids(guards)
        if any(not lifted(c) or id(c) not in pinned for c in self.caps):
            return False
        lits = [a for e in self.program.eqns for a in e.inputs] + list(self.program.outs)
        return all(id(a.value) in pinned for a in lits if isinstance(a, Lit)
                   and not (isinstance(a.type, TensorType) and a.type.ndim == 0))

    def _differentiated(self, i) -> bool:
        if self.owner[i] not in self.argnums:
            return False
        t = leaf_aval(self.leaves[i])
        if isinstance(t, GraphType):
            raise TigaError(f"argument {self.owner[i]}: cannot differentiate with respect to a "
                            "relation (topology is discrete); differentiate its fields")
        if not t.dtype.is_float:
            raise DTypeError(f"argument {self.owner[i]}: gradients need floating inputs, "
                             f"found {t}")
        return True

    def args(self):
        return list(self.caps) + list(self.leaves)

    def split(self, outs):
        main = tree_unflatten(self.out_tree, outs[:self.n_out])
        aux = tree_unflatten(self.aux_tree, outs[self.n_out:])
        return main, aux

    def grads_tree(self, grads, argnums_tuple):
        it = iter(grads)
        per_leaf = [next(it) if w else None for w in self.wrt[len(self.caps):]]
        rebuilt = tree_unflatten(self.in_tree, per_leaf)
        trees = [rebuilt[a] for a in self.argnums]
        return tuple(trees) if argnums_tuple else trees[0]


def _leaf_owner(args) -> list:
    owner = []
    for i, a in enumerate(args):
        owner += [i] * len(tree_flatten(a)[0])
    return owner


def _cotangent_seeds(traced, outs_types, scalar_only):
    seeds = []
    for k, t in enumerate(outs_types):
        if k < traced.n_out:
            seeds.append(np.ones((), t.dtype.np) if scalar_only else None)
        else:
            seeds.append(np.zeros(t.shape, t.dtype.np))
    return seeds


def _check_scalar_output(traced) -> None:
    """tg.grad differentiates one scalar: a tuple or an array output is an error (as in
    JAX), never a silent sum of its parts."""
    what = "the function's output" + (" (the first element, has_aux=True)"
                                      if traced.has_aux else "")
    if traced.out_tree.kind != "leaf":
        kinds = {"tuple": "a tuple", "list": "a list", "dict": "a dict", "none": "None"}
        raise ShapeError(f"grad requires a scalar output: {what} is "
                         f"{kinds[traced.out_tree.kind]} of {traced.n_out} array(s); use "
                         "has_aux=True to return (output, aux), or tg.vjp for several outputs")
    t = traced.program.out_types[0]
    if not isinstance(t, TensorType) or t.shape != () or not t.dtype.is_float:
        raise ShapeError(f"grad requires a scalar output: {what} must be a float scalar, "
                         f"found {t}; reduce it (tg.math.sum) or use tg.vjp for non-scalar "
                         "outputs")


def _traced_for(fn, what, nums, has_aux, args, derive, reads=None):
    """(traced bound to this call's leaves, *derived): `fn` traced and `derive(traced)` run
    once per (fn, options, input types), reused while what fn read is unchanged."""
    leaves, in_tree = tree_flatten(list(args))
    # (numpy leaves keyed by shape and dtype: hashing and comparing their TensorTypes, which
    # are Python dataclasses, cost a warm tg.grad call about as much as its kernel launch)
    extra = (what, nums, has_aux, in_tree, tuple(call_cache.type_key(x) for x in leaves))

    def build(guards):
        traced = _Traced(fn, args, nums, has_aux)
        derived = derive(traced)
        return (traced, *derived), traced.reusable(guards)

    traced, *derived = call_cache.reuse_transform(fn, extra, build, reads)
    return (traced.at(leaves), *derived)


def value_and_grad(fn: Callable, argnums=0, has_aux: bool = False):
    """`tg.value_and_grad(f)(*args)` -> `(f(*args), gradient)`, from one forward pass.

    Args:
        fn (Callable): returns a scalar array (or `(scalar, aux)` with has_aux).
        argnums (int | tuple[int, ...]): the arguments to differentiate.
        has_aux (bool): `fn` returns `(value, aux)`; aux is returned, not differentiated.

    Returns:
        Callable: `(*args) -> (value, grads)`, or `((value, aux), grads)` with has_aux;
            grads is one gradient (argnums an int) or a tuple of them, each shaped like
            its argument (tg.Tensor for numpy inputs).
    """
    argnums_tuple = isinstance(argnums, (tuple, list))
    nums = _checked_argnums(argnums)

    @functools.wraps(fn)
    def wrapped(*args):
        _check_argnums(nums, args)
        traced, vjp, memo, _, _ = _traced_for(fn, "grad", nums, has_aux, args, _grad_programs)
        seeds = _cotangent_seeds(traced, traced.program.out_types, scalar_only=True)
        res = run_staged(vjp, traced.args() + seeds, memo)
        outs, grads = res[:len(seeds)], res[len(seeds):]
        value, aux = traced.split(outs)
        grads = traced.grads_tree(grads, argnums_tuple)
        return ((value, aux) if has_aux else value), grads

    return wrapped


def _grad_programs(traced) -> tuple:
    """(joint program, its memo, gradient program, its memo), derived once per trace for
    tg.value_and_grad and tg.grad alike. The gradient program is the joint one without the
    primal value (tg.grad discards it) and with its seeds bound as constants, so dce drops
    forward work the gradient does not read, as tg.jit(tg.grad(f)) does; aux outputs stay."""
    _check_scalar_output(traced)
    joint = opt.optimize_program(vjp_program(traced.program, traced.wrt), _VJP)[0]
    n_seeds = len(traced.program.out_types)
    keep = joint.outs[traced.n_out:n_seeds] + joint.outs[n_seeds:]
    seeds = _cotangent_seeds(traced, traced.program.out_types, scalar_only=True)
    first = len(joint.in_binders) - n_seeds
    grads = bind_constants(GraphProgram(joint.in_binders, joint.eqns, keep),
                           {first + k: s for k, s in enumerate(seeds)})
    return joint, {}, dce(grads), {}


def grad(fn: Callable, argnums=0, has_aux: bool = False):
    """`tg.grad(f)(*args)`: the gradient of the scalar `f` with respect to `argnums`.

    Args:
        fn (Callable): returns a scalar array (or `(scalar, aux)` with has_aux); a tuple or
            an array output is an error, never a silent sum.
        argnums (int | tuple[int, ...]): the arguments to differentiate.
        has_aux (bool): `fn` returns `(value, aux)`; then `(grads, aux)` is returned.

    Returns:
        Callable: `(*args) -> grads`, one gradient (argnums an int) or a tuple of them,
            each shaped like its argument.
    """
    argnums_tuple = isinstance(argnums, (tuple, list))
    nums = _checked_argnums(argnums)

    @functools.wraps(fn)
    def wrapped(*args):
        _check_argnums(nums, args)
        traced, _, _, program, memo = _traced_for(fn, "grad", nums, has_aux, args,
                                                  _grad_programs)
        res = run_staged(program, traced.args(), memo)
        n_aux = len(traced.program.out_types) - traced.n_out
        grads = traced.grads_tree(res[n_aux:], argnums_tuple)
        if not has_aux:
            return grads
        return grads, tree_unflatten(traced.aux_tree, res[:n_aux])

    return wrapped


def _vjp_programs(traced) -> tuple:
    """(the backward program, memos): the derived program without the primal outputs
    (vjp_fn runs after the forward already did), so dce drops forward work the cotangents
    do not read (a linear propagate's whole forward walk)."""
    joint = opt.optimize_program(vjp_program(traced.program, traced.wrt), _VJP)[0]
    n = len(traced.program.out_types)
    backward = GraphProgram(joint.in_binders, joint.eqns, joint.outs[n:])
    return dce(backward), {}, {}


def vjp(fn: Callable, *primals, has_aux: bool = False):
    """`out, vjp_fn = tg.vjp(f, *primals)`; `vjp_fn(ct)` returns one cotangent per primal.

    Args:
        fn (Callable): any function of arrays (its output need not be a scalar).
        *primals (array): the point to differentiate at.
        has_aux (bool): `fn` returns `(out, aux)`; then `(out, vjp_fn, aux)` is returned.

    Returns:
        tuple: `(out, vjp_fn)`, where `vjp_fn(cotangent)` (shaped like `out`; a disk
            tensor for a paged result) returns a tuple with one cotangent per primal.
    """
    nums = tuple(range(len(primals)))
    traced, program, memo_fwd, memo = _traced_for(fn, "vjp", nums, has_aux, primals,
                                                  _vjp_programs)
    outs = run_staged(traced.program, traced.args(), memo_fwd)
    value, aux = traced.split(outs)
    out_types = traced.program.out_types

    def vjp_fn(ct):
        ct_leaves, ct_tree = tree_flatten(ct)
        if ct_tree != traced.out_tree:
            raise ShapeError("vjp_fn: the cotangent must have the structure of the output")
        for c, t in zip(ct_leaves, out_types):
            if tuple(np.shape(c)) != tuple(t.shape):
                raise ShapeError(f"vjp_fn: cotangent shape {np.shape(c)} differs from the "
                                 f"output's {t}")
        seeds = [leaf_value(c) if not isinstance(c, Tracer) else c for c in ct_leaves]
        # a Tensor of the output's dtype stays on its tier (a disk cotangent of a paged
        # program is read page by page)
        seeds = [s if isinstance(s, Tracer) or (isinstance(s, Tensor) and
                                                s._type.dtype == t.dtype)
                 else np.asarray(s, t.dtype.np) for s, t in zip(seeds, out_types)]
        seeds += _cotangent_seeds(traced, out_types, False)[traced.n_out:]
        return traced.grads_tree(run_staged(program, traced.args() + seeds, memo), True)

    return ((value, vjp_fn, aux) if has_aux else (value, vjp_fn))


def _checked_argnums(argnums) -> tuple:
    """`argnums` as a tuple of distinct non-negative ints, else a TigaError that says why."""
    many = isinstance(argnums, (tuple, list))
    items = tuple(argnums) if many else (argnums,)
    if many and not items:
        raise TigaError("argnums: must name at least one positional argument, found ()")
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TigaError(f"argnums: must be an int or a tuple of ints (positions of "
                            f"positional arguments), found {a!r} ({type(a).__name__})")
        if a < 0:
            raise TigaError(f"argnums: positions must be non-negative, found {int(a)}")
    nums = tuple(int(a) for a in items)
    if len(set(nums)) != len(nums):
        raise TigaError(f"argnums: positions must be distinct, found {nums} (repeated)")
    return nums


def _check_argnums(nums, args):
    for a in nums:
        if not 0 <= a < len(args):
            raise TigaError(f"argnums: {a} is out of range: the function was called with "
                            f"{len(args)} positional argument(s), so argnums must be < "
                            f"{len(args)}")


# ---- message-passing calls with concrete inputs -----------------------------------------

def _has_torch(call) -> bool:
    return (_is_torch(call.graph) or any(_is_torch(v) for f in call.fields.values()
                                         for v in f.values()) or
        any(_is_torch(v) for v in call.params.values()))


_HOST_LEAVES = frozenset({np.ndarray, float, int, bool})


def _host_numpy(call) -> bool:
    """Every operand is a numpy array or a Python number and the relation lives on the host:
    no device to route and no torch tensor (decided from types alone, the common warm call)."""
    g = call.graph
    if getattr(g, "device", "cpu") != "cpu" or _is_torch(g):
        return False
    for fields in call.fields.values():
        for v in fields.values():
            if type(v) not in _HOST_LEAVES:
                return False
    return all(type(v) in _HOST_LEAVES for v in call.params.values())


def _execute_call(call):
    if not _host_numpy(call):
        if _torch_compiling():   # torch.compile's trace: the call becomes one opaque torch op
            from .torch_bridge.compiled import compiled_call
            return compiled_call(call)
        # a torch call: the bridge routes it (its own device check, decided from the
        # operands' types where everything is on the host: no DLPack query per operand)
        if _has_torch(call):
            return _torch_call(call, "auto")
        # CUDA inputs run on the triton backend or raise here, before any copy to the host
        if call_backend(call) is not None:
            _triton_tensors().adopt_cuda(call)   # CUDA DLPack producers as torch tensors
            if _has_torch(call):
                return _torch_call(call, "auto")
    try:
        # no retrace for a known signature
        program, args = call_cache.staged_program(call, _staged_passes)
    except NeedsTorchBridge:  # the edge function captured a torch Parameter
        return _torch_call(call, "auto")
    outs = run_program(program, args)
    if (call.layer is not None and call.cached is not None and
            current_builder() is None and prepared_for(program, args)):
        warm_calls.remember(call, program)    # its next call: straight to the launch list
    return outs[0] if len(outs) == 1 else tuple(outs)


def _run_warm(program, args):
    """A layer call whose signature ran on a prepared launch list before (trace/warm_calls
    checked it and lists `args`): its result as the layer returns it, or None when the
    runtime has no prepared list for it now (the full path runs)."""
    outs = run_prepared(program, args, host_args=True)
    if outs is None:
        return None
    return _wrap(outs[0]) if len(outs) == 1 else tuple(_wrap(o) for o in outs)


def _torch_compiling() -> bool:
    torch = sys.modules.get("torch")   # never imports torch: a torch.compile trace has it
    return torch is not None and torch.compiler.is_compiling()


def _torch_compiled(*parts):
    """A message-passing call met by torch.compile's trace, before any Tiga code runs."""
    from .torch_bridge.compiled import compiled_propagate
    return compiled_propagate(*parts)


def _torch_call(call, route):
    from .torch_bridge.autograd import run_call_torch

    return run_call_torch(call, route=route)


def _explain_call(call, run: bool = False):
    """explain(): the route of `call` without running it; `run`: it runs under a profile of
    its own first, and the explanation carries (and reads) that run's report."""
    report = None
    if run:
        with profile() as prof:
            _execute_call(call)
        report = prof.calls[-1] if prof.calls else None
    # CUDA inputs: explained on the backend the call runs on (triton), or the call's error
    backend = call_backend(call)
    if backend is not None and not _has_torch(call):
        _triton_tensors().adopt_cuda(call)
    with using_backend(backend), explaining(report):
        ex = _explain_selected(call)
    ex.run_report = report
    return ex


def _explain_selected(call):
    staged = None
    if not any(_is_torch(v) for v in call.values()):
        try:
            staged = call.staged_program()
        except NeedsTorchBridge:
            pass
    if staged is None:
        from .torch_bridge.autograd import explain_call_torch

        return explain_call_torch(call)
    program, args = staged
    program, notes = opt.optimize_program(program, _STAGED)   # what the run executes
    explanation = explain_program(program, [leaf_value(a) for a in args])
    explanation.traversal.extend(notes)
    return explanation


def _reference_call(call):
    if any(_is_torch(v) for v in call.values()):
        return _torch_call(call, "reference")
    from .core.eval import eval_program

    try:
        program, args = call.staged_program()
    except NeedsTorchBridge:
        return _torch_call(call, "reference")
    if current_builder() is not None and any(isinstance(a, Tracer) for a in args):
        # reference() is differentiable: under tg.grad/jit, stage the call into the trace
        outs = inline_program(program, *args)
    else:
        outs = [_wrap(o) for o in eval_program(program, *[leaf_value(a) for a in args])]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _ir_call(call, stage):
    program, args = call.staged_program()
    if stage == "program":
        return str(program)
    owner = getattr(call.edge_fn, "__self__", None)
    name = type(owner).__name__ if owner is not None else getattr(call.edge_fn, "__name__", "")
    if stage == "task":     # the bound Task module (a stored relation's page plan) it runs
        program, args = call_cache.staged_program(call, _staged_passes)
        return call_task_ir(program, [leaf_value(a) for a in args], name=ir_module_name(name))
    return ir_text(program, stage, name=ir_module_name(name))


def _eager_loop(looped: Callable, init, user_fns: tuple):
    """A tg.repeat / tg.while_loop called outside any trace: `looped(state)` stages the loop;
    it is traced once per body and input types (the cache tg.grad's functions use, guarded by
    what `user_fns` read) and runs as a program on the compiled path, exactly as under
    tg.jit."""
    traced, memo = _traced_for(looped, "loop", (), False, (init,), lambda _: ({},), user_fns)
    return traced.split(run_staged(traced.program, traced.args(), memo))[0]


control.hooks["eager"] = _eager_loop
message_passing.hooks.update(compiling=_torch_compiling, compiled=_torch_compiled,
                             execute=_execute_call, explain=_explain_call,
                             warm=functools.partial(warm_calls.run, runner=_run_warm),
                             reference=_reference_call, ir=_ir_call)


@functools.cache     # (looked up on every launch of a warm triton call)
def _triton_tensors():
    from .torch_bridge import triton_buffers  # torch only when a Triton kernel launches
    return triton_buffers


set_tensor_hook(_triton_tensors)

__all__ = ["jit", "grad", "value_and_grad", "vjp", "Jitted", "Lowered", "Compiled", "Tensor"]
