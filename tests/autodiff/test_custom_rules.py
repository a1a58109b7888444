"""tg.custom_vjp and tg.custom_jvp: the user's rule is what differentiation runs.

Each rule here deliberately differs from the true derivative (clipping, a straight-through
estimator, a scaled JVP), so a test that passes shows the rule was used; the oracle is the
rule's formula in numpy. Custom functions also run inside edge functions and loop bodies,
under tg.jit, under vmap, and on the reference interpreter; derived programs (gradients,
JVPs, batched programs) hold the function inlined, so they compile in strict mode.
"""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.autodiff.inlining import has_custom_calls
from tiga.core.prims.custom import custom_vjp_call_p

m = tg.math
G = tg.Graph.from_coo(np.array([0, 1, 2, 2]), np.array([1, 2, 0, 1]), num_src=3, num_dst=3)
X = np.array([[1.0, -0.5], [2.0, 0.25], [-3.0, 1.5]])


@tg.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None),
                     lambda res, ct: (m.minimum(m.maximum(ct, -0.1), 0.1),))


@tg.custom_vjp
def straight_through_floor(x):
    return m.floor(x)


straight_through_floor.defvjp(lambda x: (m.floor(x), None), lambda res, ct: (ct,))


@tg.custom_vjp
def sin_twice(x):
    return m.sin(x)


def _sin_fwd(x):
    return sin_twice(x), m.cos(x)   # the rule may call the function itself


sin_twice.defvjp(_sin_fwd, lambda cos_x, ct: (2.0 * cos_x * ct,))


@pytest.fixture
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


def test_clipped_gradient_is_used():
    def loss(x):
        return m.sum(clip_gradient(x) ** 2)

    got = np.asarray(tg.grad(loss)(X))
    np.testing.assert_allclose(got, np.clip(2 * X, -0.1, 0.1))
    np.testing.assert_allclose(float(np.asarray(loss(X))), float(np.sum(X ** 2)))


def test_straight_through_estimator():
    def loss(x):
        return m.sum(straight_through_floor(x) * 3.0)

    np.testing.assert_allclose(np.asarray(tg.grad(loss)(X)), np.full(X.shape, 3.0))


def test_residuals_reach_the_backward_and_vjp_matches():
    out, pull = tg.vjp(sin_twice, X)
    np.testing.assert_allclose(np.asarray(out), np.sin(X))
    ct = np.random.default_rng(0).standard_normal(X.shape)
    np.testing.assert_allclose(np.asarray(pull(ct)[0]), 2 * np.cos(X) * ct, rtol=1e-12)


def _edge_loss(x):
    y = tg.propagate(G, lambda s, d, e: clip_gradient(s.x) * d.x, tg.sum(), src={"x": x},
                     dst={"x": x})
    return m.sum(y)


def _edge_oracle(x):
    """d/dx of sum_e x_src * x_dst with the source factor's gradient clipped."""
    row_ptr, col = G.resolve_csr()
    grad = np.zeros_like(x)
    for d in range(3):
        for s in col[row_ptr[d]:row_ptr[d + 1]]:
            grad[s] += np.clip(x[d], -0.1, 0.1)   # through the clipped source factor
            grad[d] += x[s]                         # through the plain destination factor
    return grad


def test_custom_vjp_inside_an_edge_function(strict):
    np.testing.assert_allclose(np.asarray(tg.grad(_edge_loss)(X)), _edge_oracle(X),
                               rtol=1e-12)


def test_derived_programs_hold_the_function_not_the_call(strict):
    program = tg.make_program(_edge_loss)(X)
    sub = program.eqns[0].params["edge_fn"].program
    assert custom_vjp_call_p in [e.primitive for e in sub.eqns]   # staged with its rule
    derived = tg.make_program(lambda x: tg.grad(_edge_loss)(x))(X)
    assert not has_custom_calls(derived)
    batched = tg.make_program(tg.vmap(_edge_loss))(np.stack([X, X]))
    assert has_custom_calls(batched)            # batched with its rule (grad may follow)
    derived = tg.make_program(lambda xs: tg.grad(lambda xs: m.sum(tg.vmap(_edge_loss)(xs)))(
        xs))(np.stack([X, X]))
    assert not has_custom_calls(derived)
    np.testing.assert_allclose(np.asarray(tg.vmap(_edge_loss)(np.stack([X, X]))),
                               [float(np.asarray(tg.eval_program(program, X)[0]))] * 2)
    want = float(np.asarray(tg.eval_program(program, X)[0]))     # the reference interpreter
    # (a plain call and a jitted one run the function itself, inlined into the edge
    # function's kernel where it is lowered: they compile, so strict mode runs them)
    np.testing.assert_allclose(float(np.asarray(tg.jit(_edge_loss)(X))), want, rtol=1e-12)
    np.testing.assert_allclose(float(np.asarray(_edge_loss(X))), want, rtol=1e-12)


