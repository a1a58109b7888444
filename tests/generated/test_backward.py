"""Compiled VJP over radius / knn relations: source-grouped cotangent propagates over a
symmetric radius relation take the fused cell walk with roles swapped (no CSR, no
transpose); asymmetric relations keep the transposed CSR. Strict mode and explain() for
relations generated inside traced programs."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.core.graph import Graph
from tiga.core.prims.graph import degrees_p
from tiga.trace.tracer import bind
from tiga.xla_free_runtime.backends.cpu import generated as lg
from tiga.xla_free_runtime.executor import execute

from .oracle import knn_rows, radius_rows


@pytest.fixture
def recorder(monkeypatch):
    """Records every CSR resolution / transpose and every fused run (grouping, swapped)."""
    seen = {"csr": [], "transpose": [], "fused": []}
    resolve, transpose, run = Graph.resolve_csr, Graph.transpose, lg.GeneratedPlan.run

    def rec_resolve(self, *a, **k):
        seen["csr"].append(self.kind)
        return resolve(self, *a, **k)

    def rec_transpose(self, *a, **k):
        seen["transpose"].append(self.kind)
        return transpose(self, *a, **k)

    def rec_run(self, eqn, *a):
        seen["fused"].append((self.spec.kind, eqn.params["reduce_by"], self.swap))
        return run(self, eqn, *a)

    monkeypatch.setattr(Graph, "resolve_csr", rec_resolve)
    monkeypatch.setattr(Graph, "transpose", rec_transpose)
    monkeypatch.setattr(lg.GeneratedPlan, "run", rec_run)
    return seen


def _make(kind, p, kw):
    if kind == "knn":
        return tg.Graph.knn(p, kw.get("k", 6), loop=kw.get("loop", False))
    return tg.Graph.radius(p, kw["cutoff"], loop=kw.get("loop", False),
                           max_neighbors=kw.get("max_neighbors"))


def _rows(kind, p, kw):
    if kind == "knn":
        return knn_rows(p, kw.get("k", 6), loop=kw.get("loop", False))
    return radius_rows(p, kw["cutoff"], loop=kw.get("loop", False),
                       max_neighbors=kw.get("max_neighbors"))


def _loss(kind, kw, reducer):
    # with self loops a zero distance has no derivative: weigh by the squared distance then
    loop = kw.get("loop", False)

    def edge(s, d, e):
        d2 = tg.math.sum(e.displacement * e.displacement, axis=-1)[..., None]
        return s.x * tg.math.exp(-(d2 if loop else e.distance)) * d.h + d2

    def loss(p, x, h):
        g = _make(kind, p, kw)
        y = tg.propagate(g, edge, getattr(tg, reducer)(), src={"x": x}, dst={"h": h})
        return tg.math.sum(y * y)
    return loss


def _ref(kind, kw, reducer, p, x, h):
    """The same loss by brute force in float64 numpy, on the oracle's topology."""
    total = 0.0
    for i, src in enumerate(_rows(kind, p, kw)):
        disp = p[src] - p[i]
        d2 = (disp ** 2).sum(axis=1)
        w = d2 if kw.get("loop", False) else np.sqrt(d2)
        msg = x[src] * np.exp(-w)[:, None] * h[i] + d2[:, None]
        if len(src) == 0:
            continue
        y = msg.sum(axis=0) if reducer == "sum" else msg.mean(axis=0)
        total += float((y * y).sum())
    return total


def _fd_all(f, arr, eps=1e-6):
    out = np.zeros_like(arr)
    for i in np.ndindex(arr.shape):
        a = arr.copy()
        a[i] += eps
        up = f(a)
        a[i] -= 2 * eps
        out[i] = (up - f(a)) / (2 * eps)
    return out


SYMMETRIC = [("radius", {"cutoff": 0.3}), ("radius", {"cutoff": 0.3, "loop": True})]
ASYMMETRIC = [("knn", {"k": 6}), ("radius", {"cutoff": 0.3, "max_neighbors": 4})]


