"""core: structured control primitives: repeat (tg.repeat, tg.scan, tg.fori_loop), bounded
while_loop, and cond (tg.cond, tg.switch)."""
from __future__ import annotations

import numpy as np

from ..dtypes import bool_
from ..errors import DTypeError, ShapeError, TigaError
from ..eval import eval_closed
from ..primitive import abstract_eval_rules, impl_rules, primitive
from ..types import TensorType

repeat_p = primitive("repeat", "control", multiple_results=True)
while_loop_p = primitive("while_loop", "control", multiple_results=True)
# cond(index, *operands; branches=(ClosedProgram, ...)): runs branches[index] on the operands.
# Every branch takes the same operands (the values any branch closes over included), so one
# operand list serves the one that runs.
cond_p = primitive("cond", "control", multiple_results=True)

# The primitive's own bound of a loop that counts its steps against a runtime bound
# (tg.while_loop with a numpy or traced bound, trace/control.py `_counted`): its carried
# state starts (step counter, bound, ...), so the run checks that bound before the first step.
UNBOUNDED = 2 ** 62


def _same(a, b) -> bool:
    # a body that closes over a relation has GraphType consts, which carry no weak flag
    def strong(t):
        return t.strong() if isinstance(t, TensorType) else t
    return [strong(t) for t in a] == [strong(t) for t in b]


def repeat_abstract_eval_rule(*operands, body, length, num_consts, num_carry, reverse):
    consts = operands[:num_consts]
    carry = operands[num_consts:num_consts + num_carry]
    xs = operands[num_consts + num_carry:]
    for x in xs:
        if x.ndim == 0 or x.shape[0] != length:
            raise ShapeError(f"repeat: per-step operand {x} needs leading axis {length}")
    x_rows = [TensorType(x.shape[1:], x.dtype) for x in xs]
    if not _same(body.in_types, [*consts, *carry, *x_rows]):
        raise ShapeError("repeat: body binders do not match (consts, carry, x rows)")
    outs = body.out_types
    if not _same(outs[:num_carry], carry):
        raise ShapeError("repeat: the body changes the carried types: "
                         f"{', '.join(map(str, carry))} -> "
                         f"{', '.join(map(str, outs[:num_carry]))}")
    ys = [TensorType((length,) + t.shape, t.dtype) for t in outs[num_carry:]]
    return [t.strong() for t in carry] + ys


def run_repeat(call, operands, *, body, length, num_consts, num_carry, reverse):
    """The repeat loop; `call(closed_program, args) -> outputs` runs the body (the reference
    interpreter here, the executor's mixed routes at run time)."""
    consts = list(operands[:num_consts])
    carry = list(operands[num_consts:num_consts + num_carry])
    xs = operands[num_consts + num_carry:]
    ys = []
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        outs = call(body, consts + carry + [x[i] for x in xs])
        carry, y = outs[:num_carry], outs[num_carry:]
        ys.append(y)
    if reverse:
        ys.reverse()
    stacked = [np.stack([y[k] for y in ys]) if ys else
               np.zeros((0,) + tuple(t.shape), t.dtype.np)
               for k, t in enumerate(body.out_types[num_carry:])]
    return [np.asarray(c) for c in carry] + stacked


def run_while(call, operands, *, cond, body, cond_nconsts, body_nconsts, max_iterations):
    """The bounded while loop, with `call` running cond and body as in run_repeat."""
    cond_consts = list(operands[:cond_nconsts])
    body_consts = list(operands[cond_nconsts:cond_nconsts + body_nconsts])
    carry = list(operands[cond_nconsts + body_nconsts:])
    if max_iterations == UNBOUNDED and len(carry) >= 2 and _starts_counting(carry[0]):
        _check_runtime_bound(carry[1])
    for _ in range(max_iterations):
        if not bool(call(cond, cond_consts + carry)[0]):
            break
        carry = call(body, body_consts + carry)
    return [np.asarray(c) for c in carry]


