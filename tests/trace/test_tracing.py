"""Tracing: make_program, the jit cache, pytrees, tg.math vs numpy, operators, indexing,
dtype promotion, structured control flow, tracer misuse, and eager tg.Tensor operations.

Numerical oracles are numpy/scipy (or plain Python loops for control flow); each tg.math check
runs both eagerly (numpy in, tg.Tensor out) and under tg.jit (traced, then interpreted).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tiga as tg
from tiga.core.types import TensorType
from tiga.trace.pytree import tree_map

m = tg.math
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rng(seed=0):
    return np.random.default_rng(seed)


def both_ways(fn, *args):
    """fn run eagerly on tg.Tensor arguments and under tg.jit on the numpy arguments."""
    eager = fn(*tree_map(lambda a: tg.asarray(a) if isinstance(a, np.ndarray) else a,
                         list(args)))
    traced = tg.jit(fn)(*args)
    return eager, traced


def assert_close_tree(got, want, rtol, atol=0.0):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, type(want)) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_close_tree(g, w, rtol, atol)
        return
    assert isinstance(got, tg.Tensor), f"expected a tg.Tensor, found {type(got).__name__}"
    g = np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ---- make_program ------------------------------------------------------------------------------


def test_make_program_types_and_printing():
    x = np.zeros((2, 3), np.float32)

    def f(a, b, n):
        return {"prod": a * b, "total": a.sum(axis=1)}, [n + 1]

    program = tg.make_program(f)(x, np.ones(3), 2)
    assert isinstance(program, tg.GraphProgram)
    tg.check_program(program)
    assert program.in_types == [TensorType((2, 3), tg.float32), TensorType((3,), tg.float64),
                                TensorType((), tg.int64, weak=True)]
    # outputs flatten in pytree order (dict keys sorted): prod, total, then the list
    assert [t.strong() for t in program.out_types] == [
        TensorType((2, 3), tg.float64), TensorType((2,), tg.float32), TensorType((), tg.int64)]
    text = str(program)
    assert text.startswith("{ lambda ; a:f32[2,3] b:f64[3] c:i64[].")
    assert "reduce_sum[axes=(1,)]" in text and "convert" in text
    assert tg.pp_program(program) == text


def test_make_program_static_argnums_and_structural_equality():
    def f(x, k):
        return x * k

    mk = tg.make_program(f, static_argnums=1)
    p2 = mk(np.ones(3), 2.0)
    assert p2.in_types == [TensorType((3,), tg.float64)]  # the static value is not a binder
    assert mk(np.zeros(3), 2.0) == p2  # structure only, never values or identity
    assert mk(np.ones(3), 3.0) != p2
    assert mk(np.ones(4), 2.0) != p2


def test_make_program_of_python_scalars_is_weakly_typed():
    program = tg.make_program(lambda a, b: a * b)(np.ones(2, np.float32), 0.5)
    assert program.in_types[1] == TensorType((), tg.float64, weak=True)
    assert program.out_types[0].strong() == TensorType((2,), tg.float32)


# ---- jit cache -------------------------------------------------------------------------------


def test_jit_cache_hits_and_misses():
    calls = []

    def f(x, y):
        calls.append(1)  # counts traces: Python runs only while tracing
        return x * y + 1.0

    jf = tg.jit(f)
    x, y = rng().standard_normal((2, 3)), rng(1).standard_normal((2, 3))
    np.testing.assert_allclose(np.asarray(jf(x, y)), x * y + 1.0)
    # same signature, new values: a hit that computes with the new values
    np.testing.assert_allclose(np.asarray(jf(y, x + 2.0)), y * (x + 2.0) + 1.0)
    assert jf.cache_info() == {"hits": 1, "misses": 1, "entries": 1}
    assert len(calls) == 1
    jf(np.ones((3, 3)), np.ones((3, 3)))                                       # new shape
    jf(x.astype(np.float32), y.astype(np.float32))                             # new dtype
    jf(x, y)                                                                   # hit again
    assert jf.cache_info() == {"hits": 2, "misses": 3, "entries": 3}
    assert len(calls) == 3


def test_jit_python_scalars_are_arguments_not_constants():
    jf = tg.jit(lambda x, s: x * s)
    x = np.arange(3.0)
    np.testing.assert_allclose(np.asarray(jf(x, 2.0)), x * 2.0)
    np.testing.assert_allclose(np.asarray(jf(x, 5.0)), x * 5.0)
    assert jf.cache_info()["misses"] == 1


def test_jit_static_argnums():
    def f(x, n, op):
        return x * n if op == "mul" else x + n

    jf = tg.jit(f, static_argnums=(1, 2))
    x = np.arange(4.0)
    np.testing.assert_allclose(np.asarray(jf(x, 3, "mul")), x * 3)
    np.testing.assert_allclose(np.asarray(jf(x + 1, 3, "mul")), (x + 1) * 3)
    np.testing.assert_allclose(np.asarray(jf(x, 3, "add")), x + 3)
    np.testing.assert_allclose(np.asarray(jf(x, 4, "add")), x + 4)
    assert jf.cache_info() == {"hits": 1, "misses": 3, "entries": 3}
    with pytest.raises(tg.TigaError, match="static arguments must be hashable"):
        jf(x, [1], "mul")


def test_jit_pytree_structure_is_part_of_the_key():
    jf = tg.jit(lambda t: sum(t) if isinstance(t, (list, tuple)) else t["a"])
    x = np.ones(2)
    jf((x, x))
    jf([x, x])
    jf((x, x, x))
    jf({"a": x})
    jf((x, x))
    assert jf.cache_info() == {"hits": 1, "misses": 4, "entries": 4}


def test_jit_lower_exposes_the_program():
    lowered = tg.jit(lambda x: m.exp(x) * 2.0).lower(np.ones(3, np.float32))
    assert "exp" in lowered.ir() and "f32[3]" in lowered.ir()
    out = lowered.compile()(np.zeros(3, np.float32))
    np.testing.assert_allclose(np.asarray(out), np.full(3, 2.0))


# ---- pytrees -----------------------------------------------------------------------------------


def test_pytrees_in_and_out():
    def f(tree):
        a, (b, c), nothing = tree["a"], tree["pair"], tree["none"]
        assert nothing is None
        return {"sum": a + b, "parts": [c * 2.0, (a, None)], "none": None}, (b - c,)

    r = rng(2)
    a, b, c = r.standard_normal(3), r.standard_normal(3), r.standard_normal(3)
    tree = {"a": a, "pair": (b, [c][0]), "none": None}
    for out in both_ways(f, tree):
        main, (diff,) = out
        assert set(main) == {"sum", "parts", "none"} and main["none"] is None
        np.testing.assert_allclose(np.asarray(main["sum"]), a + b)
        assert isinstance(main["parts"], list) and isinstance(main["parts"][1], tuple)
        np.testing.assert_allclose(np.asarray(main["parts"][0]), c * 2.0)
        np.testing.assert_allclose(np.asarray(main["parts"][1][0]), a)
        assert main["parts"][1][1] is None
        np.testing.assert_allclose(np.asarray(diff), b - c)


def test_grad_of_a_pytree_argument_returns_the_same_tree():
    def loss(p):
        return m.sum(p["w"] * p["w"]) + m.sum(p["b"][0] * 3.0)

    w, b = rng(3).standard_normal(3), rng(4).standard_normal(2)
    g = tg.grad(loss)({"w": w, "b": [b]})
    assert set(g) == {"w", "b"} and isinstance(g["b"], list)
    np.testing.assert_allclose(np.asarray(g["w"]), 2 * w)
    np.testing.assert_allclose(np.asarray(g["b"][0]), np.full(2, 3.0))


# ---- tg.math vs numpy ------------------------------------------------------------------------

SQRT2 = math.sqrt(2.0)
UNARY = {
    "exp": (m.exp, np.exp, "any"),
    "log": (m.log, np.log, "positive"),
    "sqrt": (m.sqrt, np.sqrt, "positive"),
    "rsqrt": (m.rsqrt, lambda x: 1.0 / np.sqrt(x), "positive"),
    "abs": (m.abs, np.abs, "any"),
    "relu": (m.relu, lambda x: np.maximum(x, 0), "any"),
    "gelu": (m.gelu, lambda x: 0.5 * x * (1 + scipy.special.erf(x / SQRT2)), "any"),
    "gelu-tanh": (lambda x: m.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                   * (x + 0.044715 * x ** 3))), "any"),
    "silu": (m.silu, lambda x: x * scipy.special.expit(x), "any"),
    "tanh": (m.tanh, np.tanh, "any"),
    "sigmoid": (m.sigmoid, scipy.special.expit, "any"),
    "zeros_like": (m.zeros_like, np.zeros_like, "any"),
    "ones_like": (m.ones_like, np.ones_like, "any"),
}


def _sample(kind, shape, dtype, seed):
    x = rng(seed).standard_normal(shape) * 3.0
    if kind == "positive":
        x = np.abs(x) + 0.1
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_math_matches_numpy(name, dtype):
    fn, ref, kind = UNARY[name]
    tol = 2e-6 if dtype == np.float32 else 1e-12
    for seed, shape in enumerate([(7,), (3, 4), (2, 1, 3), ()]):
        x = _sample(kind, shape, dtype, seed)
        want = ref(x.astype(np.float64))
        for got in both_ways(fn, x):
            assert got.dtype == tg.float32 if dtype == np.float32 else tg.float64
            assert_close_tree(got, want, rtol=tol, atol=tol)


def test_sigmoid_is_finite_at_large_magnitudes():
    x = np.array([-800.0, -50.0, 0.0, 50.0, 800.0])
    for got in both_ways(m.sigmoid, x):
        np.testing.assert_allclose(np.asarray(got), scipy.special.expit(x), rtol=1e-12)


@pytest.mark.parametrize("name,fn,ref", [
    ("maximum", m.maximum, np.maximum), ("minimum", m.minimum, np.minimum),
    ("add", m.add, np.add), ("multiply", m.multiply, np.multiply),
])
def test_binary_math_broadcasts_like_numpy(name, fn, ref):
    r = rng(5)
    for xs, ys in [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (2, 2))]:
        x, y = r.standard_normal(xs), r.standard_normal(ys)
        for got in both_ways(fn, x, y):
            assert_close_tree(got, ref(x, y), rtol=1e-12)


def test_where_matches_numpy():
    r = rng(6)
    x, y = r.standard_normal((3, 4)), r.standard_normal((4,))
    cond = r.standard_normal((3, 1)) > 0
    for got in both_ways(m.where, cond, x, y):
        assert_close_tree(got, np.where(cond, x, y), rtol=0)
    # a non-bool condition means "!= 0", and Python scalars adopt the array dtype
    c = np.array([0.0, 2.0, -1.0])
    for got in both_ways(lambda c, x: m.where(c, x, 0.5), c, x[0, :3].astype(np.float32)):
        assert got.dtype == tg.float32
        assert_close_tree(got, np.where(c != 0, x[0, :3], 0.5), rtol=1e-7)


MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 3), (3, 4)),
                 ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((2, 1, 2, 3), (5, 3, 2)),
                 ((1, 3), (4, 3, 1))]


@pytest.mark.parametrize("xs,ys", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_matches_numpy(xs, ys):
    r = rng(7)
    x, y = r.standard_normal(xs), r.standard_normal(ys)
    for got in both_ways(m.matmul, x, y):
        assert_close_tree(got, np.matmul(x, y), rtol=1e-12, atol=1e-12)
    for got in both_ways(lambda a, b: a @ b, x, y):
        assert_close_tree(got, x @ y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xs,ys", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 2)),
                                   ((2, 3), (3, 4)), ((2, 2, 3), (4, 3, 2)), ((), (3,))])
def test_dot_matches_numpy(xs, ys):
    r = rng(8)
    x, y = r.standard_normal(xs), r.standard_normal(ys)
    for got in both_ways(m.dot, x, y):
        assert_close_tree(got, np.dot(x, y), rtol=1e-12, atol=1e-12)


def test_matmul_rejects_scalars_and_mismatched_batches():
    with pytest.raises(tg.ShapeError, match="at least one dimension"):
        tg.jit(m.matmul)(np.ones(()), np.ones(3))
    with pytest.raises(tg.ShapeError, match="matmul batch axes"):
        tg.jit(m.matmul)(np.ones((2, 2, 3)), np.ones((3, 3, 1)))


def test_concatenate_and_stack_match_numpy():
    r = rng(9)
    a, b, c = r.standard_normal((2, 3)), r.standard_normal((2, 1)), r.standard_normal((2, 2))
    for got in both_ways(lambda *xs: m.concatenate(xs, axis=1), a, b, c):
        assert_close_tree(got, np.concatenate([a, b, c], axis=1), rtol=0)
    for got in both_ways(lambda *xs: m.concatenate(xs, axis=-1), a, b):
        assert_close_tree(got, np.concatenate([a, b], axis=-1), rtol=0)
    d = r.standard_normal((2, 3))
    for axis in (0, 1, 2, -1):
        for got in both_ways(lambda x, y, ax=axis: m.stack([x, y], axis=ax), a, d):
            assert_close_tree(got, np.stack([a, d], axis=axis), rtol=0)
    for got in both_ways(lambda x, y: m.stack([x, y], dim=1), a, d):
        assert_close_tree(got, np.stack([a, d], axis=1), rtol=0)
    # mixed dtypes promote like binary operators (int joins the float)
    i = np.arange(6, dtype=np.int32).reshape(2, 3)
    for got in both_ways(lambda x, y: m.concatenate([x, y]), a.astype(np.float32), i):
        assert got.dtype == tg.float32
        assert_close_tree(got, np.concatenate([a, i]).astype(np.float32), rtol=1e-7)


REDUCERS = {"sum": (m.sum, np.sum), "max": (m.max, np.max), "min": (m.min, np.min),
            "mean": (m.mean, np.mean)}
AXES = [None, 0, 1, -1, (0, 2), (2, 0, 1)]


@pytest.mark.parametrize("name", sorted(REDUCERS))
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(name, keepdims):
    fn, ref = REDUCERS[name]
    x = rng(10).standard_normal((2, 3, 4))
    for axis in AXES:
        want = ref(x, axis=axis, keepdims=keepdims)
        for got in both_ways(lambda a, ax=axis: fn(a, axis=ax, keepdims=keepdims), x):
            assert_close_tree(got, want, rtol=1e-12)
        # the method form and the dim= alias used by the report's listings
        meth = getattr(tg.asarray(x), name)(dim=axis, keepdims=keepdims)
        assert_close_tree(meth, want, rtol=1e-12)
        (traced,) = [tg.jit(lambda a, ax=axis: getattr(a, name)(dim=ax,
                                                                 keepdims=keepdims))(x)]
        assert_close_tree(traced, want, rtol=1e-12)


def test_reduction_axis_errors():
    x = np.ones((2, 3))
    with pytest.raises(tg.ShapeError, match="either axis= or dim="):
        tg.jit(lambda a: m.sum(a, axis=0, dim=0))(x)
    with pytest.raises(tg.ShapeError, match="axis 2 is out of range"):
        tg.jit(lambda a: a.max(axis=2))(x)
    with pytest.raises(tg.ShapeError, match="repeated axis"):
        tg.jit(lambda a: a.sum(axis=(0, -2)))(x)


def test_mean_of_integers_is_float32():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for got in both_ways(lambda a: m.mean(a, axis=1), x):
        assert got.dtype == tg.float32
        assert_close_tree(got, x.mean(axis=1), rtol=1e-7)


def test_zeros_and_ones_like_keep_shape_and_dtype():
    for dt, tdt in [(np.float32, tg.float32), (np.int64, tg.int64), (np.bool_, tg.bool_)]:
        x = np.zeros((2, 3), dt)
        for got in both_ways(m.ones_like, x):
            assert got.dtype == tdt and got.shape == (2, 3)
            np.testing.assert_array_equal(np.asarray(got), np.ones_like(x))
        z = tg.jit(lambda a: m.zeros_like(a, dtype=tg.float64))(x)
        assert z.dtype == tg.float64 and not np.asarray(z).any()


# ---- operators ---------------------------------------------------------------------------------

OPERATORS = {
    "add": lambda a, b: a + b, "radd": lambda a, b: 2.5 + a, "sub": lambda a, b: a - b,
    "rsub": lambda a, b: 2.5 - a, "mul": lambda a, b: a * b, "rmul": lambda a, b: 3 * a,
    "div": lambda a, b: a / b, "rdiv": lambda a, b: 2.0 / a, "pow": lambda a, b: a ** b,
    "pow-int": lambda a, b: a ** 3, "pow-float": lambda a, b: a ** 0.5,
    "rpow": lambda a, b: 2.0 ** a, "neg": lambda a, b: -a, "pos": lambda a, b: +a,
    "abs": lambda a, b: abs(b), "matmul": lambda a, b: a @ b.T,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "lt-scalar": lambda a, b: a < 1.0, "eq-scalar": lambda a, b: a == 1.0,
    "ne-scalar": lambda a, b: a != 1.0, "req-scalar": lambda a, b: 1.0 == a,
    "rgt-scalar": lambda a, b: 1.0 > a,
    "and": lambda a, b: (a > 1.0) & (b > 0.0), "or": lambda a, b: (a > 1.0) | (b > 0.0),
    "invert": lambda a, b: ~(a > 1.0),
    "numpy-left": lambda a, b: np.full(3, 0.5) * a - np.ones(3),
    "numpy-matmul-left": lambda a, b: np.ones((4, 3)) @ a.T,
    "transpose-T": lambda a, b: b.T,
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_operators_match_numpy(name):
    op = OPERATORS[name]
    a = np.array([[0.5, 1.0, 2.0], [1.5, 1.0, 3.0]])
    b = np.array([[1.0, 1.0, -2.0], [0.5, 2.0, 1.0]])
    want = op(a, b)  # numpy is the oracle of the same expression
    eager = op(tg.asarray(a), tg.asarray(b))
    traced = tg.jit(op)(a, b)
    for got in (eager, traced):
        assert isinstance(got, tg.Tensor)
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_methods_match_numpy():
    x = np.abs(rng(11).standard_normal((2, 3))) + 0.1

    def f(a):
        return (a.exp(), a.log(), a.sqrt(), a.abs(), a.relu(), a.tanh(), a.sigmoid(),
                a.norm(axis=-1), a.reshape(3, 2), a.reshape((-1,)), a.transpose(),
                a.transpose(1, 0), a.astype(tg.float32), a.square())

    want = (np.exp(x), np.log(x), np.sqrt(x), x, x, np.tanh(x), scipy.special.expit(x),
            np.linalg.norm(x, axis=-1), x.reshape(3, 2), x.reshape(-1), x.T, x.T,
            x.astype(np.float32), x * x)
    for got in both_ways(f, x):
        assert_close_tree(list(got), list(want), rtol=1e-6)


# ---- indexing -----------------------------------------------------------------------------------

INDICES = [1, -1, (0, 2), slice(None, None, 2), (slice(1, None), slice(None, None, 3)),
           None, (None, 0), Ellipsis, (Ellipsis, 1), (0, Ellipsis, None),
           (None, Ellipsis, slice(1, 3)), (slice(None), None, 2), (slice(5, 1),),
           (slice(-3, -1), slice(None), slice(1, 100, 2)), (1, 2, 3)]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_basic_indexing_matches_numpy(index):
    x = np.arange(60.0).reshape(3, 4, 5)
    want = x[index]
    for got in both_ways(lambda a: a[index], x):
        assert_close_tree(got, want, rtol=0)


@FAST
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5))
def test_random_basic_indices_match_numpy(data, shape):
    index = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    parts = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, slice) and (i.step or 1) < 0 for i in parts):
        with pytest.raises(tg.UnsupportedError, match="negative slice steps"):
            tg.jit(lambda a: a[index])(x)
        return
    got = tg.jit(lambda a: a[index])(x)
    np.testing.assert_array_equal(np.asarray(got), x[index])
    assert got.shape == x[index].shape


def test_indexing_errors_name_the_problem():
    x = np.ones((2, 3))
    with pytest.raises(tg.ShapeError, match="index 2 is out of range for axis 0 of size 2"):
        tg.jit(lambda a: a[2])(x)
    with pytest.raises(tg.ShapeError, match="too many entries"):
        tg.jit(lambda a: a[0, 0, 0])(x)
    with pytest.raises(tg.UnsupportedError, match="basic indexing"):
        tg.jit(lambda a: a[np.array([0, 1])])(x)
    with pytest.raises(tg.UnsupportedError, match="negative slice steps"):
        tg.jit(lambda a: a[::-1])(x)


# ---- dtype promotion -------------------------------------------------------------------------

PROMOTIONS = [
    # (x, y, expected dtype): int joins float at the float's width; Python scalars are weak
    (np.arange(3, dtype=np.int32), np.ones(3, np.float32), tg.float32),
    (np.arange(3, dtype=np.int64), np.ones(3, np.float32), tg.float32),
    (np.arange(3, dtype=np.int32), 1.5, tg.float32),
    (np.ones(3, np.float32), 2.5, tg.float32),
    (np.ones(3, np.float32), 2, tg.float32),
    (np.ones(3, np.float64), 2.5, tg.float64),
    (np.ones(3, np.float32), np.ones(3, np.float64), tg.float64),
    (np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64), tg.int64),
    (np.arange(3, dtype=np.int32), 7, tg.int32),
]


def _promotion_id(x, y) -> str:
    return f"{x.dtype}-{type(y).__name__ if np.isscalar(y) else y.dtype}"


@pytest.mark.parametrize("x,y,dtype", PROMOTIONS,
                         ids=[_promotion_id(x, y) for x, y, _ in PROMOTIONS])
def test_dtype_promotion(x, y, dtype):
    want = np.asarray(x, np.float64) * np.asarray(y, np.float64) + np.asarray(x, np.float64)
    for fn in (lambda a, b: a * b + a, lambda a, b: b * a + a):  # both operand orders
        program = tg.make_program(fn)(x, y)
        assert program.out_types[0].strong() == TensorType((3,), dtype)
        for got in (tg.jit(fn)(x, y), fn(tg.asarray(x), y)):
            assert got.dtype == dtype
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6)


def test_division_of_integers_is_float32():
    x, y = np.array([1, 2, 3], np.int32), np.array([2, 4, 5], np.int32)
    for got in both_ways(m.divide, x, y):
        assert got.dtype == tg.float32
        np.testing.assert_allclose(np.asarray(got), x / y, rtol=1e-7)


def test_float32_literals_do_not_widen():
    program = tg.make_program(lambda a: m.exp(a * 0.1) + 1e-3)(np.ones(2, np.float32))
    assert all(t.strong().dtype == tg.float32 for t in program.out_types)
    assert "f64" not in str(program)


# ---- repeat and while_loop ---------------------------------------------------------------------


def test_repeat_matches_a_python_loop():
    w = rng(12).standard_normal((3, 3)) * 0.5
    h0 = rng(13).standard_normal(3)

    def f(w, h):
        return tg.repeat(4, lambda s: (m.tanh(s[0] @ w), s[1] + m.sum(s[0])), (h, 0.0 * h[0]))

    want_h, want_acc = h0, 0.0
    for _ in range(4):
        want_h, want_acc = np.tanh(want_h @ w), want_acc + want_h.sum()
    for got_h, got_acc in both_ways(f, w, h0):
        np.testing.assert_allclose(np.asarray(got_h), want_h, rtol=1e-12)
        np.testing.assert_allclose(float(got_acc), want_acc, rtol=1e-12)
    program = tg.make_program(f)(w, h0)
    assert [e.primitive.name for e in program.eqns].count("repeat") == 1


def test_repeat_zero_times_is_identity_and_n_must_be_static():
    x = np.arange(3.0)
    np.testing.assert_array_equal(np.asarray(tg.jit(lambda a: tg.repeat(0, m.exp, a))(x)), x)
    with pytest.raises(tg.TigaError, match="n must be a non-negative Python int"):
        tg.jit(lambda a: tg.repeat(-1, m.exp, a))(x)
    with pytest.raises(tg.TigaError, match="n must be a non-negative Python int"):
        tg.jit(lambda a, n: tg.repeat(n, m.exp, a))(x, 3)


def _python_while(cond, body, state, max_iterations):
    for _ in range(max_iterations):
        if not cond(state):
            break
        state = body(state)
    return state


@pytest.mark.parametrize("limit,max_iterations", [(100.0, 50), (100.0, 3), (0.5, 10),
                                                  (100.0, 0)])
def test_while_loop_matches_a_python_loop(limit, max_iterations):
    x = np.array([1.0, 2.0])

    def f(a):
        return tg.while_loop(lambda s: m.sum(s[0]) < limit, lambda s: (s[0] * 2.0, s[1] + 1),
                             (a, 0), max_iterations=max_iterations)

    want = _python_while(lambda s: s[0].sum() < limit, lambda s: (s[0] * 2.0, s[1] + 1),
                         (x, 0), max_iterations)
    for got in both_ways(f, x):
        np.testing.assert_allclose(np.asarray(got[0]), want[0])
        assert int(got[1]) == want[1]


def test_while_loop_max_iterations_stops_an_endless_loop():
    f = tg.jit(lambda a: tg.while_loop(lambda s: s > -1.0, lambda s: s + 1.0, a,
                                       max_iterations=7))
    assert float(f(np.array(0.0))) == 7.0


def test_loop_carried_type_changes_are_trace_time_shape_errors():
    x = np.ones(2)
    with pytest.raises(tg.ShapeError, match=r"carried value 0 changes type from f64\[2\] to "
                                            r"f32\[2\]"):
        tg.make_program(lambda a: tg.while_loop(lambda s: m.sum(s) < 9.0,
                                                lambda s: s.astype(tg.float32), a, 4))(x)
    with pytest.raises(tg.ShapeError, match=r"repeat: carried value 0 changes type from "
                                            r"f64\[2\] to f64\[1\]"):
        tg.make_program(lambda a: tg.repeat(2, lambda s: s[:1], a))(x)
    with pytest.raises(tg.ShapeError, match="same structure as init"):
        tg.make_program(lambda a: tg.repeat(2, lambda s: (s, s), a))(x)
    with pytest.raises(tg.DTypeError, match="cond must return a scalar bool"):
        tg.make_program(lambda a: tg.while_loop(lambda s: s > 0.0, lambda s: s, a, 4))(x)
    with pytest.raises(tg.TigaError, match="max_iterations must be a non-negative int"):
        tg.make_program(lambda a: tg.while_loop(lambda s: m.sum(s) > 0.0, lambda s: s, a,
                                                None))(x)


# ---- tracer misuse -----------------------------------------------------------------------------


def test_escaped_tracer_is_a_trace_error():
    leaked = []

    def leak(a):
        leaked.append(a)
        return a * 2.0

    tg.jit(leak)(np.ones(2))
    with pytest.raises(tg.TraceError, match="escaped the function that traced it"):
        tg.jit(lambda b: b + leaked[0])(np.ones(2))
    with pytest.raises(tg.TraceError):  # used eagerly, outside any trace
        leaked[0] + 1.0


def test_python_control_flow_on_a_tracer_is_a_trace_error():
    def branchy(a):
        if m.sum(a) > 0:
            return a
        return -a

    with pytest.raises(tg.TraceError, match="no concrete truth value.*where"):
        tg.jit(branchy)(np.ones(2))
    with pytest.raises(tg.TraceError, match="no concrete truth value"):
        tg.make_program(lambda a: a if a[0] else a)(np.ones(2))


def test_converting_a_tracer_to_numpy_is_a_trace_error():
    with pytest.raises(tg.TraceError, match="cannot convert the traced value"):
        tg.jit(lambda a: np.asarray(a) + 1)(np.ones(2))


def test_non_array_outputs_are_a_trace_error():
    with pytest.raises(tg.TraceError, match="returned str"):
        tg.make_program(lambda a: "not an array")(np.ones(2))


# ---- eager tg.Tensor ----------------------------------------------------------------------------


def test_eager_tensor_operations_return_tensors():
    x = rng(14).standard_normal((2, 3))
    t = tg.asarray(x)
    assert isinstance(t, tg.Tensor) and t.shape == (2, 3) and t.dtype == tg.float64
    for got, want in [(t + 1, x + 1), (1 - t, 1 - x), (t * t, x * x), (t[1, ::2], x[1, ::2]),
                      (t.sum(axis=0), x.sum(axis=0)), (m.exp(t), np.exp(x)),
                      (m.exp(x), np.exp(x)), (t.T @ t, x.T @ x), (np.ones(3) + t, 1 + x)]:
        assert isinstance(got, tg.Tensor)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    assert isinstance(tg.asarray([1, 2]) + 1, tg.Tensor)
    assert (tg.asarray([1, 2]) + 1).dtype == tg.int64
    assert float(tg.asarray(2.5) * 2) == 5.0


def test_tensor_is_a_jit_argument():
    x = rng(15).standard_normal(4)
    out = tg.jit(lambda a: a * 2.0)(tg.asarray(x))
    assert isinstance(out, tg.Tensor)
    np.testing.assert_allclose(np.asarray(out), x * 2.0)
