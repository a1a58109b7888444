"""torch_bridge: any Tiga program as a torch autograd node that torch.func can transform.

`ProgramFunction` runs a `Node` (a program, its constant operands and the positions of its
torch tensor operands). Its `vmap`, `jvp` and `backward` rules derive Tiga's batched, JVP
and VJP programs of the node's program (`batch_program`, `jvp_program`, `vjp_program`, once
per program structure and pattern) and run each by a node of this class again, so every
composition torch builds (hessian, grad of grad, vmap of grad, jacrev / jacfwd, create_graph)
runs Tiga's own rules. autograd.py sends a call here under torch.func.vmap, forward mode
and nested differentiation, and its eager node's differentiable or batched backward.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from .. import opt
from ..autodiff import jvp_program, vjp_program
from ..autodiff.batching import batch_program
from ..autodiff.inlining import inline_custom_calls
from ..core.eval import on_device
from ..core.passes import dce
from ..core.prims.shape import transpose_p
from ..core.program import GraphProgram
from ..core.types import TensorType
from .dlpack import to_numpy, to_torch
from .transforms import has_tangent, transform_depth

_DERIVED: OrderedDict = OrderedDict()   # (program, kind, key) -> derived program
_EXECUTED: OrderedDict = OrderedDict()  # (program, relation kinds) -> rewritten program
_MEMO_SIZE = 256
_JVP_FACTS = opt.ProgramFacts("vjp")    # derived programs get the passes a VJP gets


def _memo(memo: OrderedDict, key, make):
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = make()
        if len(memo) > _MEMO_SIZE:
            memo.popitem(last=False)
    else:
        memo.move_to_end(key)
    return hit


class Node:
    """A Tiga program, its constant operands (`static`, None at `slots`) and the binder
    positions `slots` of the torch tensors handed to `ProgramFunction.apply`, in order
    (ascending). The programs torch.func asks for (VJP, JVP, batched) are derived once per
    program structure and pattern, and run by nodes of their own."""

    __slots__ = ("program", "static", "slots", "route", "backend", "device", "runner",
                 "tangents", "tangent_outs")

    def __init__(self, program, static, slots, route, backend, device, runner,
                 tangents=None):
        self.program, self.static, self.slots = program, list(static), list(slots)
        self.route, self.backend, self.device = route, backend, device
        self.runner = runner    # runner(route, backend) -> run(program, args) (autograd.py)
        # forward mode with plain tangents (forward_ad, one torch.func.jvp level): the
        # forward runs the JVP program, primal and tangent in one walk, and keeps the
        # tangents for the jvp rule (torch asks for them right after the forward)
        self.tangents, self.tangent_outs = tangents, None

    def derived(self, program, extra: int) -> Node:
        """A node for `program`, whose binders are this program's then `extra` more, all
        of them tensors (cotangents, tangents)."""
        n_in = len(self.program.in_binders)
        return Node(program, self.static + [None] * extra,
                    self.slots + list(range(n_in, n_in + extra)), self.route, self.backend,
                    self.device, self.runner)

    def run(self, tensors) -> list:
        keep = self.backend == "triton"
        args = list(self.static)
        for k, t in zip(self.slots, tensors):
            args[k] = t.detach() if keep and on_device(t) else to_numpy(t, f"operand {k}")
        program = self.program
        if self.route != "reference":   # the execute-stage passes, per relation kinds
            kinds = opt.relation_kinds(program, args)
            key = (program, tuple(sorted(kinds.items())))
            program = _memo(_EXECUTED, key, lambda: opt.optimize_program(
                program, opt.ProgramFacts("execute", relation_kinds=key[1]))[0])
        outs = self.runner(self.route, self.backend)(program, args)
        outs = [o if on_device(o) else np.asarray(o, t.dtype.np)
                for o, t in zip(outs, self.program.out_types)]
        return [(o if on_device(o) else to_torch(o)).to(self.device) for o in outs]

    def out_zeros(self, k: int) -> torch.Tensor:
        t = self.program.out_types[k]
        dtype = to_torch(np.zeros(0, t.dtype.np)).dtype
        return torch.zeros(tuple(t.shape), dtype=dtype, device=self.device)


def _float(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_float


def node_vjp(node: Node, tensors, needs, cts) -> list:
    """Gradients for `tensors` (the node's operands; None where `needs` is False) from the
    output cotangents `cts` (None: zeros), by a node running Tiga's VJP program."""
    types = node.program.in_types
    wrt_slot = [bool(n) and _float(types[k]) for n, k in zip(needs, node.slots)]
    if not any(wrt_slot):
        return [None] * len(tensors)
    wrt = [False] * len(types)
    for k, w in zip(node.slots, wrt_slot):
        wrt[k] = w
    n_out = len(node.program.outs)

    def make():
        full = vjp_program(node.program, wrt)
        vjp = dce(full, keep_outputs=range(n_out, len(full.outs)))
        return opt.optimize_program(vjp, _JVP_FACTS)[0]

    program = _memo(_DERIVED, (node.program, "vjp", tuple(wrt)), make)
    cts = [node.out_zeros(k) if g is None else g for k, g in enumerate(cts)]
    grads = iter(ProgramFunction.apply(node.derived(program, n_out), *tensors, *cts))
    return [next(grads) if w else None for w in wrt_slot]


def node_jvp(node: Node, tensors, tangents) -> tuple:
    """Output tangents (None for non-float outputs) from the operands' tangents (None:
    zero), by a node running Tiga's JVP program (primal and tangent messages in one walk)."""
    types, out_types = node.program.in_types, node.program.out_types
    wrt_slot = [t is not None and _float(types[k]) for t, k in zip(tangents, node.slots)]
    if not any(wrt_slot):
        return tuple(node.out_zeros(k) if _float(t) else None
                     for k, t in enumerate(out_types))
    wrt = [False] * len(types)
    for k, w in zip(node.slots, wrt_slot):
        wrt[k] = w
    n_out = len(out_types)

    def make():
        full = jvp_program(node.program, wrt)
        keep = [n_out + k for k, t in enumerate(out_types) if _float(t)]
        return opt.optimize_program(dce(full, keep_outputs=keep), _JVP_FACTS)[0]

    program = _memo(_DERIVED, (node.program, "jvp", tuple(wrt)), make)
    ts = [t for t, w in zip(tangents, wrt_slot) if w]
    outs = iter(ProgramFunction.apply(node.derived(program, len(ts)), *tensors, *ts))
    return tuple(next(outs) if _float(t) else None for t in out_types)


def _forward_with_tangents(node: Node, tensors) -> list:
    """The forward of a node whose operands' tangents are known up front: one run of the
    JVP program (a propagate's primal and tangent messages in one walk); the tangent
    outputs wait on the node for its jvp rule."""
    types, out_types = node.program.in_types, node.program.out_types
    tangents, node.tangents = node.tangents, None
    wrt_slot = [t is not None and _float(types[k]) for t, k in zip(tangents, node.slots)]
    if not any(wrt_slot):
        return node.run(tensors)
    wrt = [False] * len(types)
    for k, w in zip(node.slots, wrt_slot):
        wrt[k] = w
    n_out = len(out_types)

    def make():
        full = jvp_program(node.program, wrt)
        keep = list(range(n_out)) + [n_out + k for k, t in enumerate(out_types) if _float(t)]
        return opt.optimize_program(dce(full, keep_outputs=keep), _JVP_FACTS)[0]

    program = _memo(_DERIVED, (node.program, "jvp+primal", tuple(wrt)), make)
    ts = [t for t, w in zip(tangents, wrt_slot) if w]
    outs = node.derived(program, len(ts)).run(list(tensors) + ts)
    touts = iter(outs[n_out:])
    node.tangent_outs = (tangents, tuple(next(touts) if _float(t) else None
                                         for t in out_types))
    return outs[:n_out]


def plain_tangents(originals, slots):
    """The tangents of a call's tensor operands (None: none) when forward mode is the only
    transformation (torch.autograd.forward_ad, or one torch.func.jvp level) and each
    tangent is a plain tensor; otherwise None (the jvp rule computes them)."""
    stack = torch._C._functorch.get_interpreter_stack() or []
    if len(stack) > 1 or any(i.key() != torch._C._functorch.TransformType.Jvp
                             for i in stack):
        return None
    tangents = []
    for k in slots:
        o = originals[k]
        if transform_depth(o)[0]:
            return None
        t = fwAD.unpack_dual(o).tangent if has_tangent(o) else None
        if t is not None and stack and transform_depth(t) == (False, 1):
            t = torch._C._functorch.get_unwrapped(t)   # (the jvp level's view of it)
        if t is not None and (transform_depth(t) != (False, 0) or has_tangent(t)):
            return None
        tangents.append(t)
    return tangents if any(t is not None for t in tangents) else None


def node_vmap(node: Node, size: int, dims, tensors) -> tuple:
    """(outputs, out_dims) of the node under torch.func.vmap: one run of Tiga's batched
    program (a propagate over batched fields is one propagate, the batch beside the
    features), every output batched at 0."""
    n_in = len(node.program.in_binders)
    batched, axes = [False] * n_in, [None] * n_in
    for k, d in zip(node.slots, dims):
        if d is not None:
            batched[k], axes[k] = True, d
    n_out = len(node.program.outs)

    def make():
        bprog = batch_program(node.program, batched, size, axes, [0] * n_out)
        return _batch_where_it_is(inline_custom_calls(bprog))

    key = (node.program, "vmap", tuple(batched), tuple(axes), size)
    program, out_dims = _memo(_DERIVED, key, make)
    outs = ProgramFunction.apply(node.derived(program, 0), *tensors)
    return outs, out_dims


def _batch_where_it_is(program) -> tuple:
    """(program, out_dims): an output that the batched program moves to batch-first with a
    final transpose (a propagate's batch sits beside the features) is returned as it was
    before that transpose, its batch dimension named to torch instead (no copy)."""
    producer = {id(v): e for e in program.eqns for v in e.outputs}
    uses: dict = {}
    for a in [a for e in program.eqns for a in e.inputs] + list(program.outs):
        uses[id(a)] = uses.get(id(a), 0) + 1
    outs, dims = [], []
    for a in program.outs:
        e = producer.get(id(a))
        perm = e.params.get("permutation") if e is not None else None
        if (e is not None and e.primitive is transpose_p and uses[id(a)] == 1 and
                list(perm[1:]) == sorted(perm[1:])):
            outs.append(e.inputs[0])
            dims.append(perm[0])
        else:
            outs.append(a)
            dims.append(0)
    if all(d == 0 for d in dims):
        return program, tuple(dims)
    return dce(GraphProgram(program.in_binders, program.eqns, tuple(outs))), tuple(dims)


class ProgramFunction(torch.autograd.Function):
    """A `Node`'s program as a torch autograd node for every transformation torch nests:
    torch.func.vmap runs Tiga's batched program (`vmap`), forward mode (forward_ad,
    torch.func.jvp, jacfwd) Tiga's JVP program (`jvp`), reverse mode Tiga's VJP program
    (`backward`); each of them is a node of this class again, so hessian, grad of grad,
    per-sample gradients (vmap of grad) and jacrev / jacfwd (vmap of vjp / jvp) compose."""

    generate_vmap_rule = False

    @staticmethod
    def forward(node, *tensors):
        if node.tangents is not None:
            return tuple(_forward_with_tangents(node, tensors))
        return tuple(node.run(tensors))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.node = inputs[0]
        ctx.save_for_backward(*inputs[1:])
        ctx.save_for_forward(*inputs[1:])
        ctx.mark_non_differentiable(*[o for o in output if not o.is_floating_point()])

    @staticmethod
    def vmap(info, in_dims, node, *tensors):
        return node_vmap(node, info.batch_size, in_dims[1:], tensors)

    @staticmethod
    def jvp(ctx, _node_tangent, *tangents):
        node = ctx.node
        done, node.tangent_outs = node.tangent_outs, None
        # (an operand without a dual when the forward ran gets zeros here from functorch)
        if done is not None and len(done[0]) == len(tangents) and all(
                a is None or (b is not None and a.shape == b.shape)
                for a, b in zip(done[0], tangents)):
            return done[1]    # computed by the forward, from these tangents
        return node_jvp(node, ctx.saved_tensors, tangents)

    @staticmethod
    def backward(ctx, *cts):
        return (None, *node_vjp(ctx.node, ctx.saved_tensors, ctx.needs_input_grad[1:], cts))
