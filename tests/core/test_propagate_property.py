"""Property tests of propagate: random relations x every reducer x random edge functions x
feature shapes, against a plain-Python loop oracle (per destination, per edge in edge order),
and tg.grad against float64 central finite differences of that oracle."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tiga as tg

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
GRAD = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

REDUCERS = ("sum", "mean", "max", "min", "prod", "online_softmax")
FEATURE_SHAPES = ((), (3,), (2, 3))


# ---- random relations ---------------------------------------------------------------------


@dataclass
class Rel:
    graph: tg.Graph
    num_src: int
    num_dst: int
    edges: list  # (src, dst) per edge, in the relation's edge order (the user's order)


@st.composite
def relations(draw, max_src=6, max_dst=6, max_deg=4, skew=True):
    """CSR or COO relations with empty rows, duplicates, self edges, no edges at all, and
    (optionally) one very high-degree row; num_src and num_dst differ about half the time."""
    def size(most):  # zero-sized sides are kept, but rarer than hypothesis would make them
        return 0 if draw(st.integers(0, 9)) == 0 else draw(st.integers(1, most))

    num_dst = size(max_dst)
    num_src = num_dst if draw(st.booleans()) else size(max_src)
    shapes = ["random"] * 3 + ["no_edges"] + (["skewed"] * 2 if skew else [])
    shape = draw(st.sampled_from(shapes))
    if num_src == 0 or num_dst == 0 or shape == "no_edges":
        degrees = [0] * num_dst
    else:
        degrees = draw(st.lists(st.integers(0, max_deg), min_size=num_dst, max_size=num_dst))
        if shape == "skewed":
            degrees[draw(st.integers(0, num_dst - 1))] = draw(st.integers(12, 40))
    edges = []
    for d, k in enumerate(degrees):
        if k == 0:
            continue
        srcs = draw(st.lists(st.integers(0, num_src - 1), min_size=k, max_size=k))
        if k and d < num_src and draw(st.booleans()):
            srcs[draw(st.integers(0, k - 1))] = d  # a self edge
        if k >= 2 and draw(st.booleans()):
            srcs[-1] = srcs[0]  # a duplicate edge
        edges += [(s, d) for s in srcs]
    idx = draw(st.sampled_from([np.int32, np.int64]))
    if draw(st.booleans()):
        # COO in a random user order: the stored CSR order differs, edge fields must not
        edges = [edges[i] for i in draw(st.permutations(range(len(edges))))]
        g = tg.Graph.from_coo(np.array([s for s, _ in edges], idx),
                              np.array([d for _, d in edges], idx),
                              num_src=num_src, num_dst=num_dst)
    else:
        row_ptr = np.concatenate([[0], np.cumsum(np.array(degrees, np.int64))])
        g = tg.Graph.from_csr(row_ptr.astype(idx), np.array([s for s, _ in edges], idx),
                              num_src=num_src)
    return Rel(g, num_src, num_dst, edges)


# ---- edge functions: (tiga version, numpy per-edge version) ------------------------------

TG_FAMILIES = {
    "mul_w": lambda s, d, e, p: s.x * e.w,
    "add_h": lambda s, d, e, p: s.x + d.h,
    "tanh_w": lambda s, d, e, p: tg.math.tanh(s.x) * e.w,
    "matmul_W": lambda s, d, e, p: s.x @ p["W"],
    "scale": lambda s, d, e, p: s.x * p["scale"],
    "relu_diff": lambda s, d, e, p: tg.math.relu(s.x - d.h),
}
NP_FAMILIES = {
    "mul_w": lambda x, h, w, p: x * w,
    "add_h": lambda x, h, w, p: x + h,
    "tanh_w": lambda x, h, w, p: np.tanh(x) * w,
    "matmul_W": lambda x, h, w, p: x @ p["W"],
    "scale": lambda x, h, w, p: x * p["scale"],
    "relu_diff": lambda x, h, w, p: np.maximum(x - h, 0.0),
}
FAMILY_PARAMS = {"matmul_W": "W", "scale": "scale"}


def tg_edge_fn(family: str, reducer, mode: str):
    """The edge function handed to tiga; online_softmax packages (score, value) parts."""
    base = TG_FAMILIES[family]

    def edge_fn(src, dst, edge, **params):
        m = base(src, dst, edge, params)
        if reducer.name != "online_softmax":
            return m
        if mode == "elementwise":
            return reducer(m, m * edge.s)  # one score per element
        return reducer(edge.s, m)  # one score per edge ("head"), broadcast over the value

    return edge_fn


def np_message(family: str, reducer_name: str, mode: str, x, h, w, s, params):
    """The numpy per-edge message: an array, or (score, value) for online_softmax."""
    m = np.asarray(NP_FAMILIES[family](x, h, w, params), np.float64)
    if reducer_name != "online_softmax":
        return m
    return (m, m * s) if mode == "elementwise" else (np.asarray(s), m)


# ---- the loop oracle ---------------------------------------------------------------------


def _expand(p, like):
    return np.reshape(p, np.shape(p) + (1,) * (np.ndim(like) - np.ndim(p)))


def reduce_row(name: str, msgs: list, out_shape: tuple):
    """API.md section 3 semantics for one destination row, folding messages in edge order."""
    if not msgs:
        return np.full(out_shape, 1.0 if name == "prod" else 0.0)
    if name == "online_softmax":
        top = msgs[0][0]
        for score, _ in msgs[1:]:
            top = np.maximum(top, score)
        mass, acc = 0.0, np.zeros(out_shape)
        for score, value in msgs:
            p = np.exp(score - top)
            mass = mass + p
            acc = acc + _expand(p, value) * value
        return acc / _expand(mass, acc)
    acc = msgs[0]
    for m in msgs[1:]:
        if name in ("sum", "mean"):
            acc = acc + m
        elif name == "max":
            acc = np.maximum(acc, m)
        elif name == "min":
            acc = np.minimum(acc, m)
        elif name == "prod":
            acc = acc * m
        else:
            raise AssertionError(name)
    return acc / len(msgs) if name == "mean" else acc


def loop_oracle(num_dst: int, edges: list, message, reduce):
    """out[d] = reduce([message(e) for each edge e into d, in edge order])."""
    rows = []
    for d in range(num_dst):
        rows.append(reduce([message(e) for e, (_, dd) in enumerate(edges) if dd == d]))
    return rows


@dataclass
class Case:
    rel: Rel
    family: str
    fshape: tuple
    reducer: str
    mode: str
    seed: int
    form: str = "functional"


def case_strategy(rel_strategy):
    @st.composite
    def cases(draw):
        rel = draw(rel_strategy)
        family = draw(st.sampled_from(sorted(TG_FAMILIES)))
        shapes = FEATURE_SHAPES[1:] if family == "matmul_W" else FEATURE_SHAPES
        return Case(rel, family, draw(st.sampled_from(shapes)), draw(st.sampled_from(REDUCERS)),
                    draw(st.sampled_from(["elementwise", "head"])),
                    draw(st.integers(0, 2 ** 32 - 1)),
                    draw(st.sampled_from(["functional", "class"])))
    return cases()


def make_inputs(case: Case, num_src: int, num_dst: int, num_edges: int):
    rng = np.random.default_rng(case.seed)
    f = case.fshape
    x = rng.uniform(-1.5, 1.5, (num_src,) + f)
    h = rng.uniform(-1.5, 1.5, (num_dst,) + f)
    w = rng.uniform(-1.5, 1.5, (num_edges,) + f)
    s = rng.uniform(-2.0, 2.0, (num_edges,))
    params = {}
    if case.family == "matmul_W":
        params["W"] = rng.uniform(-1.0, 1.0, (f[-1], 2))
    elif case.family == "scale":
        params["scale"] = float(rng.uniform(-2.0, 2.0))  # a Python float: weakly typed
    return x, h, w, s, params


def message_shape(case: Case, params) -> tuple:
    z = np.zeros(case.fshape)
    return np.shape(NP_FAMILIES[case.family](z, z, z, params))


def run_tiga(graph, case: Case, x, h, w, s, params, reducer=None):
    reducer = reducer if reducer is not None else getattr(tg, case.reducer)()
    edge_fn = tg_edge_fn(case.family, reducer, case.mode)
    src, dst, edge = {"x": x}, {"h": h}, {"w": w, "s": s}
    if case.form == "functional":
        return tg.propagate(graph, edge_fn, reducer, src=src, dst=dst, edge=edge, **params)
    cls = type("Drawn", (tg.MessagePassing,), {
        "reducer": reducer,
        "edge": lambda self, src, dst, edge, **p: edge_fn(src, dst, edge, **p)})
    return cls()(graph=graph, src=src, dst=dst, edge=edge, **params)


def oracle(rel_edges, num_dst, case: Case, x, h, w, s, params):
    out_shape = message_shape(case, params)

    def message(e):
        sv, dv = rel_edges[e]
        return np_message(case.family, case.reducer, case.mode, x[sv], h[dv], w[e], s[e], params)

    rows = loop_oracle(num_dst, rel_edges, message,
                       lambda msgs: reduce_row(case.reducer, msgs, out_shape))
    return np.array(rows).reshape((num_dst,) + out_shape)


# ---- forward properties ------------------------------------------------------------------


@FAST
@given(case=case_strategy(relations()))
def test_propagate_matches_loop_oracle(case):
    rel = case.rel
    x, h, w, s, params = make_inputs(case, rel.num_src, rel.num_dst, len(rel.edges))
    got = run_tiga(rel.graph, case, x, h, w, s, params)
    assert isinstance(got, tg.Tensor)
    got = np.asarray(got)
    want = oracle(rel.edges, rel.num_dst, case, x, h, w, s, params)
    assert got.dtype == np.float64
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


@st.composite
def implicit_graphs(draw):
    kind = draw(st.sampled_from(["dense", "triangular", "cu_seqlens", "cat", "stencil"]))
    if kind == "dense":
        ns = draw(st.integers(0, 4))
        return tg.Graph.dense(ns, draw(st.one_of(st.none(), st.integers(0, 4))))
    if kind == "triangular":
        return tg.Graph.triangular(draw(st.integers(0, 6)))
    if kind == "cu_seqlens":
        lens = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
        return tg.Graph.cu_seqlens(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                                   causal=draw(st.booleans()))
    if kind == "cat":
        parts = draw(st.lists(st.one_of(
            relations(max_src=3, max_dst=3, skew=False).map(lambda r: r.graph),
            st.integers(0, 3).map(tg.Graph.triangular),
            st.tuples(st.integers(0, 3), st.integers(0, 3)).map(
                lambda t: tg.Graph.dense(*t))), min_size=1, max_size=3))
        return tg.Graph.cat(parts)
    rank = draw(st.integers(1, 2))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    offsets = draw(st.lists(st.tuples(*[st.integers(-1, 1)] * rank), min_size=1, max_size=5,
                            unique=True))
    return tg.Graph.stencil(shape, offsets, periodic=draw(st.booleans()))


@FAST
@given(g=implicit_graphs(), case=case_strategy(st.none()))
def test_implicit_kinds_match_their_resolved_csr(g, case):
    """An implicit relation computes what its materialised CSR computes, edge fields in the
    relation's own edge order (cat of COO parts stores a permutation)."""
    row_ptr, col_idx = g.resolve_csr()
    plain = tg.Graph.from_csr(row_ptr, col_idx, num_src=g.num_src)
    x, h, w, s, params = make_inputs(case, g.num_src, g.num_dst, g.num_edges)
    got = np.asarray(run_tiga(g, case, x, h, w, s, params))
    perm = np.arange(g.num_edges) if g.edge_perm is None else np.asarray(g.edge_perm)
    want = np.asarray(run_tiga(plain, case, x, h, w[perm], s[perm], params))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    # and both agree with the loop oracle over the edges in the relation's edge order
    stored = [(int(col_idx[p]), d) for d in range(g.num_dst)
              for p in range(int(row_ptr[d]), int(row_ptr[d + 1]))]
    edges = [None] * len(stored)
    for p, e in enumerate(perm.tolist()):
        edges[e] = stored[p]
    np.testing.assert_allclose(got, oracle(edges, g.num_dst, case, x, h, w, s, params),
                               rtol=1e-11, atol=1e-12)


