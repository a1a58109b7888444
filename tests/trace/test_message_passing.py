"""trace: tg.MessagePassing and tg.propagate features and errors, checked against plain-Python
loop oracles (per destination, per edge in the user's edge order) and finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.core.program import ClosedProgram, GraphProgram
from tiga.core.types import GraphType, TensorType
from tiga.testing import reference_grad

# user edge order (src, dst); destinations interleave, so the stored CSR order differs
COO_EDGES = [(2, 1), (0, 0), (1, 3), (2, 0), (0, 1), (1, 1), (2, 3), (0, 3)]
NUM_SRC, NUM_DST = 3, 4  # destination 2 has no edges


def coo_graph(**kw):
    return tg.Graph.from_coo(np.array([s for s, _ in COO_EDGES]),
                             np.array([d for _, d in COO_EDGES]),
                             num_src=NUM_SRC, num_dst=NUM_DST, **kw)


def csr_graph(**kw):
    return tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2, **kw)


def loop_reduce(edges, num_dst, message, combine, empty):
    """out[d] = fold(combine, messages of the edges into d in edge order); `empty` if none."""
    out = []
    for d in range(num_dst):
        acc = None
        for e, (s, dd) in enumerate(edges):
            if dd == d:
                m = message(e, s, d)
                acc = m if acc is None else combine(acc, m)
        out.append(empty(d) if acc is None else acc)
    return np.array(out)


def loop_sum(edges, num_dst, message, shape=()):
    return loop_reduce(edges, num_dst, message, lambda a, b: a + b,
                       lambda d: np.zeros(shape))


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def strict():
    """tg.config.strict on for one test, restored whatever happens."""
    old = tg.config.strict
    tg.config.strict = True
    try:
        yield
    finally:
        tg.config.strict = old


# ---- field errors ------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["src", "dst", "edge"])
def test_missing_field_raises_field_error_listing_available(role, rng):
    g = coo_graph()
    sizes = {"src": NUM_SRC, "dst": NUM_DST, "edge": len(COO_EDGES)}
    fields = {r: {} for r in sizes}
    fields[role] = {"alpha": rng.normal(size=sizes[role]), "beta": rng.normal(size=sizes[role])}

    def edge_fn(src, dst, edge):
        return {"src": src, "dst": dst, "edge": edge}[role].gamma

    with pytest.raises(tg.FieldError, match=rf"{role}\.gamma") as info:
        tg.propagate(g, edge_fn, tg.sum(), **fields)
    assert f"available {role} fields: alpha, beta" in str(info.value)
    # a role with no fields at all says so
    with pytest.raises(tg.FieldError, match=r"src\.x.*available src fields: none"):
        tg.propagate(g, lambda s, d, e: s.x, tg.sum(), dst={"h": np.zeros(NUM_DST)})


@pytest.mark.parametrize("role,shape,want", [
    ("src", (3,), 2), ("src", (), 2), ("src", (1, 4), 2), ("dst", (2,), 3), ("edge", (4, 2), 3)])
def test_field_with_wrong_leading_size_names_the_field(role, shape, want):
    g = csr_graph()
    fields = {"src": {"x": np.ones(2)}, "dst": {"h": np.ones(3)}, "edge": {"w": np.ones(3)}}
    name = {"src": "x", "dst": "h", "edge": "w"}[role]
    fields[role][name] = np.ones(shape)
    with pytest.raises(tg.ShapeError, match=rf"{role}\.{name}") as info:
        tg.propagate(g, lambda s, d, e: s.x * e.w + d.h, tg.sum(), **fields)
    assert f"leading axis of {want}" in str(info.value)
    assert str(tuple(shape)) in str(info.value)


# ---- parameters, update, multiple outputs ------------------------------------------------


class ScaledShifted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, scale):
        return src.x * edge.w * scale

    def update(self, dst, aggregated, shift, gain):
        return (aggregated + shift) * gain + dst.h


def _scaled_shifted_oracle(x, w, h, scale, shift, gain):
    agg = loop_sum(COO_EDGES, NUM_DST, lambda e, s, d: x[s] * w[e] * scale, shape=x.shape[1:])
    return (agg + shift) * gain + h


def test_keyword_params_reach_edge_and_update(rng):
    g = coo_graph()
    x, h = rng.normal(size=(NUM_SRC, 2)), rng.normal(size=(NUM_DST, 2))
    w = rng.normal(size=(len(COO_EDGES), 2))
    shift = rng.normal(size=2)  # an array parameter, shared by every row
    got = ScaledShifted()(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.75,
                          shift=shift, gain=np.float64(-1.5))
    want = _scaled_shifted_oracle(x, w, h, 0.75, shift, -1.5)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-14)
    # the empty destination gets update(identity): shift * gain + h
    np.testing.assert_allclose(np.asarray(got)[2], shift * -1.5 + h[2], rtol=1e-13)


def test_param_value_is_a_runtime_operand(rng):
    g = coo_graph()
    x, h = rng.normal(size=(NUM_SRC,)), rng.normal(size=(NUM_DST,))
    w = rng.normal(size=(len(COO_EDGES),))
    m = ScaledShifted()
    results, keys = [], []
    for scale, shift in [(0.5, 1.0), (2.0, -3.0)]:
        kw = dict(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=scale,
                  shift=shift, gain=1.0)
        results.append(np.asarray(m(**kw)))
        np.testing.assert_allclose(results[-1],
                                   _scaled_shifted_oracle(x, w, h, scale, shift, 1.0),
                                   rtol=1e-13, atol=1e-14)
        kw.pop("graph")
        program, _ = m._call(g, kw.pop("src"), kw.pop("dst"), kw.pop("edge"), kw) \
            .staged_program()
        keys.append(program.structure_key())
    assert not np.allclose(results[0], results[1])
    # the values are operands, not constants: both calls stage the same program
    assert keys[0] == keys[1]

    f = tg.jit(lambda x, scale: m(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w},
                                  scale=scale, shift=0.0, gain=1.0))
    a, b = np.asarray(f(x, 0.5)), np.asarray(f(x, 2.0))
    np.testing.assert_allclose(b, (a - h) * 4.0 + h, rtol=1e-12)
    assert f.cache_info()["misses"] == 1 and f.cache_info()["hits"] == 1


@pytest.mark.parametrize("scale", [np.float64(0.3), np.array(0.3)])
def test_numpy_float64_param_keeps_its_precision(scale):
    # np.float64 subclasses Python float, but it is a typed float64 value, not a weak scalar
    g = csr_graph()
    y = tg.propagate(g, lambda s, d, e, scale: s.x * scale, tg.sum(),
                     src={"x": np.array([1.0, 3.0])}, scale=scale)
    assert np.asarray(y).dtype == np.float64
    np.testing.assert_array_equal(np.asarray(y), [1.0 * 0.3 + 3.0 * 0.3, 3.0 * 0.3, 0.0])
    f = tg.jit(lambda s: s * 1.0)
    assert np.asarray(f(scale)).dtype == np.float64 and float(np.asarray(f(scale))) == 0.3


def test_python_float_param_keeps_float64_precision():
    g = csr_graph()
    y = tg.propagate(g, lambda s, d, e, scale: s.x * scale, tg.sum(),
                     src={"x": np.ones(2)}, scale=0.3)
    assert np.asarray(y)[0] == 2 * 0.3  # two unit messages, each 1.0 * 0.3 in float64


def test_update_gradient_matches_finite_differences(rng):
    g = coo_graph()

    class Gated(tg.MessagePassing):
        reducer = tg.mean()

        def edge(self, src, dst, edge):
            return tg.math.tanh(src.x * edge.w + dst.h)

        def update(self, dst, aggregated):
            return tg.math.sigmoid(aggregated) * dst.h

    def oracle(x, h, w):
        agg = loop_reduce(COO_EDGES, NUM_DST, lambda e, s, d: np.tanh(x[s] * w[e] + h[d]),
                          lambda a, b: a + b, lambda d: np.zeros(2))
        counts = np.array([max(sum(1 for _, d in COO_EDGES if d == i), 1)
                           for i in range(NUM_DST)])
        return 1 / (1 + np.exp(-agg / counts[:, None])) * h

    x, h = rng.normal(size=(NUM_SRC, 2)), rng.normal(size=(NUM_DST, 2))
    w = rng.normal(size=(len(COO_EDGES), 2))
    ct = rng.normal(size=(NUM_DST, 2))
    np.testing.assert_allclose(
        np.asarray(Gated()(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w})),
        oracle(x, h, w), rtol=1e-13)
    grads = tg.grad(lambda x, h, w: (Gated()(graph=g, src={"x": x}, dst={"h": h},
                                             edge={"w": w}) * ct).sum(),
                    argnums=(0, 1, 2))(x, h, w)
    args, eps = [x, h, w], 1e-6
    for k, got in enumerate(grads):
        want = np.zeros(args[k].shape)
        for i in np.ndindex(args[k].shape):
            hi, lo = [a.copy() for a in args], [a.copy() for a in args]
            hi[k][i] += eps
            lo[k][i] -= eps
            want[i] = (np.sum(oracle(*hi) * ct) - np.sum(oracle(*lo) * ct)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-8)


def test_multi_output_edge_function_with_sum(rng):
    g = coo_graph()
    x = rng.normal(size=(NUM_SRC, 3))
    w = rng.normal(size=(len(COO_EDGES),))

    class TwoOut(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w, edge.w * edge.w

    a, b = TwoOut()(graph=g, src={"x": x}, edge={"w": w})
    np.testing.assert_allclose(
        np.asarray(a), loop_sum(COO_EDGES, NUM_DST, lambda e, s, d: x[s] * w[e], (3,)),
        rtol=1e-13)
    np.testing.assert_allclose(
        np.asarray(b), loop_sum(COO_EDGES, NUM_DST, lambda e, s, d: w[e] ** 2), rtol=1e-13)

    # the update sees the aggregated outputs as a tuple
    y = tg.propagate(g, lambda s, d, e: (s.x * e.w, e.w * e.w), tg.sum(), src={"x": x},
                     edge={"w": w}, update=lambda dst, agg: agg[0] * agg[1][..., None])
    np.testing.assert_allclose(np.asarray(y), np.asarray(a) * np.asarray(b)[:, None],
                               rtol=1e-13)


# ---- reducer packaging and class errors --------------------------------------------------


def test_online_softmax_without_packaging_is_an_error():
    g = csr_graph()
    with pytest.raises(tg.TigaError, match=r"online_softmax.*self\.reducer in a MessagePassing.*"
                                           r"r = tg\.online_softmax\(\); tg\.propagate\(g, "
                                           r"lambda s, d, e: r\(score, value\), r, \.\.\.\)"):
        tg.propagate(g, lambda s, d, e: s.x, tg.online_softmax(), src={"x": np.ones(2)})
    # the functional form the hint names works, and agrees with the subclass form
    r = tg.online_softmax()
    x = np.array([0.5, -1.0])
    got = tg.propagate(g, lambda s, d, e: r(s.x, s.x), r, src={"x": x})

    class Softmax(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge):
            return self.reducer(src.x, src.x)

    np.testing.assert_allclose(np.asarray(got),
                               np.asarray(Softmax().reference(graph=g, src={"x": x})),
                               rtol=1e-12)

    class Attn(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge):
            return src.x, src.x  # a plain tuple is not a packaged message

    with pytest.raises(tg.TigaError, match="packaged"):
        Attn()(graph=g, src={"x": np.ones(2)})


@pytest.mark.parametrize("packed,reducer", [
    ("online_softmax", "sum"), ("max", "sum"), ("sum", "online_softmax"), ("min", "max")])
def test_reducer_mismatch_is_an_error(packed, reducer):
    g = csr_graph()
    pack = getattr(tg, packed)()

    def edge_fn(src, dst, edge):
        return pack(src.x, src.x) if packed == "online_softmax" else pack(src.x)

    with pytest.raises(tg.TigaError, match=rf"packaged a message for {packed} but the "
                                           rf"reducer is {reducer}"):
        tg.propagate(g, edge_fn, getattr(tg, reducer)(), src={"x": np.ones(2)})


def test_subclass_without_reducer_is_an_error():
    class NoReducer(tg.MessagePassing):
        def edge(self, src, dst, edge):
            return src.x

    with pytest.raises(tg.TigaError, match=r"NoReducer: set a class attribute reducer"):
        NoReducer()(graph=csr_graph(), src={"x": np.ones(2)})
    with pytest.raises(tg.TigaError, match="NoReducer"):
        NoReducer().explain(graph=csr_graph(), src={"x": np.ones(2)})


def test_not_a_reducer_is_an_error():
    with pytest.raises(tg.TigaError, match="reducer: expected a tg.Reducer"):
        tg.propagate(csr_graph(), lambda s, d, e: s.x, "sum", src={"x": np.ones(2)})


# ---- explain, reference, strict mode -----------------------------------------------------


def test_explain_without_arguments_is_an_error():
    with pytest.raises(tg.TigaError, match=r"WeightedSum\.explain\(\): pass the call's"):
        WeightedSum().explain()


def _weighted_sum_kwargs(dtype):
    return dict(graph=csr_graph(), src={"x": np.array([2.0, 3.0], dtype)},
                edge={"w": np.array([4.0, 5.0, 2.0], dtype)})


def _fallback_kwargs():
    """Arguments of a WeightedSum call whose propagate falls back to the reference
    interpreter (the first candidate that the compiled backends do not serve)."""
    for dtype in (np.float16, np.uint8, np.int8):
        kw = _weighted_sum_kwargs(dtype)
        if WeightedSum().explain(**kw).route == "reference":
            return kw
    raise AssertionError("every candidate compiles now: pick a program that falls back")


@pytest.mark.parametrize("dtype", [np.float64, "fallback"])
def test_explain_with_arguments_and_after_a_call(dtype):
    kw = _fallback_kwargs() if dtype == "fallback" else _weighted_sum_kwargs(dtype)
    m = WeightedSum()
    ex = m.explain(**kw)
    assert isinstance(ex, tg.Explanation)
    text = str(ex)
    assert ex.route in ("reference", "cpu-llvm", "mixed") and ex.route in text
    assert "propagate[sum]" in text and "vjp" in text
    if dtype == "fallback":
        assert "reference" in text and ex.reason
    y = m(**kw)
    np.testing.assert_array_equal(np.asarray(y), np.array([23.0, 6.0, 0.0], kw["src"]["x"].dtype))
    with pytest.raises(tg.TigaError, match="pass the call's arguments"):
        m.explain()                         # a layer keeps nothing of its calls
    after = m.explain(run=True, **kw)
    assert after.run_report is not None and "measured:" in str(after)
    assert isinstance(after, tg.Explanation)
    assert after.route == ex.route and after.traversal == ex.traversal
    assert "reference" in str(after) or ex.route != "reference"


def test_reference_equals_the_call_and_is_differentiable(rng):
    g = coo_graph()
    x, h = rng.normal(size=(NUM_SRC, 2)), rng.normal(size=(NUM_DST, 2))
    w = rng.normal(size=(len(COO_EDGES), 2))
    m = ScaledShifted()
    kw = dict(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.5,
              shift=np.ones(2), gain=2.0)
    ref = m.reference(**kw)
    assert isinstance(ref, tg.Tensor)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(m(**kw)))

    def loss(run, x, w):
        return (run(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.5,
                    shift=np.ones(2), gain=2.0) ** 2).sum()

    g_ref = reference_grad(lambda x, w: loss(m.reference, x, w), argnums=(0, 1))(x, w)
    g_call = tg.grad(lambda x, w: loss(m, x, w), argnums=(0, 1))(x, w)
    for a, b in zip(g_ref, g_call):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13)
    # and against the loop oracle: d/dw_e sum(y^2) = 2 y[d] * gain * x[s] * scale
    y = _scaled_shifted_oracle(x, w, h, 0.5, np.ones(2), 2.0)
    want_w = np.array([2 * y[d] * 2.0 * x[s] * 0.5 for s, d in COO_EDGES])
    np.testing.assert_allclose(np.asarray(g_ref[1]), want_w, rtol=1e-12)


def test_strict_mode_refuses_the_reference_fallback(strict):
    kw = _fallback_kwargs()
    with pytest.raises(tg.UnsupportedError, match="strict mode") as info:
        WeightedSum()(**kw)
    assert info.value.hint
    with pytest.raises(tg.UnsupportedError, match="strict mode"):
        tg.propagate(kw["graph"], lambda s, d, e: s.x * e.w, tg.sum(), src=kw["src"],
                     edge=kw["edge"])
    with pytest.raises(tg.UnsupportedError, match="strict mode"):
        tg.jit(lambda x: WeightedSum()(graph=kw["graph"], src={"x": x}, edge=kw["edge"]))(
            kw["src"]["x"])
    # asking for the oracle explicitly is not a fallback
    np.testing.assert_array_equal(np.asarray(WeightedSum().reference(**kw)), [23.0, 6.0, 0.0])


def test_strict_mode_raises_exactly_when_explain_reports_a_fallback(strict):
    for kw in (_weighted_sum_kwargs(np.float64), _weighted_sum_kwargs(np.float32),
               _fallback_kwargs()):
        ex = WeightedSum().explain(**kw)
        if ex.route == "cpu-llvm":
            np.testing.assert_array_equal(np.asarray(WeightedSum()(**kw)), [23.0, 6.0, 0.0])
        else:
            with pytest.raises(tg.UnsupportedError, match="strict mode"):
                WeightedSum()(**kw)


# ---- functional form, make_program, jit ---------------------------------------------------


def test_functional_propagate_matches_class_and_oracle(rng):
    g = coo_graph()
    x, h = rng.normal(size=(NUM_SRC, 2)), rng.normal(size=(NUM_DST, 2))
    w = rng.normal(size=(len(COO_EDGES), 2))
    y = tg.propagate(g, lambda src, dst, edge, scale: src.x * edge.w * scale, tg.sum(),
                     src={"x": x}, dst={"h": h}, edge={"w": w},
                     update=lambda dst, agg, shift, gain: (agg + shift) * gain + dst.h,
                     scale=0.5, shift=np.ones(2), gain=2.0)
    assert isinstance(y, tg.Tensor)
    want = _scaled_shifted_oracle(x, w, h, 0.5, np.ones(2), 2.0)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-13)
    cls = ScaledShifted()(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.5,
                          shift=np.ones(2), gain=2.0)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(cls))


def _walk_types(program: GraphProgram):
    for v in program.in_binders:
        yield v.type
    for eqn in program.eqns:
        for a in eqn.inputs:
            yield a.type
        for v in eqn.outputs:
            yield v.type
        for p in eqn.params.values():
            if isinstance(p, ClosedProgram):
                yield from _walk_types(p.program)


def test_make_program_has_concrete_types():
    g = coo_graph()

    def f(x, w):
        return ScaledShifted()(graph=g, src={"x": x}, dst={"h": np.ones(NUM_DST)},
                               edge={"w": w}, scale=0.5, shift=1.0, gain=2.0).sum()

    program = tg.make_program(f)(np.ones(NUM_SRC), np.ones(len(COO_EDGES)))
    tg.check_program(program)
    types = list(_walk_types(program))
    assert any(isinstance(t, GraphType) for t in types)
    for t in types:
        if isinstance(t, TensorType):
            assert all(isinstance(d, int) for d in t.shape), t
        else:
            assert isinstance(t, GraphType)
            assert (t.num_src, t.num_dst, t.num_edges) == (NUM_SRC, NUM_DST, len(COO_EDGES))
    assert "N" not in str(program).replace("None", "")


def test_calls_inside_jit(rng):
    x = rng.normal(size=2)
    w = rng.normal(size=3)
    # two relations of one type (same sizes) but different topology: one trace, two answers
    g1 = csr_graph()
    g2 = tg.Graph.from_csr(np.array([0, 1, 1, 3]), np.array([1, 0, 1]), num_src=2)
    f = tg.jit(lambda g, x, w: WeightedSum()(graph=g, src={"x": x}, edge={"w": w}) * 2.0)
    for g in (g1, g2, g1):
        row_ptr, col_idx = g.resolve_csr()
        edges = [(int(col_idx[p]), d) for d in range(3)
                 for p in range(int(row_ptr[d]), int(row_ptr[d + 1]))]
        want = 2.0 * loop_sum(edges, 3, lambda e, s, d: x[s] * w[e])
        got = f(g, x, w)
        assert isinstance(got, tg.Tensor)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13)
    assert f.cache_info() == {"hits": 2, "misses": 1, "entries": 1}
    # grad of a jitted call
    gw = tg.grad(lambda w: f(g1, x, w).sum())(w)
    np.testing.assert_allclose(np.asarray(gw), [2 * x[0], 2 * x[1], 2 * x[1]], rtol=1e-13)
    # jit over a COO relation closed over: edge order is still the user's
    g = coo_graph()
    xs, ws = rng.normal(size=NUM_SRC), rng.normal(size=len(COO_EDGES))
    fc = tg.jit(lambda x, w: WeightedSum()(graph=g, src={"x": x}, edge={"w": w}))
    np.testing.assert_allclose(np.asarray(fc(xs, ws)),
                               loop_sum(COO_EDGES, NUM_DST, lambda e, s, d: xs[s] * ws[e]),
                               rtol=1e-13)


# ---- relations: unvalidated input, COO edge order ----------------------------------------


BAD_GRAPHS = {
    "col_idx too large": (lambda: tg.Graph.from_csr(
        np.array([0, 2, 3, 3]), np.array([0, 5, 1]), num_src=2, validate="none"),
        r"col_idx: entry at position 1 is 5"),
    "col_idx negative": (lambda: tg.Graph.from_csr(
        np.array([0, 2, 3, 3]), np.array([0, 1, -1]), num_src=2, validate="none"),
        r"col_idx: entry at position 2 is -1"),
    "huge col_idx, basic": (lambda: tg.Graph.from_csr(
        np.array([0, 2, 3, 3]), np.array([0, 2 ** 40, 1]), num_src=2, validate="basic"),
        r"col_idx: entry at position 1"),
    "row_ptr decreasing": (lambda: tg.Graph.from_csr(
        np.array([0, 3, 2, 3]), np.array([0, 1, 1]), num_src=2, validate="none"),
        r"row_ptr: entry at position 2"),
    "row_ptr end past col_idx": (lambda: tg.Graph.from_csr(
        np.array([0, 2, 3, 7]), np.array([0, 1, 1]), num_src=2, validate="none"),
        r"row_ptr"),
    "coo src out of range": (lambda: tg.Graph.from_coo(
        np.array([0, 9, 1]), np.array([0, 1, 1]), num_src=2, num_dst=3, validate="none"),
        r"src: entry at position 1 is 9"),
    "coo dst out of range": (lambda: tg.Graph.from_coo(
        np.array([0, 1, 1]), np.array([0, 1, 3]), num_src=2, num_dst=3, validate="none"),
        r"dst: entry at position 2 is 3"),
}


def _use(how, g):
    """Every way a program can read a relation; each must validate it first."""
    x, w = np.array([2.0, 3.0]), np.array([4.0, 5.0, 2.0])
    if how == "call":
        return WeightedSum()(graph=g, src={"x": x}, edge={"w": w})
    if how == "reference":
        return WeightedSum().reference(graph=g, src={"x": x}, edge={"w": w})
    if how == "jit":
        return tg.jit(lambda x: WeightedSum()(graph=g, src={"x": x}, edge={"w": w}))(x)
    if how == "grad_max":
        return tg.grad(lambda w: tg.propagate(g, lambda s, d, e: s.x * e.w, tg.max(),
                                              src={"x": x}, edge={"w": w}).sum())(w)
    if how == "grad_mean":
        return tg.grad(lambda x: tg.propagate(g, lambda s, d, e: s.x * e.w, tg.mean(),
                                              src={"x": x}, edge={"w": w}).sum())(x)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["call", "reference", "jit", "grad_max", "grad_mean"])
@pytest.mark.parametrize("bad", sorted(BAD_GRAPHS))
def test_unvalidated_invalid_graph_raises_validation_error_when_used(bad, how):
    make, message = BAD_GRAPHS[bad]
    g = make()
    for _ in range(2):  # a failed check is not remembered as a pass
        with pytest.raises(tg.GraphValidationError, match=message):
            _use(how, g)


def test_unvalidated_valid_graph_gives_the_validated_answer():
    x, w = np.array([2.0, 3.0]), np.array([4.0, 5.0, 2.0])
    a = WeightedSum()(graph=csr_graph(validate="none"), src={"x": x}, edge={"w": w})
    b = WeightedSum()(graph=csr_graph(), src={"x": x}, edge={"w": w})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("reducer", ["sum", "max", "min", "prod", "mean"])
def test_coo_edge_fields_follow_user_edge_order(reducer, rng):
    g = coo_graph()
    assert np.any(np.asarray(g.edge_perm) != np.arange(len(COO_EDGES)))
    x = rng.normal(size=(NUM_SRC, 2))
    w = rng.normal(size=(len(COO_EDGES), 2))
    combine = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum,
               "prod": np.multiply}[reducer]
    want = loop_reduce(COO_EDGES, NUM_DST, lambda e, s, d: x[s] * w[e] + e, combine,
                       lambda d: np.full(2, 1.0 if reducer == "prod" else 0.0))
    if reducer == "mean":
        counts = np.bincount([d for _, d in COO_EDGES], minlength=NUM_DST)
        want = want / np.maximum(counts, 1)[:, None]
    eid = np.arange(len(COO_EDGES), dtype=np.float64)  # the user's edge id as a field

    class Ordered(tg.MessagePassing):
        def edge(self, src, dst, edge):
            return src.x * edge.w + edge.id

    Ordered.reducer = getattr(tg, reducer)()
    got = Ordered()(graph=g, src={"x": x}, edge={"w": w, "id": eid})
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13)
    if reducer == "sum":
        ct = rng.normal(size=(NUM_DST, 2))
        gw = tg.grad(lambda w: (Ordered()(graph=g, src={"x": x}, edge={"w": w, "id": eid})
                                * ct).sum())(w)
        np.testing.assert_allclose(np.asarray(gw),
                                   np.array([x[s] * ct[d] for s, d in COO_EDGES]), rtol=1e-13)


# ---- captured arrays ---------------------------------------------------------------------


def test_captured_weight_arrays_are_read_on_every_call(rng):
    g = coo_graph()
    x = rng.normal(size=(NUM_SRC, 3))
    W = rng.normal(size=(3, 2))

    def oracle(W):
        return loop_sum(COO_EDGES, NUM_DST, lambda e, s, d: x[s] @ W, (2,))

    def edge_fn(src, dst, edge):
        return src.x @ W  # W is a closure variable

    def call():
        return np.asarray(tg.propagate(g, edge_fn, tg.sum(), src={"x": x}))

    np.testing.assert_allclose(call(), oracle(W), rtol=1e-13)
    W[...] = rng.normal(size=(3, 2))  # mutated in place
    np.testing.assert_allclose(call(), oracle(W), rtol=1e-13)
    W = W + 1.0  # rebound (the closure cell now holds a new array)
    np.testing.assert_allclose(call(), oracle(W), rtol=1e-13)

    class Linear(tg.MessagePassing):
        reducer = tg.max()

        def __init__(self, weight):
            self.weight = weight

        def edge(self, src, dst, edge):
            return tg.math.tanh(src.x @ self.weight)

    def max_oracle(W):
        return loop_reduce(COO_EDGES, NUM_DST, lambda e, s, d: np.tanh(x[s] @ W), np.maximum,
                           lambda d: np.zeros(2))

    m = Linear(rng.normal(size=(3, 2)))
    first = np.asarray(m(graph=g, src={"x": x}))
    np.testing.assert_allclose(first, max_oracle(m.weight), rtol=1e-13)
    m.weight = rng.normal(size=(3, 2))
    second = np.asarray(m(graph=g, src={"x": x}))
    np.testing.assert_allclose(second, max_oracle(m.weight), rtol=1e-13)
    assert not np.allclose(first, second)
    # the captured weight is differentiable when it is traced
    ct = rng.normal(size=(NUM_DST, 2))

    def loss(weight):
        return (Linear(weight)(graph=g, src={"x": x}) * ct).sum()

    gW = np.asarray(tg.grad(loss)(m.weight))
    eps, want = 1e-6, np.zeros((3, 2))
    for i in np.ndindex(3, 2):
        hi, lo = m.weight.copy(), m.weight.copy()
        hi[i] += eps
        lo[i] -= eps
        want[i] = np.sum((max_oracle(hi) - max_oracle(lo)) * ct) / (2 * eps)
    np.testing.assert_allclose(gW, want, rtol=1e-6, atol=1e-8)
