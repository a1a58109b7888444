"""vmap against a Python loop of the unbatched call (the oracle), primitive by primitive.

Every case of test_vjp_rules.CASES (each applies one primitive at the top level) is mapped
over a batch of inputs, with every argument mapped and with the first one shared; propagates
over batched fields stay one propagate; nested vmap, vmap of grad (per-sample gradients),
jit of vmap, loops and strict-mode compilation are checked the same way.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_jvp import REDUCERS, _reducer_fn, relations
from test_vjp_rules import CASES, GRAPH, Case, _fields, _functional

import tiga as tg
from tiga.autodiff.batching import batch_rules
from tiga.core.primitive import all_primitives
from tiga.trace.pytree import tree_flatten

m = tg.math
B = 3


def _leaves(tree):
    return [np.asarray(v) for v in tree_flatten(tree)[0]]


def _batch(c: Case, size=B):
    per = [c.inputs() for _ in range(size)]
    rng = np.random.default_rng(len(c.id))
    # distinct instances: perturb all but the first (ties stay ties in the first)
    for k in range(1, size):
        per[k] = [x + 0.05 * k * rng.standard_normal(np.shape(x)) if np.asarray(x).dtype.kind
                  == "f" else x for x in per[k]]
    return per


def _check_loop(fn, per, in_axes, tol=1e-10):
    n = len(per[0])
    stacked = [np.stack([p[i] for p in per]) if in_axes[i] == 0 else per[0][i]
               for i in range(n)]
    got = _leaves(tg.vmap(fn, in_axes=tuple(in_axes))(*stacked))
    one = tg.jit(fn)   # (the unbatched call, traced on arrays as the cases are written)
    wants = [_leaves(one(*[p[i] if in_axes[i] == 0 else per[0][i] for i in range(n)]))
             for p in per]
    assert len(got) == len(wants[0])
    for k, g in enumerate(got):
        want = np.stack([w[k] for w in wants])
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_vmap_matches_a_loop_all_mapped(c: Case):
    per = _batch(c)
    _check_loop(c.fn, per, [0] * len(per[0]))


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES
                               if len(c.inputs()) > 1])
def test_vmap_matches_a_loop_first_shared(c: Case):
    per = _batch(c)
    _check_loop(c.fn, per, [None] + [0] * (len(per[0]) - 1))


def test_every_primitive_has_a_batching_rule():
    missing = [p.name for p in all_primitives() if not callable(batch_rules.get(p))]
    assert not missing, f"no batching rule: {missing}"


def _propagates(fn, *args):
    prog = tg.make_program(fn)(*args)
    return [e.primitive.name for e in prog.eqns].count("propagate")


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
def test_vmap_of_a_propagate_is_one_propagate(name):
    f = _functional(getattr(tg, name)())
    xs = _fields(np.random.default_rng(0))
    batched = [np.stack([x] * 4) for x in xs]
    assert _propagates(tg.vmap(f), *batched) == 1
    assert _propagates(tg.vmap(f, in_axes=(0, None, None, None)), batched[0], *xs[1:]) == 1


def test_vmap_over_rows_first_fields_moves_nothing():
    """in_axes=1 / out_axes=1 on (rows, B, F) fields: the batch is already where the
    propagate's rule wants it (behind the rows), so the program has no transpose."""
    from tiga.core.passes import dce
    f = _functional(tg.sum())
    x, h, w, s = _fields(np.random.default_rng(3))
    xs = np.stack([x, 2 * x, -x], axis=1)
    vf = tg.vmap(f, in_axes=(1, None, None, None), out_axes=1)
    prog = dce(tg.make_program(vf)(xs, h, w, s))
    assert [e.primitive.name for e in prog.eqns].count("transpose") == 0
    got = np.asarray(vf(xs, h, w, s))
    for k in range(3):
        np.testing.assert_allclose(got[:, k], np.asarray(f(xs[:, k], h, w, s)),
                                   rtol=1e-12, atol=1e-12)


def test_per_sample_gradients():
    f = _functional(tg.max())

    def loss(x, h, w, s):
        return m.sum(f(x, h, w, s) ** 2)

    per = [_fields(np.random.default_rng(k)) for k in range(4)]
    x = np.stack([p[0] for p in per])
    got = np.asarray(tg.vmap(tg.grad(loss), in_axes=(0, None, None, None))(x, *per[0][1:]))
    for k in range(4):
        want = np.asarray(tg.grad(loss)(x[k], *per[0][1:]))
        np.testing.assert_allclose(got[k], want, rtol=1e-10, atol=1e-12)


def test_nested_vmap_and_jit_and_axes():
    f = _functional(tg.sum())
    x, h, w, s = _fields(np.random.default_rng(1))
    xs = np.random.default_rng(2).standard_normal((2, 3) + x.shape)
    inner = tg.vmap(f, in_axes=(0, None, None, None))
    got = np.asarray(tg.jit(tg.vmap(inner, in_axes=(0, None, None, None)))(xs, h, w, s))
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(got[i, j], np.asarray(f(xs[i, j], h, w, s)),
                                       rtol=1e-12, atol=1e-12)
    # the batch along axis 1 of the field, placed last in the result
    moved = np.moveaxis(xs[0], 0, 1)
    got = np.asarray(tg.vmap(f, in_axes=(1, None, None, None), out_axes=-1)(moved, h, w, s))
    for j in range(3):
        np.testing.assert_allclose(got[..., j], np.asarray(f(xs[0, j], h, w, s)),
                                   rtol=1e-12, atol=1e-12)


def test_vmap_of_a_while_loop_with_a_batched_condition():
    def f(x, limit):
        def body(state):
            i, v = state
            return i + 1, v * 1.5 + 1.0
        return tg.while_loop(lambda st: m.sum(st[1]) < limit, body, (np.int64(0), x), 20)

    x = np.random.default_rng(3).standard_normal((4, 2))
    limits = np.array([0.0, 5.0, 50.0, 500.0])
    got = tg.vmap(f)(x, limits)
    for k in range(4):
        want = f(x[k], limits[k])
        assert int(np.asarray(got[0])[k]) == int(np.asarray(want[0]))
        np.testing.assert_allclose(np.asarray(got[1])[k], np.asarray(want[1]), rtol=1e-12)


def test_vmap_compiles_in_strict_mode():
    old = tg.config.strict
    tg.config.strict = True
    try:
        c = next(c for c in CASES if c.id == "propagate-online_softmax-multihead")
        _check_loop(c.fn, _batch(c), [0] * 5)
        f = _functional(tg.prod())
        _check_loop(f, [_fields(np.random.default_rng(k)) for k in range(3)], [0, 0, None, 0])
    finally:
        tg.config.strict = old


def test_relations_are_never_batched():
    def f(g, x):
        return tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})

    x = np.random.default_rng(4).standard_normal((2, GRAPH.num_src, 3))
    got = np.asarray(tg.vmap(f)(GRAPH, x))
    np.testing.assert_allclose(got[1], np.asarray(f(GRAPH, x[1])))


@pytest.mark.parametrize("name", REDUCERS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=relations(), seed=st.integers(0, 2 ** 16))
def test_vmap_of_a_propagate_on_random_relations(name, g, seed):
    rng = np.random.default_rng(seed)
    per = [[rng.standard_normal((g.num_src, 2, 3)), rng.standard_normal((g.num_dst, 2, 3))]
           for _ in range(B)]
    f = _reducer_fn(g, name)
    _check_loop(f, per, [0, 0])
    _check_loop(f, per, [None, 0])