# ---- user reducers -----------------------------------------------------------------------


def _lse_combine(a, b):
    top = tg.math.maximum(a, b)
    return top + tg.math.log(tg.math.exp(a - top) + tg.math.exp(b - top))


USER_REDUCERS = {
    # name: (tg.Reducer factory, identity, per-message lift, combine, finalize) for the oracle
    "sumsq": (lambda: tg.Reducer("sumsq", identity=0.0, combine=lambda a, b: a + b,
                                 lift=lambda m: m * m, finalize=tg.math.sqrt),
              0.0, lambda m: m * m, lambda a, b: a + b, np.sqrt),
    "logsumexp": (lambda: tg.Reducer("logsumexp", identity=-np.inf, combine=_lse_combine),
                  -np.inf, lambda m: m, np.logaddexp, lambda a: a),
    # not commutative: the fold order must be the edge order
    "horner": (lambda: tg.Reducer("horner", identity=0.0, combine=lambda a, b: a * 0.5 + b,
                                  commutative=False),
               0.0, lambda m: m, lambda a, b: a * 0.5 + b, lambda a: a),
}


@FAST
@given(case=case_strategy(relations()), name=st.sampled_from(sorted(USER_REDUCERS)))
def test_user_reducers_match_loop_oracle(case, name):
    make, identity, lift, combine, finalize = USER_REDUCERS[name]
    case.form = "functional" if case.seed % 2 else "class"
    rel = case.rel
    x, h, w, s, params = make_inputs(case, rel.num_src, rel.num_dst, len(rel.edges))
    case.reducer = "sum"  # plain messages (no online_softmax packaging)
    got = np.asarray(run_tiga(rel.graph, case, x, h, w, s, params, reducer=make()))
    out_shape = message_shape(case, params)

    def message(e):
        sv, dv = rel.edges[e]
        return np_message(case.family, "sum", case.mode, x[sv], h[dv], w[e], s[e], params)

    def reduce(msgs):
        acc = np.full(out_shape, identity)
        for m in msgs:
            acc = combine(acc, lift(m))
        return finalize(acc)

    want = np.array(loop_oracle(rel.num_dst, rel.edges, message, reduce))
    np.testing.assert_allclose(got, want.reshape((rel.num_dst,) + out_shape), rtol=1e-11,
                               atol=1e-12)


