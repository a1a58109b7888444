"""Guarded call caches: an un-jitted call behaves like Python (a changed global, class
attribute, nested attribute, dict entry or closure cell retraces), reducers are keyed by
value, and tg.grad / tg.value_and_grad / tg.vjp reuse their trace per signature."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
import tiga.api as api
from tiga.trace import call_cache
from tiga.trace.message_passing import PropagateCall

INDPTR = np.array([0, 2, 3, 5])
INDICES = np.array([0, 2, 1, 0, 1])
X = np.array([[1.0, -2.0], [10.0, 0.5], [3.0, 4.0]])

SCALE = 2.0
CONST = {"k": 1.0}
FACTOR = 3.0


def graph():
    return tg.Graph.from_csr(INDPTR, INDICES, num_src=3)


def oracle(message_of_src_rows):
    """y[i] = sum over edges j -> i of message(x[j]), straight from the CSR in numpy."""
    out = np.zeros((len(INDPTR) - 1, X.shape[1]))
    for i in range(len(INDPTR) - 1):
        for j in INDICES[INDPTR[i]:INDPTR[i + 1]]:
            out[i] += message_of_src_rows(X[j])
    return out


@pytest.fixture
def traces(monkeypatch):
    """Counts traces of un-jitted calls (PropagateCall.staged_program) and of
    transformations (api.trace_flat)."""
    count = {"call": 0, "transform": 0}
    staged, flat = PropagateCall.staged_program, api.trace_flat

    def spy_staged(self, *a, **k):
        count["call"] += 1
        return staged(self, *a, **k)

    def spy_flat(*a, **k):
        count["transform"] += 1
        return flat(*a, **k)

    monkeypatch.setattr(PropagateCall, "staged_program", spy_staged)
    monkeypatch.setattr(api, "trace_flat", spy_flat)
    call_cache.clear()
    return count


def edge_global(s, d, e):
    return s.x * SCALE * CONST["k"]


def helper(v):
    return v * FACTOR


def edge_helper(s, d, e):
    return helper(s.x)


def test_changed_module_global_and_dict_entry_retrace(traces):
    global SCALE
    g = graph()
    old = SCALE
    try:
        for scale, k in [(2.0, 1.0), (2.0, 1.0), (-0.5, 1.0), (-0.5, 4.0)]:
            SCALE, CONST["k"] = scale, k
            y = tg.propagate(g, edge_global, tg.sum(), src={"x": X})
            np.testing.assert_allclose(np.asarray(y), oracle(lambda r, s=scale, k=k: r * s * k))
    finally:
        SCALE, CONST["k"] = old, 1.0
    assert traces["call"] == 3      # the repeated values hit


def test_helper_function_reading_a_global_is_guarded():
    global FACTOR
    g = graph()
    try:
        for factor in (3.0, 7.0):
            FACTOR = factor
            y = tg.propagate(g, edge_helper, tg.sum(), src={"x": X})
            np.testing.assert_allclose(np.asarray(y), oracle(lambda r, f=factor: r * f))
    finally:
        FACTOR = 3.0


class Cfg:
    def __init__(self, scale):
        self.scale = scale


class Tempered(tg.MessagePassing):
    reducer = tg.sum()
    temperature = 1.0

    def __init__(self, cfg):
        self.cfg = cfg

    def edge(self, src, dst, edge):
        return src.x * self.temperature * self.cfg.scale


def test_class_attribute_and_nested_attribute_retrace(traces):
    g, m = graph(), Tempered(Cfg(2.0))
    try:
        steps = [lambda: None, lambda: setattr(Tempered, "temperature", 5.0),
                 lambda: setattr(m.cfg, "scale", -1.5), lambda: setattr(m, "cfg", Cfg(0.25)),
                 lambda: None]
        for step in steps:
            step()
            want = oracle(lambda r: r * Tempered.temperature * m.cfg.scale)
            np.testing.assert_allclose(np.asarray(m(graph=g, src={"x": X})), want)
            np.testing.assert_allclose(np.asarray(m.reference(graph=g, src={"x": X})), want)
    finally:
        Tempered.temperature = 1.0
    assert traces["call"] == 4 + 5   # 4 distinct signatures (+ 5 reference() stagings)


def test_closure_cell_rebound_retraces():
    g = graph()
    k = 2.0

    def edge(s, d, e):
        return s.x * k

    np.testing.assert_allclose(np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": X})),
                               oracle(lambda r: r * 2.0))
    k = -3.0
    np.testing.assert_allclose(np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": X})),
                               oracle(lambda r: r * -3.0))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, -7.0]), min_size=1, max_size=6))
def test_any_sequence_of_global_values_matches_python(values):
    global SCALE
    g = graph()
    try:
        for v in values:
            SCALE = v
            y = np.asarray(tg.propagate(g, edge_global, tg.sum(), src={"x": X}))
            np.testing.assert_array_equal(np.signbit(y), np.signbit(oracle(lambda r, v=v: r * v)))
            np.testing.assert_allclose(y, oracle(lambda r, v=v: r * v))
    finally:
        SCALE = 2.0


def test_fresh_builtin_reducer_per_call_does_not_retrace(traces):
    g = graph()
    for _ in range(4):
        y = tg.propagate(g, edge_global, tg.sum(), src={"x": X})
    assert traces["call"] == 1
    np.testing.assert_allclose(np.asarray(y), oracle(lambda r: r * SCALE))
    tg.propagate(g, edge_global, tg.max(), src={"x": X})     # another reducer: a new trace
    assert traces["call"] == 2


def _combine(a, b):
    return a + b


def test_user_reducer_with_the_same_functions_hits(traces):
    g = graph()
    for _ in range(3):
        r = tg.Reducer("mysum", 0.0, combine=_combine)
        y = tg.propagate(g, edge_global, r, src={"x": X})
    assert traces["call"] == 1
    assert tg.Reducer("mysum", 0.0, combine=_combine) == r
    assert tg.Reducer("mysum", 0.0, combine=lambda a, b: a + b) != r
    np.testing.assert_allclose(np.asarray(y), oracle(lambda r: r * SCALE))


class Plain(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * SCALE


LAYER = Plain()


def loss(x):
    return tg.math.sum(LAYER(graph=GRAPH, src={"x": x}) ** 2)


GRAPH = graph()


def loss_grad_oracle(scale):
    """d/dx sum((A (s x))^2) = s A^T (2 A s x) for the CSR's 0/1 matrix A."""
    a = np.zeros((3, 3))
    for i in range(3):
        for j in INDICES[INDPTR[i]:INDPTR[i + 1]]:
            a[i, j] += 1.0
    y = a @ (scale * X)
    return float(np.sum(y ** 2)), scale * a.T @ (2 * y)


