"""Compiled routes against the reference interpreter over non-finite values.

NaN, +inf and -inf placed in every field kind (src, dst, edge, param), under every built-in
reducer and every relation kind, forward and gradients; the streaming attention kernels
(LLVM float32 and numpy tiles) over triangular, cu_seqlens and dense relations; softmax
rows with +-inf scores against torch; a long edge function over wide rows (stack budget).
The oracle is `eval_program` on the traced, unoptimised program (the numpy reference
interpreter); results must agree NaN for NaN and inf for inf. The Triton route runs in
Triton's interpreter on CPU (the kernels the GPU runs): every reducer over every relation
kind, split (hub) rows, softmax rows with non-finite scores.
"""
from __future__ import annotations

import os

# Triton decides at its import whether its kernels are interpreted (tests/triton/conftest.py)
os.environ.setdefault("TRITON_INTERPRET", "1")
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.autodiff.vjp import vjp_program
from tiga.core.eval import eval_program
from tiga.xla_free_runtime.backends.cpu import attention as attention_route
from tiga.xla_free_runtime.reports.runs import COUNTERS

REDUCERS = {"sum": tg.sum, "mean": tg.mean, "max": tg.max, "min": tg.min, "prod": tg.prod,
            "online_softmax": tg.online_softmax}
BAD = (np.nan, np.inf, -np.inf)
FEW = settings(max_examples=12, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _quiet():
    # the reference interpreter computes inf - inf and 0 * inf like numpy: it warns
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def reference(fn, *args) -> list:
    """What the reference interpreter gives for fn(*args)."""
    return eval_program(tg.make_program(fn)(*args), *args)


def reference_vjp(fn, args: list, ct) -> list:
    """The reference interpreter's (output, cotangent of every argument) of fn at args."""
    program = tg.make_program(fn)(*args)
    return eval_program(vjp_program(program, [True] * len(args)), *args, ct)


def compiled_vjp(fn, args: list, ct) -> list:
    out, back = tg.vjp(fn, *args)
    return as_list(out) + as_list(back(ct))


def assert_same(got, want, rtol=1e-6, atol=1e-9, what="") -> None:
    """Equal NaN and +-inf placement, finite entries close."""
    got, want = np.asarray(got), np.asarray(want)
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        np.testing.assert_array_equal(test(got), test(want), err_msg=f"{what}: {name} places")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def as_list(x) -> list:
    return [np.asarray(v) for v in (x if isinstance(x, (tuple, list)) else [x])]


# ---- every reducer x every field kind, on one CSR relation --------------------------------


def model(reducer: str) -> tg.MessagePassing:
    class Model(tg.MessagePassing):
        def edge(self, src, dst, edge, p):
            msg = src.x * edge.w + dst.h * p
            if self.reducer.name == "online_softmax":
                return self.reducer(msg, src.v)
            return msg + src.v

    m = Model()
    m.reducer = REDUCERS[reducer]()
    return m


def relation(kind: str):
    pos = np.array([[0.0, 0.0], [0.3, 0.1], [0.9, 0.9], [0.35, 0.2], [0.1, 0.05]])
    if kind == "csr":     # an empty row, a duplicate edge, a self edge
        return tg.Graph.from_csr(np.array([0, 3, 3, 5, 9]),
                                 np.array([0, 1, 2, 1, 1, 0, 2, 3, 1]), num_src=4)
    if kind == "dense":
        return tg.Graph.dense(4, 3)
    if kind == "triangular":
        return tg.Graph.triangular(5)
    if kind == "cu_seqlens":
        return tg.Graph.cu_seqlens(np.array([0, 1, 4, 5]), causal=False)
    if kind == "stencil":
        return tg.Graph.stencil((2, 3), [[0, 1], [1, 0], [0, 0], [-1, 1]])
    if kind == "radius":
        return tg.Graph.radius(pos, 0.5)
    if kind == "knn":
        return tg.Graph.knn(pos, 2)
    assert kind == "cat"
    return tg.Graph.cat([tg.Graph.triangular(2),
                         tg.Graph.from_csr(np.array([0, 0, 2]), np.array([1, 0]), num_src=2)])


def operands(graph, rng) -> dict:
    f = 3
    edges = graph.num_edges if graph.num_edges is not None else len(graph.resolve_csr()[1])
    return {"x": rng.standard_normal((graph.num_src, f)),
            "v": rng.standard_normal((graph.num_src, f)),
            "h": rng.standard_normal((graph.num_dst, f)),
            "w": rng.standard_normal((edges, f)), "p": np.float64(0.7)}


def place(data: dict, draw) -> None:
    """Put one to three non-finite values into the operands (any field kind, any entry)."""
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["x", "v", "h", "w", "p"]))
        value = draw(st.sampled_from(BAD))
        if name == "p":
            data["p"] = np.float64(value)
        elif len(data[name]):
            row = draw(st.integers(0, len(data[name]) - 1))
            data[name][row, draw(st.integers(0, 2))] = value


