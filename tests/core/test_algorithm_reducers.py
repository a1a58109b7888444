"""Reducers and relations algorithms need (issue 26 item 4): `empty=` for min/max/prod,
`tg.argmin`/`tg.argmax` (source or edge ids), `tg.edge_map` and `radius(cutoff=inf)`.

Every route (the reference interpreter and cpu-llvm, strictly) is compared with a plain-Python
loop over each destination's edges (API.md section 3), on random relations with empty rows,
duplicate edges, self edges, NaN/inf messages and ties; gradients against float64 central
finite differences; a paged run over a disk store against the reference. The Triton route
runs in tests/triton/test_algorithm_reducers_triton.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALUES = (-1.0, 0.0, 1.0, 2.0, math.inf, -math.inf, math.nan)   # ties, infinities, NaN
REDUCERS = {
    "min": lambda: tg.min(), "min_inf": lambda: tg.min(empty=math.inf),
    "max_ninf": lambda: tg.max(empty=-math.inf), "max_nan": lambda: tg.max(empty=math.nan),
    "prod_7": lambda: tg.prod(empty=7.0), "argmin": lambda: tg.argmin(),
    "argmax": lambda: tg.argmax(), "argmin_edge": lambda: tg.argmin(of="edge"),
    "argmax_edge": lambda: tg.argmax(of="edge"),
}


@dataclass
class Rel:
    graph: tg.Graph
    num_src: int
    num_dst: int
    edges: list            # (src, dst) per edge id, in the relation's edge order


@st.composite
def relations(draw, max_nodes=6, max_deg=5):
    num_src, num_dst = draw(st.integers(0, max_nodes)), draw(st.integers(1, max_nodes))
    edges = []
    for d in range(num_dst):
        if num_src == 0 or draw(st.integers(0, 3)) == 0:
            continue   # an empty row
        srcs = draw(st.lists(st.integers(0, num_src - 1), min_size=1, max_size=max_deg))
        if len(srcs) > 1 and draw(st.booleans()):
            srcs[-1] = srcs[0]   # a duplicate edge
        edges += [(s, d) for s in srcs]
    if draw(st.booleans()):   # COO in a random order: CSR order and edge ids differ
        edges = [edges[i] for i in draw(st.permutations(range(len(edges))))]
        g = tg.Graph.from_coo(np.array([s for s, _ in edges], np.int64),
                              np.array([d for _, d in edges], np.int64),
                              num_src=num_src, num_dst=num_dst)
    else:
        counts = np.bincount([d for _, d in edges], minlength=num_dst)
        g = tg.Graph.from_csr(np.concatenate([[0], np.cumsum(counts)]),
                              np.array([s for s, _ in edges], np.int64), num_src=num_src)
    return Rel(g, num_src, num_dst, edges)


def _rank(v: float, largest: bool):
    """Sort key of a message for argmin/argmax: NaN first (it wins, as numpy's argmin)."""
    return (0, 0.0) if v != v else (1, -v if largest else v)


def oracle_row(name: str, msgs: list, ids: list, empty):
    """API.md section 3 for one row and one message entry, from the plain definitions."""
    if name.startswith("arg"):
        if not msgs:
            return -1
        largest = name.startswith("argmax")
        return min(zip(msgs, ids), key=lambda p: (_rank(p[0], largest), p[1]))[1]
    if not msgs:
        return empty
    if name == "prod":
        return math.prod(msgs)
    if any(v != v for v in msgs):
        return math.nan
    return min(msgs) if name == "min" else max(msgs)


def oracle(rel: Rel, key: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    r = REDUCERS[key]()
    name, feat = r.name, x.shape[1:]
    empty = r.empty if r.empty is not None else (1.0 if name == "prod" else 0.0)
    out = np.zeros((rel.num_dst,) + feat, np.int64 if r.name.startswith("arg") else float)
    for d in range(rel.num_dst):
        mine = [(e, s) for e, (s, dd) in enumerate(rel.edges) if dd == d]
        ids = [e if r.of == "edge" else s for e, s in mine]
        for f in np.ndindex(feat):
            msgs = [float(x[(s,) + f] + w[(e,) + f]) for e, s in mine]
            out[(d,) + f] = oracle_row(name, msgs, ids, empty)
    return out


def layer(reducer):
    class Layer(tg.MessagePassing):
        def edge(self, src, dst, edge):
            return src.x + edge.w

    Layer.reducer = reducer
    return Layer()


@pytest.fixture
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


@FAST
@given(relations(), st.sampled_from(sorted(REDUCERS)), st.sampled_from([(), (3,)]),
       st.integers(0, 2 ** 31))
def test_every_route_matches_the_loop_oracle(rel, key, feat, seed):
    rng = np.random.default_rng(seed)
    x = rng.choice(VALUES, (rel.num_src,) + feat)
    w = rng.choice((0.0, 0.0, 1.0, math.nan), (len(rel.edges),) + feat)
    want = oracle(rel, key, x, w)
    mp = layer(REDUCERS[key]())
    kw = dict(graph=rel.graph, src={"x": x}, edge={"w": w})
    ref = np.asarray(mp.reference(**kw))
    old, tg.config.strict = tg.config.strict, True
    try:
        got = np.asarray(mp(**kw))
    finally:
        tg.config.strict = old
    for route, y in (("reference", ref), ("cpu-llvm", got)):
        assert y.dtype == want.dtype and y.shape == want.shape, (route, y.dtype, y.shape)
        np.testing.assert_array_equal(y, want, err_msg=f"{route} {key}")


def test_compiled_route_is_cpu_llvm_not_a_fallback(strict):
    g = tg.Graph.from_coo(np.array([1, 0, 1]), np.array([0, 0, 2]), num_src=2, num_dst=3)
    for r in (tg.argmin(), tg.argmax(of="edge"), tg.min(empty=math.inf), tg.prod(empty=-2)):
        mp = layer(r)
        text = str(mp.explain(graph=g, src={"x": np.ones(2)}, edge={"w": np.ones(3)}))
        assert "route:      cpu-llvm" in text and "reference" not in text.split("\n")[0], text
        assert r.pp_param() in text, text


def test_defaults_are_unchanged():
    g = tg.Graph.from_csr(np.array([0, 0, 1]), np.array([0]), num_src=1)
    x = np.array([5.0])
    for r, empty in ((tg.min(), 0.0), (tg.max(), 0.0), (tg.prod(), 1.0)):
        y = np.asarray(tg.propagate(g, lambda s, d, e: s.x, r, src={"x": x}))
        assert y.tolist() == [empty, 5.0], r


def test_int_messages_keep_integer_empty_values_and_refuse_inf():
    g = tg.Graph.from_csr(np.array([0, 0, 2]), np.array([0, 1]), num_src=2)
    x = np.array([4, 3], np.int64)
    y = tg.propagate(g, lambda s, d, e: s.x, tg.min(empty=-5), src={"x": x})
    assert np.asarray(y).tolist() == [-5, 3] and np.asarray(y).dtype == np.int64
    with pytest.raises(tg.DTypeError, match=r"min\(empty=inf\) over i64.*cannot hold inf"):
        tg.propagate(g, lambda s, d, e: s.x, tg.min(empty=math.inf), src={"x": x})


@pytest.mark.parametrize("make, match", [
    (lambda: tg.min(empty="inf"), r"tg.min\(empty=...\).*real scalar.*found 'inf'"),
    (lambda: tg.prod(empty=[1.0]), r"tg.prod\(empty=...\).*found \[1.0\]"),
    (lambda: tg.max(empty=True), r"tg.max\(empty=...\).*found True"),
    (lambda: tg.argmin(of="dst"), r"tg.argmin\(of=...\).*\"src\".*\"edge\".*found 'dst'"),
    (lambda: tg.argmax(of=None), r"tg.argmax\(of=...\).*found None"),
])
def test_bad_arguments_are_named(make, match):
    with pytest.raises(tg.TigaError, match=match):
        make()


def test_reducer_options_survive_the_ir_text_round_trip():
    from tiga.lower import ir

    g = tg.Graph.from_csr(np.array([0, 1, 2]), np.array([1, 0]), num_src=2)
    for r, attr in ((tg.prod(empty=math.nan), "reducer_empty = nan"),
                    (tg.argmax(of="edge"), 'reducer_of = "edge"')):
        for stage in ("domain", "iter", "kernel"):
            text = layer(r).ir(stage, graph=g, src={"x": np.ones(2)}, edge={"w": np.ones(2)})
            assert attr in text, (stage, text)
            module = ir.parse_module(text)
            # (text, not ==: a NaN attribute never equals itself)
            assert attr in str(module) and str(ir.parse_module(str(module))) == str(module)


def test_argmin_in_jit_and_eager_loop_is_not_differentiated():
    g = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 1, 1]), num_src=2)

    def f(x):
        ids = tg.propagate(g, lambda s, d, e: s.x, tg.argmin(), src={"x": x})
        low = tg.propagate(g, lambda s, d, e: s.x, tg.min(empty=math.inf), src={"x": x})
        return (low * ids.astype(tg.float64)).sum()

    x = np.array([2.0, 1.0])
    assert np.asarray(tg.jit(f)(x)) == 2.0
    # only min's value carries a cotangent: d/dx of sum(min * id), ids held fixed
    np.testing.assert_array_equal(np.asarray(tg.grad(f)(x)), [0.0, 2.0])


