"""autodiff: VJP rules of repeat (tg.repeat) and while_loop."""
from __future__ import annotations

from ...core.errors import UnsupportedError
from ...core.passes import cse, dce
from ...core.prims.control import cond_p, repeat_p, while_loop_p
from ...core.program import ClosedProgram
from ...core.types import TensorType
from ...trace import math as m
from ...trace.math import _typeof
from ...trace.staging import inline_program, trace_flat
from ...trace.tracer import aval_of, bind
from ..registry import vjp_rules
from ..vjp import backward_pass, differentiable


def _strong(values):
    return [_typeof(v).strong() for v in values]


def _type_of(v):
    t = aval_of(v)  # unlike _typeof, also accepts a relation
    return t.strong() if isinstance(t, TensorType) else t


def _acc_types(consts):
    """Accumulator types of the const cotangents; a relation const (a graph captured by the
    body) has no cotangent, so it carries a dummy scalar zero instead."""
    return [t if isinstance(t, TensorType) else _NO_CT for t in map(_type_of, consts)]


_NO_CT = TensorType((), "float32")


def _with_history(body: ClosedProgram, num_consts, num_carry):
    """The body, also emitting its input carry, so a forward repeat saves every carry."""
    avals = body.in_types

    def fn(*args):
        outs = inline_program(body.program, *body.consts, *args)
        return list(outs) + list(args[num_consts:num_consts + num_carry])

    prog, _, _ = trace_flat(fn, avals)
    return ClosedProgram(prog)


def repeat_vjp_rule(ct_outs, outs, *operands, body, length, num_consts, num_carry, reverse):
    consts = list(operands[:num_consts])
    carry = list(operands[num_consts:num_consts + num_carry])
    xs = list(operands[num_consts + num_carry:])
    n_ys = len(ct_outs) - num_carry
    fwd = bind(repeat_p, *consts, *carry, *xs, body=_with_history(body, num_consts, num_carry),
               length=length, num_consts=num_consts, num_carry=num_carry, reverse=reverse)
    history = fwd[num_carry + n_ys:]
    ct_outs = [c if c is not None else m.zeros_like(o) for c, o in zip(ct_outs, outs)]
    ct_carry, ct_ys = ct_outs[:num_carry], ct_outs[num_carry:]
    acc = [m.full(t.shape, 0, t.dtype) for t in _acc_types(consts)]
    bwd_body = _backward_body(body, consts, carry, xs, ct_ys, num_consts, num_carry)
    res = bind(repeat_p, *consts, *ct_carry, *acc, *history, *xs, *ct_ys, body=bwd_body,
               length=length, num_consts=num_consts, num_carry=num_carry + num_consts,
               reverse=not reverse)
    ct_init, ct_consts = res[:num_carry], res[num_carry:num_carry + num_consts]
    ct_xs = res[num_carry + num_consts:]
    cts = list(ct_consts) + list(ct_init) + list(ct_xs)
    return tuple(c if differentiable(_type_of(v)) else None for c, v in zip(cts, operands))


def _backward_body(body, consts, carry, xs, ct_ys, num_consts, num_carry):
    x_rows = [TensorType(t.shape[1:], t.dtype) for t in _strong(xs)]
    y_rows = [TensorType(t.shape[1:], t.dtype) for t in _strong(ct_ys)]
    avals = ([_type_of(c) for c in consts] + _strong(carry) + _acc_types(consts) +
        _strong(carry) + x_rows + y_rows)
    nc, nk, nx = num_consts, num_carry, len(xs)

    def fn(*a):
        cs, ct_c, acc = a[:nc], a[nc:nc + nk], a[nc + nk:2 * nc + nk]
        c_i = a[2 * nc + nk:2 * nc + 2 * nk]
        x_i = a[2 * nc + 2 * nk:2 * nc + 2 * nk + nx]
        ct_y = a[2 * nc + 2 * nk + nx:]
        _, cts = backward_pass(body.program, list(body.consts) + list(cs + c_i + x_i),
                               list(ct_c) + list(ct_y))
        cts = cts[len(body.consts):]
        z = [c if c is not None else m.zeros_like(v) if isinstance(_type_of(v), TensorType)
             else None for c, v in zip(cts, cs + c_i + x_i)]
        new_acc = [s if d is None else m.add(s, d) for s, d in zip(acc, z[:nc])]
        return z[nc:nc + nk] + new_acc + z[nc + nk:]

    prog, _, _ = trace_flat(fn, avals)
    return ClosedProgram(dce(cse(prog)))


def while_loop_vjp_rule(ct_outs, outs, *operands, **params):
    raise UnsupportedError(
        "tg.grad through tg.while_loop: the loop has a data-dependent trip count, so its "
        "VJP is not defined (while_loop_vjp_rule)",
        hint="for an iteration run to convergence use tg.fixed_point(step, init, tol=..., "
             "max_iterations=...), whose gradient is the implicit one; for a fixed number "
             "of steps use tg.repeat(n, body, init) or tg.scan")


def cond_vjp_rule(ct_outs, outs, index, *operands, branches):
    """The taken branch's VJP: a cond over every branch's VJP program (each replays its
    branch forward on the operands, then pulls the cotangents back), so only the taken
    branch runs in the backward pass too."""
    wrt = [i for i, v in enumerate(operands) if differentiable(_type_of(v))]
    if not wrt:
        return (None,) * (1 + len(operands))
    cts = [c if c is not None else m.zeros_like(o) for c, o in zip(ct_outs, outs)]
    avals = [_type_of(v) for v in operands] + _strong(cts)
    n = len(operands)

    def branch_vjp(branch):
        def fn(*a):
            _, in_cts = backward_pass(branch.program, list(branch.consts) + list(a[:n]),
                                      list(a[n:]))
            in_cts = in_cts[len(branch.consts):]
            return [in_cts[i] if in_cts[i] is not None else m.zeros_like(a[i]) for i in wrt]

        prog, _, _ = trace_flat(fn, avals)
        return ClosedProgram(dce(cse(prog)))

    res = bind(cond_p, index, *operands, *cts,
               branches=tuple(branch_vjp(b) for b in branches))
    out = [None] * n
    for i, c in zip(wrt, res):
        out[i] = c
    return (None, *out)


vjp_rules[repeat_p] = repeat_vjp_rule
vjp_rules[while_loop_p] = while_loop_vjp_rule
vjp_rules[cond_p] = cond_vjp_rule
