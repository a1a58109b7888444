"""core: custom-rule calls: custom_vjp_call and custom_jvp_call (tg.custom_vjp / custom_jvp).

Each holds the primal function as a sub-program (`fun`) with the user's rule as more
sub-programs; evaluating one evaluates `fun`. Operands: the values the sub-programs close
over (`counts` of them, per sub-program, in param order), then the arguments. Autodiff
reads the rules; before lowering the call is inlined (its `fun`), so it compiles like the
function it wraps.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..eval import eval_closed, eval_rows
from ..primitive import abstract_eval_rules, impl_rules, primitive, row_batch_rules
from ..types import TensorType

custom_vjp_call_p = primitive("custom_vjp_call", "control", multiple_results=True)
custom_jvp_call_p = primitive("custom_jvp_call", "control", multiple_results=True)


def fun_operands(operands, counts) -> list:
    """The operands `fun` reads: its own closed-over values, then the arguments."""
    return list(operands[:counts[0]]) + list(operands[sum(counts):])


def _strong(t):
    return t.strong() if isinstance(t, TensorType) else t


def custom_call_abstract_eval_rule(*types, fun, counts, **rules):
    want = [_strong(t) for t in fun.in_types]
    have = [_strong(t) for t in fun_operands(types, counts)]
    if want != have:
        raise ShapeError(f"custom call: the function's binders ({', '.join(map(str, want))}) "
                         f"do not match the operands ({', '.join(map(str, have))})")
    return [_strong(t) for t in fun.out_types]


def custom_call_impl_rule(*operands, fun, counts, rows=False, **rules):
    args = fun_operands(operands, counts)
    if rows:   # every operand carries a leading row axis (row_batch_rules below)
        return eval_rows(fun, args, [True] * len(args), len(args[0]) if args else 1)
    return eval_closed(fun, *args)


for _p in (custom_vjp_call_p, custom_jvp_call_p):
    abstract_eval_rules[_p] = custom_call_abstract_eval_rule
    impl_rules[_p] = custom_call_impl_rule
    # inside an edge or update function the reference interpreter evaluates `fun` per row
    row_batch_rules[_p] = lambda **params: {**params, "rows": True}

__all__ = ["custom_vjp_call_p", "custom_jvp_call_p", "fun_operands"]