def test_grad_and_value_and_grad_reuse_their_trace(traces):
    global SCALE
    for _ in range(3):
        gx = tg.grad(loss)(X)             # a new grad object per call
    assert traces["transform"] == 1
    np.testing.assert_allclose(np.asarray(gx), loss_grad_oracle(SCALE)[1])
    for _ in range(2):
        value, gx = tg.value_and_grad(loss)(X)
    assert traces["transform"] == 1
    np.testing.assert_allclose(float(value), loss_grad_oracle(SCALE)[0])
    try:
        SCALE = -0.5                       # read by the layer the loss calls: retrace
        value, gx = tg.value_and_grad(loss)(X)
        assert traces["transform"] == 2
        want_value, want_grad = loss_grad_oracle(-0.5)
        np.testing.assert_allclose(float(value), want_value)
        np.testing.assert_allclose(np.asarray(gx), want_grad)
    finally:
        SCALE = 2.0
    tg.grad(loss)(X.astype(np.float32))
    assert traces["transform"] == 3        # another input type: another trace


def layer_out(x):
    return LAYER(graph=GRAPH, src={"x": x})


def test_vjp_reuses_its_trace(traces):
    ct = np.arange(6.0).reshape(3, 2)
    for _ in range(3):
        out, vjp_fn = tg.vjp(layer_out, X)
        (gx,) = vjp_fn(ct)
    assert traces["transform"] == 1
    a = np.zeros((3, 3))
    for i in range(3):
        for j in INDICES[INDPTR[i]:INDPTR[i + 1]]:
            a[i, j] += 1.0
    np.testing.assert_allclose(np.asarray(out), a @ (SCALE * X))
    np.testing.assert_allclose(np.asarray(gx), SCALE * a.T @ ct)


