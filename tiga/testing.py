"""testing: oracles for checking a compiled route against the reference interpreter."""
from __future__ import annotations

from collections.abc import Callable

from .api import grad
from .core.eval import eval_program
from .trace.staging import make_program


def reference_grad(fn: Callable, argnums=0) -> Callable:
    """`tg.grad(fn, argnums)` with its whole program (forward and VJP) run by the numpy
    reference interpreter. A `reference()` call inside `tg.grad` is not an oracle by itself:
    it is inlined into the traced program, which then runs on the compiled route."""
    def run(*args):
        outs = eval_program(make_program(grad(fn, argnums=argnums))(*args), *args)
        return outs[0] if isinstance(argnums, int) else tuple(outs)
    return run