def test_custom_vjp_in_a_loop_body():
    def loss(x):
        return m.sum(tg.repeat(3, lambda h: clip_gradient(h) * 2.0, x))

    np.testing.assert_allclose(np.asarray(tg.grad(loss)(X)), np.full(X.shape, 0.1))


def test_per_sample_gradients_through_a_custom_vjp():
    def loss(x):
        return m.sum(clip_gradient(x) ** 2)

    xs = np.stack([X, 0.01 * X])
    got = np.asarray(tg.vmap(tg.grad(loss))(xs))
    np.testing.assert_allclose(got, np.clip(2 * xs, -0.1, 0.1))


def test_a_batched_custom_function_keeps_its_rule():
    """grad of vmap: the batched call still runs the user's backward (clipped), and a
    shared argument's cotangent sums over the instances."""
    def f(x, s):
        return m.sum(clip_gradient(x * s) ** 2)

    xs = np.stack([X, 0.01 * X])
    s = np.array(1.0)
    g_x, g_s = tg.grad(lambda xs, s: m.sum(tg.vmap(f, in_axes=(0, None))(xs, s)),
                       argnums=(0, 1))(xs, s)
    clipped = np.clip(2 * xs * s, -0.1, 0.1)
    np.testing.assert_allclose(np.asarray(g_x), clipped * s, rtol=1e-12)
    np.testing.assert_allclose(float(np.asarray(g_s)), float(np.sum(clipped * xs)), rtol=1e-12)
    v = np.ones_like(xs)
    _, t = tg.jvp(tg.vmap(scaled_tanh), (xs,), (v,))
    np.testing.assert_allclose(np.asarray(t), 2 / np.cosh(xs) ** 2, rtol=1e-12)
    g = tg.grad(lambda xs: m.sum(tg.vmap(scaled_tanh)(xs)))(xs)
    np.testing.assert_allclose(np.asarray(g), 2 / np.cosh(xs) ** 2, rtol=1e-12)


def test_forward_mode_goes_through_the_primal_of_a_custom_vjp():
    _, t = tg.jvp(lambda x: sin_twice(x), (X,), (np.ones_like(X),))
    np.testing.assert_allclose(np.asarray(t), np.cos(X), rtol=1e-12)


@tg.custom_jvp
def scaled_tanh(x):
    return m.tanh(x)


# twice the true derivative, so that the rule, not the function, is visibly differentiated
scaled_tanh.defjvp(lambda p, t: (scaled_tanh(p[0]), 2.0 * t[0] * (1 - m.tanh(p[0]) ** 2)))


def test_custom_jvp_forward_and_transposed():
    v = np.random.default_rng(1).standard_normal(X.shape)
    y, t = tg.jvp(scaled_tanh, (X,), (v,))
    np.testing.assert_allclose(np.asarray(y), np.tanh(X), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(t), 2 * v / np.cosh(X) ** 2, rtol=1e-12)
    g = tg.grad(lambda x: m.sum(scaled_tanh(x) * 3.0))(X)
    np.testing.assert_allclose(np.asarray(g), 6 / np.cosh(X) ** 2, rtol=1e-12)


def test_eager_calls_run_the_function():
    np.testing.assert_allclose(np.asarray(straight_through_floor(X)), np.floor(X))
    np.testing.assert_allclose(np.asarray(scaled_tanh(X)), np.tanh(X))


def test_rule_errors_are_explained():
    @tg.custom_vjp
    def f(x):
        return x

    with pytest.raises(tg.TigaError, match="defvjp"):
        tg.grad(lambda x: m.sum(f(x)))(X)
    f.defvjp(lambda x: (x, None), lambda res, ct: (ct, ct))
    with pytest.raises(tg.TigaError, match="one cotangent per argument"):
        tg.grad(lambda x: m.sum(f(x)))(X)