def _starts_counting(counter) -> bool:
    c = np.asarray(counter)
    return c.dtype.kind in "iu" and not c.any()


def _check_runtime_bound(bound) -> None:
    """A runtime while_loop bound must be >= 0, as a static one is when traced (an eager call
    checks it too): a negative one is an error, never a loop that silently runs 0 steps."""
    b = np.asarray(bound)
    if b.dtype.kind in "iu" and b.size and (b < 0).any():
        shown = int(b.min()) if b.ndim == 0 else f"{int(b.min())} (in a batch of bounds)"
        raise TigaError(f"while_loop: max_iterations must be >= 0, found {shown}: the bound "
                        "is a runtime value of this call (a traced or numpy integer); pass "
                        "a non-negative bound")


def _eval_call(closed, args):
    return eval_closed(closed, *args)


def repeat_impl_rule(*operands, **params):
    return run_repeat(_eval_call, operands, **params)


def while_loop_impl_rule(*operands, **params):
    return run_while(_eval_call, operands, **params)


def while_loop_abstract_eval_rule(*operands, cond, body, cond_nconsts, body_nconsts,
                                  max_iterations):
    carry = operands[cond_nconsts + body_nconsts:]
    cond_consts = operands[:cond_nconsts]
    body_consts = operands[cond_nconsts:cond_nconsts + body_nconsts]
    (c,) = cond.out_types
    if c.shape != () or c.dtype != bool_:
        raise DTypeError(f"while_loop: cond must return a scalar bool, found {c}")
    if not _same(cond.in_types, [*cond_consts, *carry]):
        raise ShapeError("while_loop: cond binders do not match the carried state")
    if not _same(body.in_types, [*body_consts, *carry]) or not _same(body.out_types, carry):
        raise ShapeError("while_loop: the body changes the carried types: "
                         f"{', '.join(map(str, carry))} -> "
                         f"{', '.join(map(str, body.out_types))}")
    return [t.strong() for t in carry]


def cond_abstract_eval_rule(index, *operands, branches):
    if not isinstance(branches, tuple) or not branches:
        raise TigaError(f"cond: branches must be a non-empty tuple of programs, found "
                        f"{branches!r}")
    if not isinstance(index, TensorType) or index.shape != () or not index.dtype.is_int:
        raise DTypeError(f"cond: the index operand must be an integer scalar, found {index}")
    first = [t.strong() for t in branches[0].out_types]
    for k, b in enumerate(branches):
        if not _same(b.in_types, list(operands)):
            raise ShapeError(f"cond: branch {k} binders ({', '.join(map(str, b.in_types))}) "
                             f"do not match the operands ({', '.join(map(str, operands))})")
        if [t.strong() for t in b.out_types] != first:
            raise ShapeError(f"cond: branch {k} returns {', '.join(map(str, b.out_types))} "
                             f"but branch 0 returns {', '.join(map(str, first))}; every "
                             "branch must return the same types")
    return first


def branch_index(index, n: int) -> int:
    """The branch an index selects: clamped into [0, n) as jax.lax.switch does."""
    return int(min(max(int(np.asarray(index)), 0), n - 1))


def run_cond(call, operands, *, branches):
    """The selected branch run by `call`, as run_repeat runs a loop body."""
    k = branch_index(operands[0], len(branches))
    return [np.asarray(o) for o in call(branches[k], list(operands[1:]))]


def cond_impl_rule(*operands, branches):
    return run_cond(_eval_call, operands, branches=branches)


abstract_eval_rules.update({repeat_p: repeat_abstract_eval_rule,
                            while_loop_p: while_loop_abstract_eval_rule,
                            cond_p: cond_abstract_eval_rule})
impl_rules.update({repeat_p: repeat_impl_rule, while_loop_p: while_loop_impl_rule,
                   cond_p: cond_impl_rule})