@pytest.mark.parametrize("kind, kw", SYMMETRIC + ASYMMETRIC)
@pytest.mark.parametrize("reducer", ["sum", "mean"])
@pytest.mark.parametrize("d", [2, 3, 5])
def test_gradients_match_finite_differences(recorder, kind, kw, reducer, d):
    rng = np.random.default_rng(d + len(kw))
    n = 40
    pos, x, h = rng.random((n, d)), rng.random((n, 2)), rng.random((n, 1)) + 0.5
    if d == 5:
        kw = dict(kw, cutoff=kw.get("cutoff", 0.3) * 2.5)
    loss = _loss(kind, kw, reducer)
    value, grads = tg.value_and_grad(loss, argnums=(0, 1, 2))(pos, x, h)
    np.testing.assert_allclose(float(np.asarray(value)), _ref(kind, kw, reducer, pos, x, h),
                               rtol=1e-12)
    for arg, got in enumerate(grads):
        args = [pos, x, h]

        def f(a, arg=arg, args=args):
            call = list(args)
            call[arg] = a
            return _ref(kind, kw, reducer, *call)

        # small steps keep the topology fixed (no pair crosses the cutoff or swaps rank)
        np.testing.assert_allclose(np.asarray(got), _fd_all(f, args[arg]),
                                   rtol=1e-5, atol=1e-6)
    src_runs = [r for r in recorder["fused"] if r[1] == "src"]
    if (kind, kw.get("max_neighbors")) == ("radius", None):
        # the symmetric relation: every propagate (forward, dst and src cotangents) and
        # mean's in-degrees take the fused walk; independent dst and src cotangents share
        # one destination-grouped walk (opt/fuse_walks), else src is swapped
        assert recorder["csr"] == [] and recorder["transpose"] == []
        assert all(swap for _, _, swap in src_runs)
    else:
        # asymmetric: source-grouped cotangents walk the transposed CSR
        assert src_runs == [] and kind in recorder["transpose"]
        assert any(by == "dst" for _, by, _ in recorder["fused"])


