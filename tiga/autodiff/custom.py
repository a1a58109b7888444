"""autodiff: user-defined derivatives: tg.custom_vjp, tg.custom_jvp and their call rules.

Called outside any trace, a decorated function just runs. Traced (tg.jit, tg.grad, an edge
function, a loop body), it stages one custom_vjp_call / custom_jvp_call holding the primal
function and the rule as sub-programs: tg.grad / tg.vjp run the user's backward, tg.jvp the
user's JVP (a custom_vjp function is differentiated forward through its primal, a
custom_jvp one backward by transposing its linear JVP). Every derived program (VJP, JVP,
batched) holds the primal function inlined, never the call (autodiff/inlining.py).
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from ..core.errors import TigaError
from ..core.prims.custom import custom_jvp_call_p, custom_vjp_call_p, fun_operands
from ..core.program import ClosedProgram
from ..core.types import TensorType
from ..trace import math as m
from ..trace.pytree import tree_flatten, tree_unflatten
from ..trace.staging import inline_program, leaf_aval, leaf_value, trace_flat
from ..trace.tracer import Tracer, aval_of, bind, current_builder
from .batching import batch_closed, batch_rules
from .inlining import inline_custom_calls  # noqa: F401  (re-exported)
from .jvp import forward_pass, instantiate, jvp_rules
from .registry import vjp_rules
from .vjp import backward_pass, differentiable


def _traced(fn, avals):
    """fn traced on `avals`: (program with its captures as the first binders, captures,
    output treedef)."""
    prog, caps, tree = trace_flat(fn, avals)
    return ClosedProgram(prog), [leaf_value(c) for c in caps], tree


def _flat_call(fn, in_tree):
    def flat(*xs):
        return fn(*tree_unflatten(in_tree, list(xs)))
    return flat


_local = threading.local()


def _tracing_rules() -> set:
    """ids of the custom functions whose rule this thread is tracing."""
    if not hasattr(_local, "rules"):
        _local.rules = set()
    return _local.rules


class _Custom:
    def __init__(self, fun: Callable):
        self.fun = fun
        functools.update_wrapper(self, fun)

    def _staged(self) -> bool:
        # the rule itself may call the function (`fwd: return f(x), res`): there it is the
        # primal, not another custom call whose rule would be traced again
        return current_builder() is not None and id(self) not in _tracing_rules()

    def _trace_rule(self, fn, avals):
        active = _tracing_rules()
        active.add(id(self))
        try:
            return _traced(fn, avals)
        finally:
            active.discard(id(self))

    def _primal(self, leaves, in_tree, avals):
        fun, caps, out_tree = _traced(_flat_call(self.fun, in_tree), avals)
        return fun, caps, out_tree


class custom_vjp(_Custom):
    """`@tg.custom_vjp` then `f.defvjp(fwd, bwd)`: `fwd(*args) -> (out, residuals)`,
    `bwd(residuals, cotangent) -> tuple with one cotangent per argument` (None: zero)."""

    fwd = bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable):
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args):
        if self.fwd is None:
            raise TigaError(f"custom_vjp {self.__name__}: call defvjp(fwd, bwd) first")
        if not self._staged():
            return self.fun(*args)
        leaves, in_tree = tree_flatten(list(args))
        avals = [_strong(leaf_aval(x)) for x in leaves]
        fun, fun_caps, out_tree = self._primal(leaves, in_tree, avals)
        n_out = len(fun.out_types)
        res_tree = []

        def fwd_flat(*xs):
            out, res = self.fwd(*tree_unflatten(in_tree, list(xs)))
            out_leaves, tree = tree_flatten(out)
            if tree != out_tree or len(out_leaves) != n_out:
                raise TigaError(f"custom_vjp {self.__name__}: fwd must return (out, res) "
                                "with out structured as the function's output")
            res_leaves, rtree = tree_flatten(res)
            res_tree.append((rtree, [_strong(aval_of(r)) for r in res_leaves]))
            return out_leaves + res_leaves

        fwd, fwd_caps, _ = self._trace_rule(fwd_flat, avals)
        rtree, r_avals = res_tree[0]
        bwd, bwd_caps = self._backward(in_tree, args, out_tree, rtree, r_avals, fun)
        counts = (len(fun_caps), len(fwd_caps), len(bwd_caps))
        outs = bind(custom_vjp_call_p, *fun_caps, *fwd_caps, *bwd_caps, *leaves, fun=fun,
                    fwd=fwd, bwd=bwd, counts=counts, num_res=len(r_avals))
        return tree_unflatten(out_tree, outs)

    def _backward(self, in_tree, args, out_tree, rtree, r_avals, fun):
        n_res = len(r_avals)
        per_arg = [tree_flatten(a)[1] for a in args]

        def bwd_flat(*xs):
            res = tree_unflatten(rtree, list(xs[:n_res]))
            ct = tree_unflatten(out_tree, list(xs[n_res:]))
            cts = self.bwd(res, ct)
            if not isinstance(cts, (tuple, list)) or len(cts) != len(args):
                raise TigaError(f"custom_vjp {self.__name__}: bwd must return a tuple with one "
                                f"cotangent per argument ({len(args)})")
            flat = []
            for c, _tree, a in zip(cts, per_arg, args):
                a_leaves = tree_flatten(a)[0]
                c_leaves = [None] * len(a_leaves) if c is None else tree_flatten(c)[0]
                flat += [m.zeros_like(x) if cl is None else cl
                         for cl, x in zip(c_leaves, (leaf_aval_value(x) for x in a_leaves))]
            return flat

        ct_avals = [t.strong() for t in fun.out_types]
        bwd, caps, _ = self._trace_rule(bwd_flat, r_avals + ct_avals)
        return bwd, caps


def leaf_aval_value(x):
    """Something m.zeros_like reads a shape and dtype from."""
    return x if isinstance(x, Tracer) else leaf_value(x)


class custom_jvp(_Custom):
    """`@tg.custom_jvp` then `f.defjvp(rule)`: `rule(primals, tangents) -> (out, out_dot)`
    with primals and tangents tuples of the arguments; out_dot must be linear in tangents."""

    rule = None

    def defjvp(self, rule: Callable):
        self.rule = rule
        return self

    def __call__(self, *args):
        if self.rule is None:
            raise TigaError(f"custom_jvp {self.__name__}: call defjvp(rule) first")
        if not self._staged():
            return self.fun(*args)
        leaves, in_tree = tree_flatten(list(args))
        avals = [_strong(leaf_aval(x)) for x in leaves]
        fun, fun_caps, out_tree = self._primal(leaves, in_tree, avals)
        n = len(leaves)

        def jvp_flat(*xs):
            primals = tree_unflatten(in_tree, list(xs[:n]))
            tangents = tree_unflatten(in_tree, list(xs[n:]))
            out, out_dot = self.rule(tuple(primals), tuple(tangents))
            return tree_flatten(out)[0] + tree_flatten(out_dot)[0]

        jvp, jvp_caps, _ = self._trace_rule(jvp_flat, avals + avals)
        outs = bind(custom_jvp_call_p, *fun_caps, *jvp_caps, *leaves, fun=fun, jvp=jvp,
                    counts=(len(fun_caps), len(jvp_caps)))
        return tree_unflatten(out_tree, outs)


def _strong(t):
    return t.strong() if isinstance(t, TensorType) else t


# ---- rules ---------------------------------------------------------------------------------

def custom_vjp_call_vjp_rule(ct_outs, outs, *operands, fun, fwd, bwd, counts, num_res):
    nf, nw, nb = counts
    args = list(operands[sum(counts):])
    fwd_outs = inline_program(fwd.program, *operands[nf:nf + nw], *args)
    res = fwd_outs[len(fwd_outs) - num_res:]
    cts = [c if c is not None else m.zeros_like(o) for c, o in zip(ct_outs, outs)]
    arg_cts = inline_program(bwd.program, *operands[nf + nw:nf + nw + nb], *res, *cts)
    arg_cts = [c if differentiable(aval_of(a)) else None for c, a in zip(arg_cts, args)]
    return (None,) * sum(counts) + tuple(arg_cts)


def custom_vjp_call_jvp_rule(primals, tangents, *, fun, counts, **rules):
    """Forward mode through the primal function (the custom rule is a reverse-mode rule)."""
    return forward_pass(fun.program, fun_operands(primals, counts),
                        fun_operands(tangents, counts))


def custom_jvp_call_jvp_rule(primals, tangents, *, fun, jvp, counts):
    nf, nj = counts
    args = list(primals[nf + nj:])
    ts = [instantiate(t, a) if differentiable(aval_of(a)) else m.zeros_like(a)
          for t, a in zip(tangents[nf + nj:], args)]
    ts = _fit_tangents(jvp, ts)
    res = inline_program(jvp.program, *primals[nf:nf + nj], *args, *ts)
    n = len(fun.out_types)
    return res[:n], res[n:]


def _fit_tangents(jvp: ClosedProgram, ts: list) -> list:
    """Tangents shaped as the rule's tangent binders (a batched rule's carry the batch)."""
    binders = jvp.in_types[len(jvp.in_types) - len(ts):]
    return [m.broadcast_to(t, b.shape) if aval_of(t).shape != b.shape else t
            for t, b in zip(ts, binders)]


def custom_jvp_call_vjp_rule(ct_outs, outs, *operands, fun, jvp, counts):
    """The transpose of the user's (linear) JVP: its VJP with respect to the tangents."""
    nf, nj = counts
    args = list(operands[nf + nj:])
    zeros = _fit_tangents(jvp, [m.zeros_like(a) for a in args])
    n = len(fun.out_types)
    _, cts = backward_pass(jvp.program, list(operands[nf:nf + nj]) + args + zeros,
                           [None] * n + list(ct_outs))
    t_cts = [c if c is None or aval_of(c).shape == aval_of(a).shape else m.sum(c, axis=0)
             for c, a in zip(cts[nj + len(args):], args)]   # (a shared argument: summed)
    return (None,) * (nf + nj) + tuple(c if differentiable(aval_of(a)) else None
                                       for c, a in zip(t_cts, args))


