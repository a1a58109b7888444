"""Forward mode: every JVP rule against float64 central differences and against the VJP.

Two independent oracles per case of test_vjp_rules.CASES (each applies one primitive at the
top level): the directional central difference (f(x + e v) - f(x - e v)) / 2e, and the
adjoint identity <u, jvp(v)> = <vjp(u), v>. Random relations (hypothesis) check every
reducer and relation kind the same way; strict mode checks that the derived programs
compile (no reference fallback); linearize, jacfwd, jacrev and hessian are checked against
dense finite differences.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_vjp_rules import (
    CASES,
    Case,
    _fields,
    _row_attention,
    direct_propagate,
    top_level_primitives,
)

import tiga as tg
from tiga.autodiff import NONDIFF
from tiga.autodiff.jvp import jvp_rules
from tiga.core.primitive import all_primitives
from tiga.trace.pytree import tree_flatten

m = tg.math


def _leaves(tree) -> list:
    return [np.asarray(v, np.float64) for v in tree_flatten(tree)[0]]


def _directional_fd(fn, xs, vs, eps):
    plus = fn(*[x + eps * v for x, v in zip(xs, vs)])
    minus = fn(*[x - eps * v for x, v in zip(xs, vs)])
    return [(p - q) / (2 * eps) for p, q in zip(_leaves(plus), _leaves(minus))]


def _tangents(xs, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(x)).astype(np.asarray(x).dtype) for x in xs]


def check_jvp_fd(fn, xs, *, seed=0, fd_fn=None, eps=1e-6, tol=1e-5):
    xs = [np.asarray(x) for x in xs]
    vs = _tangents(xs, seed)
    y, ty = tg.jvp(fn, tuple(xs), tuple(vs))
    for a, b in zip(_leaves(y), _leaves((fd_fn or tg.jit(fn))(*xs))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    fd = _directional_fd(fd_fn or tg.jit(fn), xs, vs, eps)
    got = _leaves(ty)
    assert len(got) == len(fd)
    for g, want in zip(got, fd):
        np.testing.assert_allclose(g, want, rtol=tol, atol=tol)


def check_adjoint(fn, xs, *, seed=0, rtol=1e-9):
    """<u, J v> from jvp equals <J^T u, v> from vjp."""
    xs = [np.asarray(x) for x in xs]
    vs = _tangents(xs, seed)
    _, ty = tg.jvp(fn, tuple(xs), tuple(vs))
    out, pull = tg.vjp(fn, *xs)
    leaves, tree = tree_flatten(out)
    rng = np.random.default_rng(seed + 1)
    us = [rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype) for v in leaves]
    from tiga.trace.pytree import tree_unflatten
    cts = pull(tree_unflatten(tree, us))
    lhs = sum(float(np.sum(u * t)) for u, t in zip(us, _leaves(ty)))
    rhs = sum(float(np.sum(np.asarray(c, np.float64) * v)) for c, v in zip(cts, vs))
    scale = max(1.0, abs(lhs), abs(rhs))
    assert abs(lhs - rhs) <= rtol * scale * 1e3, (lhs, rhs)


def _fd_cases():
    # at an exact tie the VJP (and the JVP, to stay its transpose) splits evenly; a
    # directional difference there is one-sided, so tie cases are checked by the adjoint
    return [pytest.param(c, id=c.id) for c in CASES if "ties" not in c.id]


@pytest.mark.parametrize("c", _fd_cases())
def test_jvp_matches_central_differences(c: Case):
    xs = c.inputs()
    assert set(c.prims) <= top_level_primitives(c.fn, xs)
    check_jvp_fd(c.fn, xs, seed=zlib.crc32(c.id.encode()), fd_fn=c.fd_fn, eps=c.eps,
                 tol=c.tol)


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in CASES])
def test_jvp_is_the_transpose_of_the_vjp(c: Case):
    check_adjoint(c.fn, c.inputs(), seed=zlib.crc32(c.id.encode()))


def test_every_primitive_has_a_jvp_rule_and_a_case():
    covered = {p for c in CASES for p in c.prims} | {"while_loop"}   # while: below
    for p in all_primitives():
        rule = jvp_rules.get(p)
        assert rule is NONDIFF or callable(rule), f"{p.name}: no JVP rule"
        if rule is not NONDIFF:
            assert p.name in covered, f"{p.name}: no central-difference case"


# ---- random relations (hypothesis) -----------------------------------------------------------

REDUCERS = ["sum", "mean", "max", "min", "prod", "online_softmax"]


@st.composite
def relations(draw):
    """A csr relation with empty rows, duplicates, self edges (or none at all), or an
    implicit one: dense, triangular, a 1-d stencil (periodic or not), cu_seqlens."""
    kind = draw(st.sampled_from(["csr", "csr", "dense", "triangular", "stencil",
                                 "cu_seqlens"]))
    n = draw(st.integers(1, 6))
    if kind == "dense":
        return tg.Graph.dense(n, n)
    if kind == "triangular":
        return tg.Graph.triangular(n)
    if kind == "stencil":
        return tg.Graph.stencil((n,), [(-1,), (0,), (1,)], periodic=draw(st.booleans()))
    if kind == "cu_seqlens":
        cut = sorted(set(draw(st.lists(st.integers(1, n), max_size=3))) | {n})
        return tg.Graph.cu_seqlens(np.array([0] + cut, np.int64), causal=draw(st.booleans()))
    e = draw(st.integers(0, 14))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    return tg.Graph.from_coo(np.array(src, np.int64), np.array(dst, np.int64),
                             num_src=n, num_dst=n)


def _reducer_fn(g, name):
    if name == "online_softmax":
        red = tg.online_softmax()

        def edge(src, dst, edge):
            return red(m.sum(src.x * dst.h, axis=-1), m.tanh(src.x) + dst.h)
        return lambda x, h: tg.propagate(g, edge, red, src={"x": x}, dst={"h": h})
    red = getattr(tg, name)()
    return lambda x, h: tg.propagate(g, lambda s, d, e: m.sin(s.x) * d.h + s.x, red,
                                     src={"x": x}, dst={"h": h})


@pytest.mark.parametrize("name", REDUCERS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=relations(), seed=st.integers(0, 2 ** 16))
def test_propagate_jvp_on_random_relations(name, g, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((g.num_src, 2, 3))
    h = rng.standard_normal((g.num_dst, 2, 3))
    f = _reducer_fn(g, name)
    check_adjoint(f, [x, h], seed=seed)
    # distinct messages keep max/min away from ties (duplicate edges tie exactly: the
    # adjoint above covers them)
    if name not in ("max", "min") or g.kind != "csr" or _distinct(g):
        check_jvp_fd(f, [x, h], seed=seed, tol=1e-5)


def _distinct(g) -> bool:
    _, col = g.resolve_csr()
    row_ptr, _ = g.resolve_csr()
    return all(len(set(col[a:b])) == b - a for a, b in zip(row_ptr[:-1], row_ptr[1:]))


# ---- compiled route (strict mode) ------------------------------------------------------------

@pytest.fixture
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


_COMPILED = [c for c in CASES if c.id.startswith("propagate-") and "-by-" not in c.id]


@pytest.mark.parametrize("c", [pytest.param(c, id=c.id) for c in _COMPILED])
def test_propagate_jvp_compiles_in_strict_mode(c: Case, strict):
    xs = c.inputs()
    vs = _tangents(xs, 0)
    y, ty = tg.jvp(c.fn, tuple(xs), tuple(vs))
    assert all(np.all(np.isfinite(t)) for t in _leaves(ty))


def test_sum_propagate_jvp_is_one_propagate():
    g = tg.Graph.from_coo(np.array([0, 1, 2]), np.array([1, 2, 0]), num_src=3, num_dst=3)

    def f(x):
        return tg.propagate(g, lambda s, d, e: m.tanh(s.x), tg.sum(), src={"x": x})

    x = np.ones((3, 2))
    prog = tg.make_program(lambda x, t: tg.jvp(f, (x,), (t,)))(x, x)
    assert [e.primitive.name for e in prog.eqns].count("propagate") == 1


def _laplacian_energy(n):
    """0.5 * sum over edges of w (x_i - x_j)^2 on a ring, plus a quartic term: a mesh
    Laplacian's energy, so the Hessian is L + diag(3 x^2)."""
    src = np.concatenate([np.arange(n), (np.arange(n) + 1) % n])
    dst = np.concatenate([(np.arange(n) + 1) % n, np.arange(n)])
    g = tg.Graph.from_coo(src, dst, num_src=n, num_dst=n)

    def energy(x):
        diff = tg.propagate(g, lambda s, d, e: (s.x - d.x) ** 2, tg.sum(), src={"x": x},
                            dst={"x": x})
        return 0.25 * m.sum(diff) + 0.25 * m.sum(x ** 4)
    return energy