def check_model(m, graph, data, ct, grads: bool) -> None:
    def f(x, v, h, w, p):
        return m(graph=graph, src={"x": x, "v": v}, dst={"h": h}, edge={"w": w}, p=p)

    args = [data[k] for k in "xvhwp"]
    assert_same(f(*args), reference(f, *args)[0], what="forward")
    if grads:
        got, want = compiled_vjp(f, args, ct), reference_vjp(f, args, ct)
        for name, a, b in zip(["output"] + list("xvhwp"), got, want):
            assert_same(a, b, rtol=1e-6, atol=1e-8, what=f"cotangent of {name}")


def assert_compiled(m, graph, data) -> None:
    ex = m.explain(graph=graph, src={"x": data["x"], "v": data["v"]}, dst={"h": data["h"]},
                   edge={"w": data["w"]}, p=data["p"])
    assert ex.route in ("cpu-llvm", "mixed"), str(ex)
    assert not any(r == "reference" for r, _, _ in ex.routes), str(ex)


@pytest.mark.parametrize("reducer", list(REDUCERS))
@given(data=st.data())
@FEW
def test_every_reducer_and_field_kind(reducer, data):
    graph = relation("csr")
    m = model(reducer)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    ops = operands(graph, rng)
    place(ops, data.draw)
    assert_compiled(m, graph, ops)
    check_model(m, graph, ops, rng.standard_normal((graph.num_dst, 3)), grads=True)


@pytest.mark.parametrize("kind", ["csr", "dense", "triangular", "cu_seqlens", "stencil",
                                  "radius", "knn", "cat"])
@pytest.mark.parametrize("reducer", ["sum", "max", "online_softmax"])
@given(data=st.data())
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
def test_every_relation_kind(kind, reducer, data):
    graph = relation(kind)
    m = model(reducer)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    ops = operands(graph, rng)
    place(ops, data.draw)
    check_model(m, graph, ops, rng.standard_normal((graph.num_dst, 3)),
                grads=reducer != "max" or kind == "csr")


def test_radius_with_non_finite_positions():
    """Topology from NaN/inf coordinates: a point with one is nobody's neighbour (every
    comparison with NaN is false; inf is farther than any cutoff), the same on both routes."""
    pos = np.array([[0.0, 0.0], [0.3, 0.1], [np.nan, 0.2], [0.2, np.inf], [0.1, 0.0]])
    try:
        graph = tg.Graph.radius(pos, 0.5)
    except tg.TigaError as exc:          # rejecting the positions is also an answer
        assert "position" in str(exc).lower(), str(exc)
        return
    rp, ci = graph.resolve_csr()
    for i in (2, 3):
        assert rp[i + 1] == rp[i], "a non-finite point has neighbours"
        assert i not in set(ci.tolist()), "a non-finite point is a neighbour"
    m = model("sum")
    ops = operands(graph, np.random.default_rng(0))
    check_model(m, graph, ops, np.ones((graph.num_dst, 3)), grads=True)


# ---- softmax rows with +-inf scores: both routes, and torch ---------------------------------