# ---- gradients ---------------------------------------------------------------------------


def _rows_of_messages(rel, case, x, h, w, s, params):
    return [[np_message(case.family, case.reducer, case.mode, x[sv], h[d], w[e], s[e], params)
             for e, (sv, dd) in enumerate(rel.edges) if dd == d] for d in range(rel.num_dst)]


def _smooth_enough(rel, case, x, h, w, s, params) -> bool:
    """Finite differences need the oracle to be differentiable at the point: no relu kink and,
    for max/min, no near-tie between different message values (exact ties from duplicate
    edges are the same function of the inputs, so they are harmless)."""
    if case.family == "relu_diff":
        for sv, d in rel.edges:
            if np.min(np.abs(x[sv] - h[d]), initial=1.0) < 1e-3:
                return False
    if case.reducer not in ("max", "min"):
        return True
    for msgs in _rows_of_messages(rel, case, x, h, w, s, params):
        if len(msgs) < 2:
            continue
        stack = np.stack(msgs)
        stack = -stack if case.reducer == "min" else stack
        top = stack.max(axis=0)
        gap = top - stack
        if np.any((gap > 0) & (gap < 1e-3)):
            return False
    return True


def central_differences(f, args: list, k: int, eps=1e-6) -> np.ndarray:
    base = [np.array(a, np.float64, copy=True) for a in args]
    out = np.zeros(base[k].shape)
    for i in np.ndindex(base[k].shape):
        hi = [a.copy() for a in base]
        lo = [a.copy() for a in base]
        hi[k][i] += eps
        lo[k][i] -= eps
        out[i] = (f(*hi) - f(*lo)) / (2 * eps)
    return out


