"""autodiff: tg.fixed_point, an iteration run to convergence with its implicit gradient.

The forward is a bounded while_loop of `step`. Its VJP never unrolls that loop: at the fixed
point x* = f(x*, θ), the cotangent w of x* solves the adjoint fixed point
w = ct + (∂f/∂x)ᵀ w, iterated with the VJP of the same step (another bounded while_loop), and
θ's cotangent is (∂f/∂θ)ᵀ w. It is a custom_vjp call, so it composes with jit, vmap and the
torch bridge like any other; forward mode carries the tangent along the iteration.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.errors import ShapeError, TigaError
from ..core.passes import cse, dce
from ..core.types import TensorType
from ..trace import math as m
from ..trace.control import _eager, hooks, while_loop
from ..trace.pytree import tree_flatten, tree_unflatten
from ..trace.staging import inline_program, leaf_aval, leaf_value, trace_flat
from ..trace.tracer import aval_of
from .custom import custom_vjp
from .vjp import backward_pass, differentiable


def _checked(tol, max_iterations):
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating)) or tol < 0:
        raise TigaError(f"fixed_point: tol must be a non-negative float, found {tol!r}")
    if (not isinstance(max_iterations, (int, np.integer)) or isinstance(max_iterations, bool)
            or max_iterations < 1):
        raise TigaError("fixed_point: max_iterations must be a positive int, found "
                        f"{max_iterations!r}")
    return float(tol), int(max_iterations)


def _max_abs(leaves):
    """max |leaf| over every leaf, as a float64 scalar."""
    d = [m.convert(m.max(m.abs(v)), "float64") for v in leaves]
    out = d[0]
    for x in d[1:]:
        out = m.maximum(out, x)
    return out


def _distance(new, old):
    return _max_abs([m.subtract(a, b) for a, b in zip(new, old)])


def _adjoint_tol(tol, ct, x):
    """The adjoint iteration's stopping distance: the forward's accuracy relative to x*'s
    size, carried to the cotangent's size (tol · max|ct| / max|x*|; tol where x* = 0). Both
    iterations contract at the same rate, so the adjoint then takes about as many steps as
    the forward did, whatever the scales of x* and of the cotangent."""
    size = _max_abs(x)
    positive = m.greater(size, 0.0)
    return m.multiply(tol, m.where(positive, m.divide(_max_abs(ct), m.where(positive, size,
                                                                             1.0)), 1.0))


def _iterate(fn, x0, tol, max_iterations):
    """x ← fn(x) until max|Δx| <= tol (a float or a traced scalar) or max_iterations
    steps."""
    def body(state):
        x, _ = state
        new = fn(x)
        return new, _distance(new, x)

    x, _ = while_loop(lambda s: m.greater(s[1], tol), body, (list(x0), np.float64(np.inf)),
                      max_iterations)
    return x


def fixed_point(step: Callable, init, *, tol: float, max_iterations: int):
    """Iterate `x ← step(x)` from `init` until max|step(x) - x| <= tol (or max_iterations
    steps); differentiable through the implicit function theorem, without unrolling.

    Args:
        step (Callable[[State], State]): one iteration; parameters it closes over (traced
            arrays) get gradients. It should contract near the fixed point (the adjoint
            iteration converges when the forward one does).
        init (State): an array, or a tuple / list / dict of arrays; gets no gradient (the
            fixed point does not depend on it).
        tol (float): the stopping distance max|step(x) - x| (absolute, over every leaf).
        max_iterations (int): the bound of each iteration (forward and adjoint).

    Returns:
        State: the fixed point x*. Its gradient solves w = ct + (∂step/∂x)ᵀ w by
            iteration, to the forward's accuracy relative to x*'s size (max|Δw| <= tol ·
            max|ct| / max|x*|) and at most max_iterations steps; forward mode carries the
            tangent along the forward iteration.
    """
    tol, max_iterations = _checked(tol, max_iterations)
    if _eager():
        return hooks["eager"](lambda st: fixed_point(step, st, tol=tol,
                                                     max_iterations=max_iterations),
                              init, (step,))
    leaves, tree = tree_flatten(init)
    avals = [leaf_aval(x).strong() for x in leaves]
    prog, caps, out_tree = trace_flat(lambda *xs: step(tree_unflatten(tree, list(xs))),
                                      avals, top=False)
    found = [t.strong() for t in prog.out_types]
    if out_tree != tree or found != avals:
        raise ShapeError(f"fixed_point: step must return the structure, shapes and dtypes of "
                         f"init: {tree} of ({', '.join(map(str, avals))}) -> {out_tree} of "
                         f"({', '.join(map(str, found))})")
    caps = [leaf_value(c) for c in caps]
    wrt = [i for i, c in enumerate(caps) if differentiable(_type(c))]
    x0 = [leaf_value(x) for x in leaves]
    solve = _solver(prog, caps, wrt, tol, max_iterations)
    return tree_unflatten(tree, list(solve([caps[i] for i in wrt], x0)))


def _type(v):
    t = aval_of(v)
    return t.strong() if isinstance(t, TensorType) else t


def _solver(prog, caps, wrt, tol, max_iterations):
    """The custom_vjp function (differentiable captures, init) -> x*; the other captures
    (relations, integers) are closed over, so they get no cotangent."""
    nc = len(caps)

    def consts(dcs):
        full = list(caps)
        for i, c in zip(wrt, dcs):
            full[i] = c
        return full

    def run_step(dcs, x):
        return inline_program(prog, *consts(dcs), *x)

    def solve(dcs, x0):
        return _iterate(lambda x: run_step(dcs, x), x0, tol, max_iterations)

    def fwd(dcs, x0):
        x = solve(dcs, x0)
        return x, (list(dcs), list(x))

    def bwd(res, ct):
        dcs, x = res
        ct = [m.zeros_like(v) if c is None else c for c, v in zip(ct, x)]

        def pull(w):
            _, cts = backward_pass(prog, consts(dcs) + list(x), list(w))
            return cts

        def adjoint(*w):
            cts = pull(w)[nc:]
            return [c if g is None else m.add(c, g) for c, g in zip(ct, cts)]

        # one adjoint step as its own program, pruned: the replayed forward of `step` and
        # the cotangents of its parameters are dead there (only x's cotangent iterates)
        step_t, step_caps, _ = trace_flat(adjoint, [_type(v) for v in x])
        step_t = dce(cse(step_t))
        w = _iterate(lambda w: inline_program(step_t, *step_caps, *w), ct,
                     _adjoint_tol(tol, ct, x), max_iterations)
        cts = pull(w)[:nc]
        ct_caps = [cts[i] if cts[i] is not None else m.zeros_like(caps[i]) for i in wrt]
        return ct_caps, None

    return custom_vjp(solve).defvjp(fwd, bwd)
