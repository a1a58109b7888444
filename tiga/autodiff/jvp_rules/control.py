"""autodiff: JVP rules of repeat and while_loop (the body's JVP, carried with the state)."""
from __future__ import annotations

from ...core.prims.control import cond_p, repeat_p, while_loop_p
from ...core.program import ClosedProgram
from ...core.types import TensorType
from ...trace.staging import inline_program, trace_flat
from ...trace.tracer import bind
from ..jvp import differentiable, forward_pass, instantiate, jvp_rules, type_of


def _row(t):
    return TensorType(t.shape[1:], t.dtype)


def _present(values, tangents):
    return [i for i, (v, t) in enumerate(zip(values, tangents))
            if t is not None and differentiable(type_of(v))]


def repeat_jvp_rule(primals, tangents, *, body, length, num_consts, num_carry, reverse):
    """Consts and per-step operands bring their tangents along; every floating carry
    carries a tangent (a loop reaches a fixed point of which carries have one only so)."""
    nc, nk = num_consts, num_carry
    consts, carry, xs = primals[:nc], primals[nc:nc + nk], primals[nc + nk:]
    tcs, tks, txs = tangents[:nc], tangents[nc:nc + nk], tangents[nc + nk:]
    c_idx, x_idx = _present(consts, tcs), _present(xs, txs)
    k_idx = [i for i, v in enumerate(carry) if differentiable(type_of(v))]
    y_types = body.out_types[nk:]
    y_idx = [j for j, t in enumerate(y_types) if differentiable(t)]
    sizes = [nc, len(c_idx), nk, len(k_idx), len(xs), len(x_idx)]

    def fn(*args):
        c, tc, k, tk, x, tx = _split(args, sizes)
        tan = _scatter(nc, c_idx, tc) + _scatter(nk, k_idx, tk) + _scatter(len(xs), x_idx, tx)
        outs, touts = forward_pass(body.program, list(body.consts) + list(c + k + x),
                                   [None] * len(body.consts) + tan)
        return (outs[:nk] + [instantiate(touts[i], outs[i]) for i in k_idx] + outs[nk:]
                + [instantiate(touts[nk + j], outs[nk + j]) for j in y_idx])

    t_c = [type_of(v) for v in consts]
    t_k = [type_of(v) for v in carry]
    t_x = [_row(type_of(v)) for v in xs]
    avals = (t_c + [t_c[i] for i in c_idx] + t_k + [t_k[i] for i in k_idx] + t_x
             + [t_x[i] for i in x_idx])
    prog, _, _ = trace_flat(fn, avals)
    tcarry = [instantiate(tks[i], carry[i]) for i in k_idx]
    res = bind(repeat_p, *consts, *[tcs[i] for i in c_idx], *carry, *tcarry, *xs,
               *[txs[i] for i in x_idx], body=ClosedProgram(prog), length=length,
               num_consts=nc + len(c_idx), num_carry=nk + len(k_idx), reverse=reverse)
    ny = len(y_types)
    outs = list(res[:nk]) + list(res[nk + len(k_idx):nk + len(k_idx) + ny])
    touts = (_scatter(nk, k_idx, res[nk:nk + len(k_idx)])
             + _scatter(ny, y_idx, res[nk + len(k_idx) + ny:]))
    return outs, touts


def _split(args, sizes):
    out, at = [], 0
    for s in sizes:
        out.append(list(args[at:at + s]))
        at += s
    return out


def _scatter(n, idx, values):
    out = [None] * n
    for i, v in zip(idx, values):
        out[i] = v
    return out


def while_loop_jvp_rule(primals, tangents, *, cond, body, cond_nconsts, body_nconsts,
                        max_iterations):
    """The trip count is piecewise constant in the state: the tangent rides along the body
    (cond reads the primal state only)."""
    ncc, nbc = cond_nconsts, body_nconsts
    cconsts, bconsts = primals[:ncc], primals[ncc:ncc + nbc]
    carry, tbs, tks = primals[ncc + nbc:], tangents[ncc:ncc + nbc], tangents[ncc + nbc:]
    b_idx = _present(bconsts, tbs)
    k_idx = [i for i, v in enumerate(carry) if differentiable(type_of(v))]
    nk = len(carry)
    t_cc = [type_of(v) for v in cconsts]
    t_b = [type_of(v) for v in bconsts]
    t_k = [type_of(v) for v in carry]

    def cond_fn(*args):
        return inline_program(cond.program, *cond.consts, *args[:ncc + nk])

    def body_fn(*args):
        b, tb, k, tk = _split(args, [nbc, len(b_idx), nk, len(k_idx)])
        outs, touts = forward_pass(body.program, list(body.consts) + b + k,
                                   [None] * len(body.consts) + _scatter(nbc, b_idx, tb)
                                   + _scatter(nk, k_idx, tk))
        return outs + [instantiate(touts[i], outs[i]) for i in k_idx]

    cprog, _, _ = trace_flat(cond_fn, t_cc + t_k + [t_k[i] for i in k_idx])
    bprog, _, _ = trace_flat(body_fn, t_b + [t_b[i] for i in b_idx] + t_k
                             + [t_k[i] for i in k_idx])
    tcarry = [instantiate(tks[i], carry[i]) for i in k_idx]
    res = bind(while_loop_p, *cconsts, *bconsts, *[tbs[i] for i in b_idx], *carry, *tcarry,
               cond=ClosedProgram(cprog), body=ClosedProgram(bprog), cond_nconsts=ncc,
               body_nconsts=nbc + len(b_idx), max_iterations=max_iterations)
    return list(res[:nk]), _scatter(nk, k_idx, res[nk:])


def cond_jvp_rule(primals, tangents, *, branches):
    """A cond over the branches' JVPs: operands bring their tangents along, and every
    floating output gets one (whichever branch runs)."""
    index, ops, tops = primals[0], list(primals[1:]), list(tangents[1:])
    n = len(ops)
    x_idx = _present(ops, tops)
    out_types = branches[0].out_types
    no = len(out_types)
    y_idx = [j for j, t in enumerate(out_types) if differentiable(t)]
    t_x = [type_of(v) for v in ops]

    def branch_jvp(branch):
        def fn(*a):
            tan = [None] * len(branch.consts) + _scatter(n, x_idx, a[n:])
            outs, touts = forward_pass(branch.program, list(branch.consts) + list(a[:n]), tan)
            return outs + [instantiate(touts[j], outs[j]) for j in y_idx]

        prog, _, _ = trace_flat(fn, t_x + [t_x[i] for i in x_idx])
        return ClosedProgram(prog)

    res = bind(cond_p, index, *ops, *[tops[i] for i in x_idx],
               branches=tuple(branch_jvp(b) for b in branches))
    return list(res[:no]), _scatter(no, y_idx, res[no:])


jvp_rules[repeat_p] = repeat_jvp_rule
jvp_rules[cond_p] = cond_jvp_rule
jvp_rules[while_loop_p] = while_loop_jvp_rule