@GRAD
@given(case=case_strategy(relations(max_src=4, max_dst=4, max_deg=3, skew=False)))
def test_grad_matches_finite_differences(case):
    rel = case.rel
    x, h, w, s, params = make_inputs(case, rel.num_src, rel.num_dst, len(rel.edges))
    assume(_smooth_enough(rel, case, x, h, w, s, params))
    pname = FAMILY_PARAMS.get(case.family)
    if pname == "scale":
        params[pname] = np.asarray(params[pname], np.float64)  # a differentiable operand
    rng = np.random.default_rng(case.seed + 1)
    ct = rng.uniform(-1.0, 1.0, (rel.num_dst,) + message_shape(case, params))

    def with_param(p):
        return {} if pname is None else {pname: p}

    def loss_tg(x, h, w, s, p):
        y = run_tiga(rel.graph, case, x, h, w, s, with_param(p))
        return (y * ct).sum()

    def loss_np(x, h, w, s, p):
        return float(np.sum(oracle(rel.edges, rel.num_dst, case, x, h, w, s, with_param(p))
                            * ct))

    p0 = params[pname] if pname else np.zeros(())
    args = [x, h, w, s, p0]
    argnums = (0, 1, 2, 3, 4) if pname else (0, 1, 2, 3)
    grads = tg.grad(loss_tg, argnums=argnums)(*args)
    for k, g in zip(argnums, grads):
        want = central_differences(loss_np, args, k)
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"gradient w.r.t. argument {k}")


