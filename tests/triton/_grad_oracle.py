"""Gradient oracles independent of the route under test (issue 41, item 7).

`tg.grad` of a function that calls `layer.reference(...)` is no oracle: the reference call
is inlined into the traced program, which then runs on the same compiled route (a broken
Triton VJP walk would be compared with itself). A Triton gradient is checked here against

- `tiga.testing.reference_grad`: the whole gradient program (forward and VJP) run by the
  numpy reference interpreter, never a compiled kernel; and
- central finite differences in float64 of the loss, evaluated by the numpy reference
  interpreter, along random directions: independent of every VJP rule too (a wrong rule
  that both routes share passes the first check and fails this one).
"""
from __future__ import annotations

import numpy as np

from tiga.core.eval import eval_program
from tiga.testing import reference_grad
from tiga.trace.staging import make_program

EPS = 1e-6


def reference_value(fn, *args) -> float:
    """fn(*args), a scalar, run whole by the numpy reference interpreter."""
    return float(np.asarray(eval_program(make_program(fn)(*args), *args)[0]))


# Reducers whose loss is only piecewise smooth: at a tie between two messages (duplicate
# edges, equal values) central differences straddle the kink and give the average of the
# one-sided derivatives, which no gradient equals; their VJP rules are checked against finite
# differences on tie-free data in tests/autodiff, and here against reference_grad only.
NONSMOOTH = frozenset({"max", "min", "argmax", "argmin"})


def directions_for(name: str, directions: int = 2) -> int:
    """How many finite-difference directions a random-graph check of reducer `name` takes."""
    return 0 if name in NONSMOOTH else directions


def check_grad(loss, args: tuple, got, *, seed: int, rtol: float = 1e-9,
               atol: float = 1e-10, directions: int = 2) -> None:
    """`got` (the route's gradients of `loss` with respect to every one of `args`) against
    reference_grad (elementwise, rtol/atol) and against central differences along
    `directions` random directions (a derivative of the loss to 1e-6 relative)."""
    args = tuple(np.asarray(a, np.float64) for a in args)
    got = [np.asarray(g) for g in got]
    want = reference_grad(loss, argnums=tuple(range(len(args))))(*args)
    for k, (g, r) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, np.asarray(r), rtol=rtol, atol=atol,
                                   err_msg=f"argument {k} against reference_grad")
    rng = np.random.default_rng(seed)
    scale = abs(reference_value(loss, *args))
    for _ in range(directions):
        d = [rng.normal(size=a.shape) for a in args]
        plus = reference_value(loss, *[a + EPS * v for a, v in zip(args, d)])
        minus = reference_value(loss, *[a - EPS * v for a, v in zip(args, d)])
        fd = (plus - minus) / (2 * EPS)
        dot = sum(float(np.vdot(g, v)) for g, v in zip(got, d))
        # float64 central differences: rounding ~1e-16 |loss| / EPS, truncation ~EPS^2
        tol = 1e-6 * (1.0 + abs(dot)) + 1e-9 * scale
        assert abs(fd - dot) <= tol, (
            f"directional derivative {dot!r} from the route's gradient, {fd!r} by central "
            f"differences (difference {abs(fd - dot):.3g} > {tol:.3g})")