def test_swapped_walk_over_a_concrete_relation(recorder):
    """A radius Graph built outside the program: the source-field cotangent (reduce_by=
    'src') takes the fused walk with roles swapped; against the analytic gradient."""
    rng = np.random.default_rng(5)
    pos, x = rng.random((120, 3)), rng.random((120, 4))
    v = rng.random((120, 1)) + 0.5
    g = tg.Graph.radius(pos, 0.25)

    def loss(x):
        y = tg.propagate(g, lambda s, d, e: s.x * (1.2 - e.distance) * d.v, tg.sum(),
                         src={"x": x}, dst={"v": v})
        return tg.math.sum(y * y)

    got = np.asarray(tg.grad(loss)(x))
    assert recorder["csr"] == [] and recorder["transpose"] == []
    assert ("radius", "src", True) in recorder["fused"]
    rows = radius_rows(pos, 0.25)
    dist = np.sqrt(((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1))
    w = np.zeros((120, 120))
    for i, src in enumerate(rows):
        w[i, src] = (1.2 - dist[i, src]) * v[i, 0]
    np.testing.assert_allclose(got, 2 * w.T @ (w @ x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind, kw", [("radius", {"cutoff": 0.3}), ("knn", {"k": 5}),
                                      ("radius", {"cutoff": 0.3, "max_neighbors": 3})])
def test_strict_mode_accepts_relations_generated_in_the_program(monkeypatch, kind, kw):
    monkeypatch.setattr(tg.config, "strict", True)
    rng = np.random.default_rng(2)
    pos, x, h = rng.random((50, 3)), rng.random((50, 2)), rng.random((50, 1)) + 0.5
    loss = _loss(kind, kw, "sum")
    value, (gp, gx) = tg.value_and_grad(loss, argnums=(0, 1))(pos, x, h)
    np.testing.assert_allclose(float(np.asarray(value)), _ref(kind, kw, "sum", pos, x, h),
                               rtol=1e-12)
    jitted = tg.jit(tg.grad(loss, argnums=(0, 1)))
    jp, jx = jitted(pos, x, h)
    np.testing.assert_allclose(np.asarray(jp), np.asarray(gp), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(jx), np.asarray(gx), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind, kw", [("radius", {"cutoff": 0.3}), ("knn", {"k": 5})])
def test_explain_describes_relations_generated_in_jit_and_grad(kind, kw):
    rng = np.random.default_rng(3)
    pos, x, h = rng.random((30, 3)), rng.random((30, 2)), rng.random((30, 1))
    loss = _loss(kind, kw, "sum")
    fresh = tg.jit(tg.grad(loss, argnums=(0, 1)))
    text = str(fresh.lower(pos, x, h).compile().explain())   # before any call
    assert "reference" not in text.split("traversal:")[0]
    assert f"compiles (fused {kind} traversal, no edge list)" in text
    if kind == "radius":
        # what a call executes: the dst and src cotangent walks of the symmetric relation
        # are one destination-grouped walk (src roles swapped; opt/fuse_walks)
        assert "by src" not in text.split("traversal:")[0]
        assert "transposed" not in text.split("vjp:")[0]
        assert "CSR of the" not in text
    else:
        assert "propagate[sum] by src: cpu-llvm" in text
        assert "transposed where needed" in text
        assert f"CSR of the {kind} relation generated in the program and its transpose" in text
    forward = str(tg.jit(loss).lower(pos, x, h).compile().explain())
    assert f"compiles (fused {kind} traversal, no edge list)" in forward
    assert "cell directory of the" in forward


@pytest.mark.parametrize("kind, kw", [("radius", {"cutoff": 0.2}),
                                      ("radius", {"cutoff": 0.2, "loop": True}),
                                      ("radius", {"cutoff": 0.2, "max_neighbors": 4}),
                                      ("knn", {"k": 7})])
@pytest.mark.parametrize("by", ["dst", "src"])
def test_fused_degrees_match_the_oracle(recorder, kind, kw, by):
    rng = np.random.default_rng(9)
    pos = np.round(rng.random((150, 3)) * 10) / 10     # lattice: pairs exactly at the cutoff
    graph = _make(kind, pos, kw)
    program = tg.make_program(lambda g: bind(degrees_p, g, by=by))(graph)
    got = execute(program, [graph])[0]
    rows = _rows(kind, pos, kw)
    if by == "dst":
        want = np.array([len(r) for r in rows])
    else:
        want = np.bincount(np.concatenate(rows), minlength=150)
    if by == "src" and (kind == "knn" or kw.get("max_neighbors")):
        # asymmetric: only the relation's CSR knows them (fused_degrees declines); which of
        # the lattice's tied pairs a row keeps is the relation's own choice
        assert lg.fused_degrees(graph, by, None) is None
        np.testing.assert_array_equal(
            got, np.bincount(graph.resolve_csr()[1], minlength=150))
        return
    np.testing.assert_array_equal(got, want)
    assert recorder["csr"] == []


@pytest.mark.parametrize("dtype", [np.float64, np.uint8])
def test_strict_refuses_exactly_when_explain_reports_a_fallback(monkeypatch, dtype):
    """Planning relations generated in the program from their type does not hide real
    fallbacks: strict mode still refuses a propagate whose fields do not compile, before
    running, and explain() (no call yet) names the same route."""
    rng = np.random.default_rng(4)
    pos, x = rng.random((40, 3)), (rng.random((40, 2)) * 4).astype(dtype)

    def f(p, x):
        g = tg.Graph.radius(p, 0.3)
        return tg.propagate(g, lambda s, d, e: s.x * s.x, tg.sum(), src={"x": x})

    ex = tg.jit(f).lower(pos, x).compile().explain()
    falls = [r for r in ex.routes if r[0] == "reference"]
    monkeypatch.setattr(tg.config, "strict", True)
    if falls:
        with pytest.raises(tg.UnsupportedError, match="strict mode"):
            tg.jit(f)(pos, x)
    else:
        got = np.asarray(tg.jit(f)(pos, x))
        rows = radius_rows(pos, 0.3)
        want = np.array([(x[r].astype(np.float64) ** 2).sum(axis=0) for r in rows])
        np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-12)
    assert bool(falls) == (dtype == np.uint8)      # unsigned fields are not compiled


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 50), d=st.integers(1, 3), cutoff=st.floats(0.05, 0.8),
       seed=st.integers(0, 2 ** 16), loop=st.booleans())
def test_property_swapped_source_cotangent_on_lattice_points(n, d, cutoff, seed, loop):
    """Lattice coordinates (duplicates, many pairs exactly at the cutoff): the fused
    roles-swapped walk must select exactly the transpose of the forward relation."""
    rng = np.random.default_rng(seed)
    pos = np.round(rng.random((n, d)) * 6) / 6
    x = rng.random((n, 2))
    g = tg.Graph.radius(pos, cutoff, loop=loop)

    def loss(x):
        y = tg.propagate(g, lambda s, dd, e: s.x * (2.0 - e.distance), tg.sum(), src={"x": x})
        return tg.math.sum(y * y)

    got = np.asarray(tg.grad(loss)(x))
    dist = np.sqrt(((pos[:, None, :] - pos[None, :, :]) ** 2).sum(-1))
    w = np.zeros((n, n))
    for i, src in enumerate(radius_rows(pos, cutoff, loop=loop)):
        w[i, src] = 2.0 - dist[i, src]
    np.testing.assert_allclose(got, 2 * w.T @ (w @ x), rtol=1e-12, atol=1e-12)
    assert g._csr is None