class Scores(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer(edge.s, src.v)


@pytest.mark.parametrize("scores", [[np.inf, 1.0], [-np.inf, 1.0], [-np.inf, -np.inf],
                                    [np.nan, 1.0], [np.inf, np.inf], [np.inf, -np.inf],
                                    [-np.inf], [np.inf], [3.0, -np.inf, 2.0]])
def test_softmax_of_non_finite_scores(scores):
    n = len(scores)
    graph = tg.Graph.from_csr(np.array([0, n, n]), np.arange(n), num_src=n)
    s = np.array(scores, np.float64)
    v = np.arange(1.0, n + 1.0)

    def f(s, v):
        return Scores()(graph=graph, src={"v": v}, dst={}, edge={"s": s})

    got, want = np.asarray(f(s, v)), reference(f, s, v)[0]
    assert_same(got, want, what="compiled vs reference")
    with np.errstate(all="ignore"):      # the softmax by hand, as torch.softmax computes it
        top = np.max(s)
        p = np.exp(s - top)
        expected = np.sum(p / np.sum(p) * v)
    assert_same(got[0], expected, what="row vs softmax")
    assert got[1] == 0.0                   # the empty row: the reducer convention
    torch = pytest.importorskip("torch")
    ts = torch.softmax(torch.tensor(s), 0)
    assert_same(got[0], float((ts * torch.tensor(v)).sum()), what="row vs torch.softmax")


# ---- attention: LLVM float32 kernels and numpy tiles ------------------------------------------


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


def attention_relation(kind: str, n: int):
    if kind == "triangular":
        return tg.Graph.triangular(n)
    if kind == "dense":
        return tg.Graph.dense(n)
    cu = np.array([0, n // 3, n // 3, n - 20, n])
    return tg.Graph.cu_seqlens(cu, causal=kind == "cu_causal")


@pytest.fixture
def native_switch():
    saved = (attention_route.NATIVE_FORWARD, attention_route.NATIVE_BACKWARD)
    yield
    attention_route.NATIVE_FORWARD, attention_route.NATIVE_BACKWARD = saved


@pytest.mark.parametrize("kind", ["triangular", "cu_causal", "cu_full", "dense"])
@pytest.mark.parametrize("route", ["float32-native", "float32-tiles", "float64-tiles"])
@given(data=st.data())
@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_attention_non_finite(kind, route, data, native_switch):
    dtype = np.float32 if route.startswith("float32") else np.float64
    attention_route.NATIVE_FORWARD = attention_route.NATIVE_BACKWARD = route.endswith("native")
    n = 70
    graph = attention_relation(kind, n)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    q, k, v = (rng.standard_normal((n, 2, 16)).astype(dtype) for _ in range(3))
    ops = {"q": q, "k": k, "v": v}
    for _ in range(data.draw(st.integers(1, 2))):
        name = data.draw(st.sampled_from("qkv"))
        row, head = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, 1))
        ops[name][row, head, data.draw(st.integers(0, 15))] = data.draw(st.sampled_from(BAD))
    ct = rng.standard_normal((n, 2, 16)).astype(dtype)
    m = Attention()

    def f(q, k, v):
        return m(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)

    ex = m.explain(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)
    assert any(w == "tiled streaming attention" for _, _, w in ex.routes), str(ex)
    tol = (2e-3, 2e-4) if dtype == np.float32 else (1e-9, 1e-11)
    got, want = compiled_vjp(f, [q, k, v], ct), reference_vjp(f, [q, k, v], ct)
    for name, a, b in zip(["output", "dq", "dk", "dv"], got, want):
        assert_same(a, b, *tol, what=f"{kind} {route}: {name}")


def test_attention_nan_stays_in_its_sequence():
    """One NaN key row: the rows of other sequences (and rows before it) stay finite."""
    n = 96
    graph = tg.Graph.cu_seqlens(np.array([0, 32, 64, 96]), causal=True)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, 1, 16)).astype(np.float32) for _ in range(3))
    k[40, 0, :] = np.nan
    out = np.asarray(Attention()(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                                 scale=0.25))
    bad_rows = np.nonzero(np.isnan(out).any(axis=(1, 2)))[0]
    np.testing.assert_array_equal(bad_rows, np.arange(40, 64))


# ---- row buffers over the stack budget --------------------------------------------------------

