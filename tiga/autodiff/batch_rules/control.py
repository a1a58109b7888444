"""autodiff: batching rules of repeat and while_loop.

Which carries are batched is a fixed point: a carry the body makes batched is batched from
the start. Per-step operands put the batch behind their step axis. A while_loop whose
condition is batched runs while any instance's holds; an instance whose condition fails
keeps its state (the body's result is selected per instance).
"""
from __future__ import annotations

from ...core.prims.control import cond_p, repeat_p, while_loop_p
from ...core.program import ClosedProgram
from ...trace import math as m
from ...trace.staging import inline_program, trace_flat
from ...trace.tracer import aval_of, bind
from ..batching import batch_closed, batch_rules, broadcast_batch, move_axis


def _carry_fixed_point(body, flags, carry_at, n_carry, size, force):
    """Batch `body` until its carried outputs are batched where its carried inputs are."""
    flags = list(flags)
    while True:
        closed, outs = batch_closed(body, flags, size, force(flags))
        grown = [i for i in range(n_carry) if outs[i] and not flags[carry_at + i]]
        if not grown:
            return closed, flags, outs
        for i in grown:
            flags[carry_at + i] = True


def repeat_batch_rule(ins, batched, size, *, body, length, num_consts, num_carry, reverse):
    nc, nk = num_consts, num_carry
    ny = len(body.out_types) - nk

    def force(flags):
        return flags[nc:nc + nk] + [False] * ny

    closed, flags, outs = _carry_fixed_point(body, batched, nc, nk, size, force)
    args = []
    for i, (x, b) in enumerate(zip(ins, batched)):
        if flags[i] and not b:
            x = broadcast_batch(x, size)
        if i >= nc + nk and flags[i]:
            x = move_axis(x, 0, 1)     # (steps, B, ...): each step reads its (B, ...) rows
        args.append(x)
    res = bind(repeat_p, *args, body=closed, length=length, num_consts=nc, num_carry=nk,
               reverse=reverse)
    ys = [move_axis(y, 1, 0) if b else y for y, b in zip(res[nk:], outs[nk:])]
    return list(res[:nk]) + ys, list(outs[:nk]) + list(outs[nk:])


def while_loop_batch_rule(ins, batched, size, *, cond, body, cond_nconsts, body_nconsts,
                          max_iterations):
    ncc, nbc = cond_nconsts, body_nconsts
    nk = len(ins) - ncc - nbc
    c_flags = list(batched[:ncc])
    b_flags = list(batched[ncc:])
    _, b_flags, _ = _carry_fixed_point(body, b_flags, nbc, nk, size, lambda f: f[nbc:])
    k_flags = b_flags[nbc:]
    cond_b, (pred_b,) = batch_closed(cond, c_flags + k_flags, size)
    if pred_b:
        k_flags = [True] * nk       # each instance keeps its own state once it is done
        b_flags = b_flags[:nbc] + k_flags
        cond_b, _ = batch_closed(cond, c_flags + k_flags, size)
    body_b, _ = batch_closed(body, b_flags, size, k_flags)
    carry = [broadcast_batch(x, size) if f and not b else x
             for x, b, f in zip(ins[ncc + nbc:], batched[ncc + nbc:], k_flags)]
    if pred_b:
        cond_b, body_b = _any_cond(cond_b, ncc), _selecting_body(cond_b, body_b, ncc, nbc)
        res = bind(while_loop_p, *ins[:ncc], *ins[ncc:ncc + nbc], *ins[:ncc], *carry,
                   cond=cond_b, body=body_b, cond_nconsts=ncc, body_nconsts=nbc + ncc,
                   max_iterations=max_iterations)
    else:
        res = bind(while_loop_p, *ins[:ncc + nbc], *carry, cond=cond_b, body=body_b,
                   cond_nconsts=ncc, body_nconsts=nbc, max_iterations=max_iterations)
    return list(res), k_flags


def _any_cond(cond_b: ClosedProgram, ncc: int) -> ClosedProgram:
    def fn(*args):
        (pred,) = inline_program(cond_b.program, *cond_b.consts, *args)
        return m.greater(m.max(m.convert(pred, "int32")), 0)

    prog, _, _ = trace_flat(fn, cond_b.in_types)
    return ClosedProgram(prog)


def _selecting_body(cond_b, body_b, ncc, nbc) -> ClosedProgram:
    """body consts (its own, then cond's), carry -> per instance: body(carry) where the
    condition holds, else the carry."""
    def fn(*args):
        b_consts, c_consts, carry = args[:nbc], args[nbc:nbc + ncc], args[nbc + ncc:]
        (pred,) = inline_program(cond_b.program, *cond_b.consts, *c_consts, *carry)
        new = inline_program(body_b.program, *body_b.consts, *b_consts, *carry)
        out = []
        for n, c in zip(new, carry):
            t = aval_of(c)
            p = m.reshape(pred, (t.shape[0],) + (1,) * (t.ndim - 1))
            out.append(m.where(m.broadcast_to(p, t.shape), n, c))
        return out

    types = body_b.in_types
    prog, _, _ = trace_flat(fn, types[:nbc] + cond_b.in_types[:ncc] + types[nbc:])
    return ClosedProgram(prog)


def cond_batch_rule(ins, batched, size, *, branches):
    """An unbatched index keeps one cond (an output is batched where any branch batches
    it); a batched index runs every branch on the batch and selects per instance."""
    index, ops, flags = ins[0], list(ins[1:]), list(batched[1:])
    no = len(branches[0].out_types)
    if not batched[0]:
        out_b = [False] * no
        for b in branches:
            out_b = [x or y for x, y in zip(out_b, batch_closed(b, flags, size)[1])]
        progs = tuple(batch_closed(b, flags, size, out_b)[0] for b in branches)
        return list(bind(cond_p, index, *ops, branches=progs)), out_b
    index = m.minimum(m.maximum(index, 0), len(branches) - 1)
    results = []
    for b in branches:
        closed, _ = batch_closed(b, flags, size, [True] * no)
        results.append(inline_program(closed.program, *closed.consts, *ops))
    out = list(results[0])
    for k, res in enumerate(results[1:], start=1):
        for j, r in enumerate(res):
            t = aval_of(r)
            p = m.reshape(m.equal(index, k), (size,) + (1,) * (t.ndim - 1))
            out[j] = m.where(m.broadcast_to(p, t.shape), r, out[j])
    return out, [True] * no


batch_rules[repeat_p] = repeat_batch_rule
batch_rules[cond_p] = cond_batch_rule
batch_rules[while_loop_p] = while_loop_batch_rule