def _prod_graph():
    """COO in a scrambled order: dst 0 has one zero message, dst 1 two zeros, dst 2 none,
    dst 3 no edges; dst 4 has a zero in one feature column only."""
    edges = [(1, 2), (0, 0), (2, 1), (0, 1), (3, 0), (1, 4), (2, 0), (1, 1), (0, 2), (3, 4)]
    g = tg.Graph.from_coo(np.array([e[0] for e in edges]), np.array([e[1] for e in edges]),
                          num_src=4, num_dst=5)
    return g, edges


def test_prod_gradient_is_exact_with_zeros():
    g, edges = _prod_graph()
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, (4, 2))
    w = rng.uniform(0.5, 1.5, (len(edges), 2))
    w[1] = 0.0  # dst 0: one zero (both columns)
    w[2] = w[7] = 0.0  # dst 1: two zeros
    w[5, 1] = 0.0  # dst 4: column 1 has one zero, column 0 none
    ct = rng.uniform(-1.0, 1.0, (5, 2))

    def f(x, w):
        y = tg.propagate(g, lambda s, d, e: s.x * e.w, tg.prod(), src={"x": x}, edge={"w": w})
        return (y * ct).sum()

    gx, gw = (np.asarray(v) for v in tg.grad(f, argnums=(0, 1))(x, w))
    # oracle: d prod / d m_e = product of the other messages of the row, by a loop
    want_x, want_w = np.zeros_like(x), np.zeros_like(w)
    for e, (sv, d) in enumerate(edges):
        others = np.ones(2)
        for e2, (s2, d2) in enumerate(edges):
            if d2 == d and e2 != e:
                others = others * x[s2] * w[e2]
        want_w[e] = ct[d] * x[sv] * others
        want_x[sv] += ct[d] * w[e] * others
    np.testing.assert_allclose(gw, want_w, rtol=1e-13, atol=0)
    np.testing.assert_allclose(gx, want_x, rtol=1e-13, atol=1e-15)
    # two zeros in a row: every cotangent of that row is exactly zero
    assert np.all(gw[[2, 3, 7]] == 0.0)
    # one zero: the non-zero edges get exactly zero, the zero edge the product of the rest
    assert np.all(gw[[4, 6]] == 0.0) and np.all(gw[1] != 0.0)
    assert gw[5, 0] != 0.0 and gw[9, 1] == 0.0 and gw[5, 1] != 0.0


