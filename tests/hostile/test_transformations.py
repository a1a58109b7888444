"""Hostile uses of the transformations (issue 13): non-scalar grads, bad cotangents, loops
that change shape, numpy calls under jit. One subprocess (see _run.py)."""
from __future__ import annotations

from ._run import check_cases

TRANSFORMATIONS_REJECT_MALFORMED_REQUESTS = '''
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
x = np.array([1.0, 2.0])

def layer(v):
    return tg.propagate(g, lambda s, d, e: s.x * s.x, tg.sum(), src={"x": v})

@case
def grad_of_a_non_scalar():
    raises(tg.ShapeError, lambda: tg.grad(layer)(x), "grad requires a scalar output",
           "found f64[3]", "tg.vjp")

@case
def grad_of_none():
    raises(tg.ShapeError, lambda: tg.grad(lambda v: None)(x), "grad requires a scalar output")

@case
def grad_with_respect_to_integers():
    raises(tg.DTypeError, lambda: tg.grad(lambda v: v.sum())(np.array([1, 2])),
           "argument 0: gradients need floating inputs", "found i64[2]")

@case
def vjp_with_a_wrong_cotangent():
    out, vjp_fn = tg.vjp(layer, x)
    raises(tg.ShapeError, lambda: vjp_fn(np.ones(5)), "vjp_fn: cotangent shape (5,)")
    raises(tg.ShapeError, lambda: vjp_fn((np.ones(3), np.ones(3))),
           "vjp_fn: the cotangent must have the structure of the output")

@case
def vjp_matches_finite_differences():
    out, vjp_fn = tg.vjp(layer, x)
    (ct,) = vjp_fn(np.array([1.0, 10.0, 100.0]))
    # d/dx of [x0^2 + x1^2, x1^2, 0] against the cotangent: [2 x0, 2 x1 (1 + 10)]
    same(ct, np.array([2 * x[0], 2 * x[1] * 11.0]))

@case
def loops_that_change_shape_or_count():
    raises(tg.ShapeError, lambda: tg.repeat(2, lambda s: s.sum(), x),
           "repeat: carried value 0 changes type from f64[2] to f64[]")
    raises(tg.TigaError, lambda: tg.repeat(-1, lambda s: s, x),
           "repeat: n must be a non-negative Python int, found -1")
    raises(tg.TigaError, lambda: tg.while_loop(lambda s: s.sum() < 9, lambda s: s * 2.0, x,
                                               max_iterations=-1),
           "while_loop: max_iterations must be >= 0, found -1")

@case
def grad_through_a_data_dependent_loop():
    f = lambda v: tg.while_loop(lambda s: s.sum() < 10, lambda s: s * 2.0, v,
                                max_iterations=5).sum()
    err = raises(tg.UnsupportedError, lambda: tg.grad(f)(x), "while_loop", "VJP")
    assert "tg.repeat" in err.hint

@case
def numpy_and_python_conversions_under_jit():
    raises(tg.UnsupportedError, lambda: tg.jit(lambda v: np.sum(v))(x), "np.sum",
           "tg.math.sum")
    raises(tg.TraceError, lambda: tg.jit(lambda v: float(v.sum()))(x), "float() of the traced")
    raises(tg.TraceError, lambda: tg.jit(lambda v: v if v.sum() > 0 else -v)(x),
           "no concrete truth value")

@case
def unhashable_static_argument():
    raises(tg.TigaError, lambda: tg.jit(lambda a, b: a, static_argnums=(1,))(x, [1]),
           "static arguments must be hashable")
'''


def test_transformations_reject_malformed_requests():
    check_cases(TRANSFORMATIONS_REJECT_MALFORMED_REQUESTS)