def _central_fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def test_min_empty_inf_gradient_matches_finite_differences():
    g = tg.Graph.from_coo(np.array([0, 1, 2, 2, 1]), np.array([1, 1, 3, 0, 3]), num_src=3,
                          num_dst=5)   # rows 2 and 4 are empty

    def f(x):
        y = tg.propagate(g, lambda s, d, e: s.x * s.x, tg.min(empty=math.inf), src={"x": x})
        finite = tg.math.where(y < 1e300, y, 0.0)
        return (finite * np.arange(1.0, 6.0)[:, None]).sum()

    x = np.array([[0.3, -1.2], [0.7, 0.4], [-0.5, 2.0]])
    ref = _central_fd(lambda v: float(np.asarray(f(v))), x)
    np.testing.assert_allclose(np.asarray(tg.grad(f)(x)), ref, rtol=1e-6, atol=1e-8)


def test_paged_store_run_matches_the_reference(tmp_path):
    """Pages of destination rows over a disk store: the ids stay global, empty rows hold
    `empty` (the paged route runs the same kernels per page)."""
    rng = np.random.default_rng(7)
    n, ns = 40, 25
    rp = np.concatenate([[0], np.cumsum(rng.integers(0, 4, n))]).astype(np.int64)
    ci = rng.integers(0, ns, rp[-1]).astype(np.int64)
    x, w = rng.choice([0.0, 1.0, 2.0, math.inf], (ns, 2)), rng.choice([0.0, 1.0], (rp[-1], 2))
    with tg.store.create(tmp_path / "s", num_src=ns, num_dst=n) as writer:
        writer.append_csr_chunk(rp, ci)
        writer.append_field("x", x, role="src")
        writer.append_field("w", w, role="edge")
    store = tg.store.open(tmp_path / "s")
    mem = tg.Graph.from_csr(rp, ci, num_src=ns)
    for key in ("argmin", "argmax_edge", "min_inf", "prod_7"):
        mp = layer(REDUCERS[key]())
        want = np.asarray(mp.reference(graph=mem, src={"x": x}, edge={"w": w}))
        with tg.scope(page_rows=7, spill_dir=tmp_path / "spill"):
            got = mp(graph=tg.Graph.open(tmp_path / "s"), src={"x": store["x"]},
                     edge={"w": store["w"]})
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=key)