def test_hvp_by_jvp_of_grad_compiles_and_matches_finite_differences(strict):
    n = 7
    f = _laplacian_energy(n)
    rng = np.random.default_rng(3)
    x, v = rng.standard_normal(n), rng.standard_normal(n)
    _, hv = tg.jvp(tg.grad(f), (x,), (v,))
    eps = 1e-6
    want = (np.asarray(tg.grad(f)(x + eps * v)) - np.asarray(tg.grad(f)(x - eps * v))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(hv), want, rtol=1e-6, atol=1e-6)


def _dense_jacobian(fn, x, eps=1e-6):
    x = np.asarray(x, np.float64)
    y0 = np.asarray(fn(x))
    jac = np.zeros(y0.shape + x.shape)
    for idx in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        jac[(Ellipsis,) + idx] = (np.asarray(fn(x + d)) - np.asarray(fn(x - d))) / (2 * eps)
    return jac


def _small_propagate():
    g = tg.Graph.from_coo(np.array([0, 1, 2, 2, 0]), np.array([1, 2, 0, 1, 0]),
                          num_src=3, num_dst=3)

    def f(x):
        return tg.propagate(g, lambda s, d, e: m.tanh(s.x) * d.x, tg.max(), src={"x": x},
                            dst={"x": x})
    return f