DEEP = textwrap.dedent("""
    import numpy as np, tiga as tg
    W, STEPS = {width}, {steps}
    class Deep(tg.MessagePassing):
        reducer = tg.sum()
        def edge(self, src, dst, edge):
            y = src.x
            for i in range(STEPS):
                y = tg.math.tanh(y * 0.5 + dst.h) if i % 2 else y * edge.w + 1.0
            return y
    g = tg.Graph.from_csr(np.array([0, 2, 3, 5]), np.array([0, 1, 1, 0, 2]), num_src=3)
    rng = np.random.default_rng(0)
    kw = dict(graph=g, src={{"x": rng.standard_normal((3, W))}},
              dst={{"h": 0.1 * rng.standard_normal((3, W))}},
              edge={{"w": 0.5 * rng.standard_normal((5, 1))}})
    m = Deep()
    print(m.explain(**kw))
    out, ref = np.asarray(m(**kw)), np.asarray(m.reference(**kw))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    print("SAME")
""")


@pytest.mark.parametrize("width,steps", [(16384, 80), (65536, 8)])
def test_wide_rows_past_the_stack_budget(width, steps):
    """Row buffers past the kernel's stack budget live in a heap block: no stack overflow
    (run in a subprocess, so a crash fails the test), the reference's answer, and explain()
    names the heap block."""
    env = dict(os.environ, TIGA_STRICT="1")
    done = subprocess.run([sys.executable, "-c", DEEP.format(width=width, steps=steps)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "SAME" in done.stdout
    assert "route:      cpu-llvm" in done.stdout, done.stdout
    assert "heap block" in done.stdout, done.stdout


# ---- the Triton route (Triton's interpreter: the GPU kernels' source) ------------------------


@pytest.fixture
def triton_route():
    """Every propagate on triton-interpreter, strictly: a silent reference run would agree
    with the oracle by construction."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    old = tg.config._backend, tg.config.strict
    tg.config.backend, tg.config.strict = "triton-interpreter", True
    try:
        yield
    finally:
        tg.config.backend, tg.config.strict = old


def row_edges(graph, r: int) -> np.ndarray:
    """The edge ids (positions in the edge field) of destination row r."""
    rp, _ = graph.resolve_csr()
    pos = np.arange(rp[r], rp[r + 1])
    return pos if graph.edge_perm is None else np.asarray(graph.edge_perm)[pos]


def hostile_operands(graph, rng) -> dict:
    """The issue's rows: one whose every message is NaN, one mixing NaN, finite and +inf
    (`[nan, 1, inf]` for max/min), one with a -inf, and a +inf source entry."""
    ops = operands(graph, rng)
    rp, _ = graph.resolve_csr()
    rows = [r for r in range(graph.num_dst) if rp[r + 1] > rp[r]]
    ops["w"][row_edges(graph, rows[0])] = np.nan
    mixed = max(rows[1:], key=lambda r: rp[r + 1] - rp[r], default=None)
    if mixed is not None:
        e = row_edges(graph, mixed)
        ops["w"][e[0], 0], ops["w"][e[-1], 1] = np.nan, np.inf
        ops["w"][e[len(e) // 2], 2] = -np.inf
    ops["x"][-1, 1] = np.inf
    return ops


@pytest.mark.parametrize("kind", ["csr", "dense", "triangular", "cu_seqlens", "stencil",
                                  "radius", "knn", "cat"])
@pytest.mark.parametrize("reducer", list(REDUCERS))
def test_triton_every_relation_kind(triton_route, kind, reducer):
    """Forward on every kind; on the CSR also every cotangent (the VJP's propagates and
    edge maps run on the Triton route too)."""
    graph = relation(kind)
    ct = np.random.default_rng(6).standard_normal((graph.num_dst, 3))
    check_model(model(reducer), graph, hostile_operands(graph, np.random.default_rng(5)),
                ct, grads=kind == "csr")


@pytest.mark.parametrize("reducer", list(REDUCERS))
@given(data=st.data())
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_triton_every_field_kind(triton_route, reducer, data):
    """Random placements in every field kind, forward and (sum, online_softmax: their VJPs
    are Triton propagates too; kept to two, the interpreter is slow) gradients."""
    graph = relation("csr")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    ops = operands(graph, rng)
    place(ops, data.draw)
    check_model(model(reducer), graph, ops, rng.standard_normal((graph.num_dst, 3)),
                grads=reducer in ("sum", "online_softmax"))


def hub_graph():
    """Rows past the kernel's split degree (128 edges: 8 tiles of 16), folded in chunks by
    programs of their own and merged: 150 edges, 140 edges, 131 edges, then short rows."""
    rng = np.random.default_rng(7)
    degrees = [150, 140, 131, 2, 0, 3]
    cols = [rng.integers(0, 6, d) for d in degrees]
    row_ptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    return tg.Graph.from_csr(row_ptr, np.concatenate(cols).astype(np.int64), num_src=6)


@pytest.mark.parametrize("reducer", list(REDUCERS))
def test_triton_split_rows(triton_route, reducer):
    """NaN and +-inf in later chunks of a hub row, a hub row of only NaN: the chunk merge
    keeps them as the reference does."""
    graph = hub_graph()
    ops = operands(graph, np.random.default_rng(8))
    ops["w"][140, 0] = np.nan                       # chunk 2 of row 0
    ops["w"][150:290] = np.nan                      # all of row 1
    ops["w"][290 + 20, 1], ops["w"][290 + 130, 2] = np.inf, -np.inf   # row 2, chunks 1 and 2
    before = COUNTERS["split_launches"]
    check_model(model(reducer), graph, ops, None, grads=False)
    assert COUNTERS["split_launches"] > before, "no row ran the split path"


@pytest.mark.parametrize("scores", [[np.inf, 1.0], [-np.inf, 1.0], [-np.inf, -np.inf],
                                    [np.nan, 1.0], [np.inf, np.inf], [np.inf, -np.inf],
                                    [-np.inf], [np.inf], [3.0, -np.inf, 2.0]])
def test_triton_softmax_of_non_finite_scores(triton_route, scores):
    n = len(scores)
    graph = tg.Graph.from_csr(np.array([0, n, n]), np.arange(n), num_src=n)
    s, v = np.array(scores, np.float64), np.arange(1.0, n + 1.0)

    def f(s, v):
        return Scores()(graph=graph, src={"v": v}, dst={}, edge={"s": s})

    assert_same(f(s, v), reference(f, s, v)[0], what="triton vs reference")


class RowMax(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        both = tg.math.maximum(src.x, dst.h) - tg.math.minimum(src.x, 0.0)
        return both.max(axis=-1) + tg.math.minimum(src.x, dst.h).min(axis=-1)


def test_triton_edge_function_max_min_keep_nan(triton_route):
    """Elementwise maximum/minimum and row-axis max/min inside an edge function: NaN wins,
    as numpy's (the reference's), on the Triton route too."""
    graph = relation("csr")
    rng = np.random.default_rng(9)
    x, h = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    x[0, 0], h[2, 1], x[3, 2] = np.nan, np.nan, np.inf

    def f(x, h):
        return RowMax()(graph=graph, src={"x": x}, dst={"h": h})

    assert_same(f(x, h), reference(f, x, h)[0], what="triton vs reference")


@pytest.mark.parametrize("kind", ["triangular", "cu_causal", "cu_full", "dense"])
def test_triton_attention_non_finite_scores(triton_route, kind):
    """The tiled Triton attention kernel: a NaN key, a +inf query entry and a query row of
    -inf make the rows they reach NaN, as the reference's softmax (forward; non-finite
    values are not covered: tl.dot's 0 * inf for keys outside a row's range leaks NaN)."""
    n = 40
    graph = attention_relation(kind, n)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((n, 2, 16)).astype(np.float32) for _ in range(3))
    k[5, 0, 3], q[7, 1, 2], q[0, 0, :] = np.nan, np.inf, -np.inf
    m = Attention()

    def f(q, k, v):
        return m(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)

    ex = m.explain(graph=graph, src={"key": k, "value": v}, dst={"query": q}, scale=0.25)
    assert any("Triton attention" in w for _, _, w in ex.routes), str(ex)
    assert_same(f(q, k, v), reference(f, q, k, v)[0], 2e-3, 2e-4, what=kind)