def custom_vjp_call_batch_rule(ins, batched, size, *, fun, fwd, bwd, counts, num_res):
    """A batched call keeps its rule: fun, fwd and bwd batched alike; the cotangent of an
    argument shared by every instance sums over the instances."""
    nf, nw, nb = counts
    args_b = list(batched[sum(counts):])
    n_out = len(fun.out_types)
    fun_b, _ = batch_closed(fun, list(batched[:nf]) + args_b, size, [True] * n_out)
    fwd_b, _ = batch_closed(fwd, list(batched[nf:nf + nw]) + args_b, size,
                            [True] * (n_out + num_res))
    bwd_all, _ = batch_closed(bwd, list(batched[nf + nw:nf + nw + nb])
                              + [True] * (num_res + n_out), size, [True] * len(args_b))

    def summed(*xs):
        cts = inline_program(bwd_all.program, *bwd_all.consts, *xs)
        return [c if b else m.sum(c, axis=0) for c, b in zip(cts, args_b)]

    bwd_b, _, _ = _traced(summed, bwd_all.in_types)
    outs = bind(custom_vjp_call_p, *ins, fun=fun_b, fwd=fwd_b, bwd=bwd_b, counts=counts,
                num_res=num_res)
    return list(outs), [True] * n_out


def custom_jvp_call_batch_rule(ins, batched, size, *, fun, jvp, counts):
    """A batched call keeps its rule; a tangent is batched where its primal is."""
    nf, nj = counts
    args_b = list(batched[nf + nj:])
    n_out = len(fun.out_types)
    fun_b, _ = batch_closed(fun, list(batched[:nf]) + args_b, size, [True] * n_out)
    jvp_b, _ = batch_closed(jvp, list(batched[nf:nf + nj]) + args_b + args_b, size,
                            [True] * (2 * n_out))
    outs = bind(custom_jvp_call_p, *ins, fun=fun_b, jvp=jvp_b, counts=counts)
    return list(outs), [True] * n_out


vjp_rules[custom_vjp_call_p] = custom_vjp_call_vjp_rule
vjp_rules[custom_jvp_call_p] = custom_jvp_call_vjp_rule
jvp_rules[custom_vjp_call_p] = custom_vjp_call_jvp_rule
jvp_rules[custom_jvp_call_p] = custom_jvp_call_jvp_rule
batch_rules[custom_vjp_call_p] = custom_vjp_call_batch_rule
batch_rules[custom_jvp_call_p] = custom_jvp_call_batch_rule