@pytest.mark.parametrize("jac", ["jacfwd", "jacrev"])
def test_jacobians_match_dense_finite_differences(jac, strict):
    f = _small_propagate()
    x = np.random.default_rng(1).standard_normal((3, 2))
    got = np.asarray(getattr(tg, jac)(f)(x))
    np.testing.assert_allclose(got, _dense_jacobian(tg.jit(f), x), rtol=1e-6, atol=1e-7)


def test_hessian_matches_dense_finite_differences(strict):
    n = 5
    f = _laplacian_energy(n)
    h = tg.hessian(f)
    for seed in (2, 3):   # the second call runs the cached program
        x = np.random.default_rng(seed).standard_normal(n)
        got = np.asarray(h(x))
        want = _dense_jacobian(tg.grad(f), x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, got.T, rtol=1e-10, atol=1e-10)


def test_linearize_reuses_the_point():
    f = _small_propagate()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 2))
    y, f_jvp = tg.linearize(f, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(x)))
    for _ in range(2):
        v = rng.standard_normal((3, 2))
        np.testing.assert_allclose(np.asarray(f_jvp(v)), np.asarray(tg.jvp(f, (x,), (v,))[1]),
                                   rtol=1e-12, atol=1e-12)


def test_while_loop_jvp_rides_along_the_body():
    def f(x):
        def body(s):
            i, v = s
            return i + 1, m.sin(v) * 1.5
        return tg.while_loop(lambda s: s[0] < 4, body, (np.int64(0), x), 10)[1]

    x = np.random.default_rng(5).standard_normal(3)
    check_jvp_fd(f, [x], tol=1e-6)


def test_jvp_with_relation_argument_and_pytrees():
    g = tg.Graph.from_coo(np.array([0, 1]), np.array([1, 0]), num_src=2, num_dst=2)

    def f(graph, params):
        y = tg.propagate(graph, lambda s, d, e: s.x * s.x, tg.sum(), src={"x": params["x"]})
        return {"y": y, "s": m.sum(y) * params["a"]}

    p = {"x": np.array([[1.0], [2.0]]), "a": np.array(3.0)}
    t = {"x": np.array([[1.0], [0.0]]), "a": np.array(1.0)}
    y, ty = tg.jvp(f, (g, p), (None, t))
    np.testing.assert_allclose(np.asarray(ty["y"]), [[0.0], [2.0]])
    np.testing.assert_allclose(float(np.asarray(ty["s"])), 2.0 * 3.0 + 5.0)


def test_online_softmax_row_statistics_jvp_on_the_reference():
    """online_softmax(stats) also returns the row max and mass (the attention VJP's
    residuals); their tangents are checked on the reference interpreter, the oracle."""
    from tiga.autodiff.jvp import jvp_program

    f = direct_propagate(tg.online_softmax().with_stats(), "dst", _row_attention)
    xs = _fields(np.random.default_rng(0))
    prog = tg.make_program(f)(*xs)
    vs = _tangents(xs, 1)
    res = tg.eval_program(jvp_program(prog, [True] * 4), *xs, *vs)
    eps = 1e-6
    plus = tg.eval_program(prog, *[x + eps * v for x, v in zip(xs, vs)])
    minus = tg.eval_program(prog, *[x - eps * v for x, v in zip(xs, vs)])
    for k in range(3):
        fd = (np.asarray(plus[k]) - np.asarray(minus[k])) / (2 * eps)
        np.testing.assert_allclose(np.asarray(res[3 + k]), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_jvp_through_generated_relation_positions(kind, strict):
    """Topology is fixed; values are differentiated through edge.distance."""
    pos = np.random.default_rng(6).uniform(0, 1, (24, 3))

    def f(p):
        g = tg.Graph.radius(p, 0.45) if kind == "radius" else tg.Graph.knn(p, 4)
        return tg.propagate(g, lambda s, d, e: m.exp(-e.distance ** 2), tg.sum(), src={},
                            dst={})

    check_jvp_fd(f, [pos], seed=7, tol=1e-6)


def test_user_reducer_forward_mode_is_an_explained_error():
    red = tg.Reducer("logsumexp", identity=-np.inf, combine=lambda a, b: m.maximum(a, b))
    g = tg.Graph.from_coo(np.array([0, 1]), np.array([1, 0]), num_src=2, num_dst=2)

    def f(x):
        return tg.propagate(g, lambda s, d, e: s.x, red, src={"x": x})

    with pytest.raises(tg.UnsupportedError, match="user reducer"):
        tg.jvp(f, (np.ones((2, 1)),), (np.ones((2, 1)),))