def _first_extremal(edges, msgs, d, col, largest):
    best = None
    for e, (_, dd) in enumerate(edges):
        if dd != d:
            continue
        v = msgs[e][col]
        if best is None or (v > msgs[best][col] if largest else v < msgs[best][col]):
            best = e
    return best


@pytest.mark.parametrize("name", ["max", "min"])
def test_extremum_gradient_goes_to_first_tied_edge_in_user_order(name):
    # user order interleaves destinations, so edge ids differ from CSR positions
    edges = [(0, 1), (1, 0), (2, 1), (3, 0), (0, 0), (3, 1), (2, 0)]
    g = tg.Graph.from_coo(np.array([e[0] for e in edges]), np.array([e[1] for e in edges]),
                          num_src=4, num_dst=2)
    assert g.edge_perm is not None and np.any(np.asarray(g.edge_perm) != np.arange(7))
    x = np.ones((4, 2))
    # column 0: dst 0 ties at edges 3, 4 (and 6 for min); dst 1 ties at edges 2, 5
    w = np.array([[1.0, 4.0], [2.0, 3.0], [3.0, 4.0], [5.0, 3.0], [5.0, 2.0], [3.0, 1.0],
                  [2.0, 2.0]])
    if name == "min":
        w = -w
    ct = np.array([[1.5, -2.0], [0.75, 3.0]])

    def f(x, w):
        y = tg.propagate(g, lambda s, d, e: s.x * e.w, getattr(tg, name)(), src={"x": x},
                         edge={"w": w})
        return (y * ct).sum()

    gx, gw = (np.asarray(v) for v in tg.grad(f, argnums=(0, 1))(x, w))
    want_w, want_x = np.zeros_like(w), np.zeros_like(x)
    msgs = [x[sv] * w[e] for e, (sv, _) in enumerate(edges)]
    for d in range(2):
        for col in range(2):
            e = _first_extremal(edges, msgs, d, col, largest=(name == "max"))
            want_w[e, col] = ct[d, col] * x[edges[e][0], col]
            want_x[edges[e][0], col] += ct[d, col] * w[e, col]
    np.testing.assert_array_equal(gw, want_w)
    np.testing.assert_array_equal(gx, want_x)
    # the premise: some row really has a tie
    assert np.count_nonzero(gw) == 4


@FAST
@given(rel=relations(max_src=4, max_dst=4, max_deg=5, skew=False),
       name=st.sampled_from(["max", "min"]), seed=st.integers(0, 2 ** 32 - 1))
def test_extremum_ties_route_to_first_edge_property(rel, name, seed):
    """Integer-valued messages tie often; only the first extremal edge of each row, in edge
    order, receives the cotangent (per feature column)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-1, 3, (len(rel.edges), 2)).astype(np.float64)
    x = np.ones((rel.num_src, 2))
    ct = rng.uniform(0.5, 1.5, (rel.num_dst, 2))

    def f(w):
        y = tg.propagate(rel.graph, lambda s, d, e: s.x * e.w, getattr(tg, name)(),
                         src={"x": x}, edge={"w": w})
        return (y * ct).sum()

    gw = np.asarray(tg.grad(f)(w))
    want = np.zeros_like(w)
    for d in range(rel.num_dst):
        for col in range(2):
            e = _first_extremal(rel.edges, w, d, col, largest=(name == "max"))
            if e is not None:
                want[e, col] = ct[d, col]
    np.testing.assert_array_equal(gw, want)
