"""autodiff: what a gradient program's loops keep for their backward pass (tg.checkpoint).

A repeat's VJP runs its forward with the body's input carry as an extra per-step output (the
history, autodiff/rules/control.py `_with_history`); the backward loop reads it in reverse. A
checkpoint policy nests the loop, so the outer history holds one carry per chunk and each
chunk's inner history lives only while that chunk's backward runs. `residual_bytes` counts
them on the program itself, so a report says what the program that runs keeps.
"""
from __future__ import annotations

import numpy as np

from ..core.prims.control import repeat_p
from ..core.program import GraphProgram
from ..core.types import TensorType


def _bytes(t) -> int:
    if not isinstance(t, TensorType):
        return 0
    return int(np.prod([int(d) for d in t.shape], dtype=np.int64)) * t.dtype.np.itemsize


def _history_outputs(eqn) -> list:
    """The stacked carries a forward-with-history repeat emits: its body returns its own
    carry binders as the last per-step outputs."""
    body = eqn.params["body"].program
    nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
    skip = len(body.in_binders) - len(eqn.inputs)      # the body's own closed-over values
    carry_in = body.in_binders[skip + nc:skip + nc + nk]
    if nk == 0 or len(body.outs) < 2 * nk:
        return []
    tail = body.outs[len(body.outs) - nk:]
    if all(a is b for a, b in zip(tail, carry_in)):
        return list(eqn.outputs[len(eqn.outputs) - nk:])
    return []


def residual_bytes(program: GraphProgram) -> int:
    """Peak bytes of loop carries `program` stores for its backward pass: the histories of
    its top-level loops, plus the largest one any loop body keeps while it runs."""
    total, inner = 0, 0
    for e in program.eqns:
        if e.primitive is not repeat_p:
            continue
        total += sum(_bytes(o.type) for o in _history_outputs(e))
        inner = max(inner, residual_bytes(e.params["body"].program))
    return total + inner