def test_grad_of_a_closure_over_a_fresh_array_is_not_reused(traces):
    """An array made while tracing (here by numpy from a global) is no guarded object:
    every call traces again, so a changed input of that array is seen."""
    base = np.array([1.0, 2.0])

    def f(x):
        w = base * 2.0                    # a new array, a literal of the trace
        return tg.math.sum(x * w)

    np.testing.assert_allclose(np.asarray(tg.grad(f)(np.ones(2))), [2.0, 4.0])
    base[0] = 5.0
    np.testing.assert_allclose(np.asarray(tg.grad(f)(np.ones(2))), [10.0, 4.0])


def test_jit_keeps_trace_time_semantics():
    """Documented: tg.jit, like jax.jit, bakes globals in at trace time."""
    global SCALE

    @tg.jit
    def f(x):
        return x * SCALE

    np.testing.assert_allclose(np.asarray(f(X)), X * 2.0)
    try:
        SCALE = 3.0
        np.testing.assert_allclose(np.asarray(f(X)), X * 2.0)
    finally:
        SCALE = 2.0


def test_grad_of_a_tuple_output_is_an_error():
    with pytest.raises(tg.TigaError, match=r"grad requires a scalar output.*tuple of 2.*"
                                           r"has_aux=True.*tg\.vjp"):
        tg.grad(lambda x: (tg.math.sum(x), tg.math.sum(x)))(X)
    with pytest.raises(tg.TigaError, match=r"grad requires a scalar output.*first element"):
        tg.grad(lambda x: ((tg.math.sum(x), x), x), has_aux=True)(X)
    with pytest.raises(tg.TigaError, match=r"grad requires a scalar output.*f64\[3,2\]"):
        tg.value_and_grad(lambda x: x * 2.0)(X)
    (value, aux), gx = tg.value_and_grad(lambda x: (tg.math.sum(x), x * 2.0),
                                         has_aux=True)(X)
    np.testing.assert_allclose(float(value), X.sum())
    np.testing.assert_allclose(np.asarray(aux), X * 2.0)
    np.testing.assert_allclose(np.asarray(gx), np.ones_like(X))


@pytest.mark.parametrize("argnums, rule", [
    ("0", r"argnums: must be an int or a tuple of ints.*'0' \(str\)"),
    (0.0, r"argnums: must be an int or a tuple of ints.*0\.0 \(float\)"),
    (True, r"argnums: must be an int.*True \(bool\)"),
    ((0, 0), r"argnums: positions must be distinct, found \(0, 0\)"),
    (-1, r"argnums: positions must be non-negative, found -1"),
    ((), r"argnums: must name at least one positional argument"),
])
def test_bad_argnums_name_the_rule_and_value(argnums, rule):
    with pytest.raises(tg.TigaError, match=rule):
        tg.grad(loss, argnums=argnums)


def test_out_of_range_argnums_names_the_count():
    with pytest.raises(tg.TigaError, match=r"argnums: 3 is out of range.*1 positional "
                                           r"argument.*< 1"):
        tg.grad(loss, argnums=3)(X)


W_GLOBAL = np.array([[1.0, 2.0], [3.0, 4.0]])


class Projected(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self):
        self.w = np.eye(2)

    def edge(self, src, dst, edge):
        return src.x @ self.w


PROJECTED = Projected()


def projected_loss(x):
    return tg.math.sum(PROJECTED(graph=GRAPH, src={"x": x @ W_GLOBAL}) ** 2)


def test_cached_grad_sees_in_place_changes_of_arrays_it_reads(traces):
    """Arrays the trace reads from a global or an attribute stay the same objects (guarded
    by identity) and are read when the program runs: in-place updates are seen."""
    a = np.zeros((3, 3))
    for i in range(3):
        for j in INDICES[INDPTR[i]:INDPTR[i + 1]]:
            a[i, j] += 1.0
    try:
        for step in range(3):
            value, gx = tg.value_and_grad(projected_loss)(X)
            m = W_GLOBAL @ PROJECTED.w
            y = a @ X @ m
            np.testing.assert_allclose(float(value), np.sum(y ** 2))
            np.testing.assert_allclose(np.asarray(gx), a.T @ (2 * y) @ m.T)
            W_GLOBAL[0, 0] += 1.0
            PROJECTED.w[1, 1] = -2.0 - step
    finally:
        W_GLOBAL[0, 0] = 1.0
        PROJECTED.w = np.eye(2)
    assert traces["transform"] == 1
