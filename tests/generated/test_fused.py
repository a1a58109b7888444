"""Compiled propagates over radius / knn relations: values against the brute-force oracle,
gradients against float64 finite differences, executable rebinding and explain()."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.xla_free_runtime.caches.executables import CACHE

from .oracle import dense_weights, knn_rows, pair_distances, point_sets, radius_rows


class DistanceSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * tg.math.exp(-edge.distance)


class DisplacementMean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return edge.displacement * src.s + dst.h


class NearestMax(tg.MessagePassing):
    reducer = tg.max()

    def edge(self, src, dst, edge):
        return src.x - edge.distance

    def update(self, dst, aggregated):
        return aggregated + dst.h


def _graph(kind, pos, query=None, **kw):
    if kind == "knn":
        return tg.Graph.knn(pos, kw.get("k", 5), query=query, loop=kw.get("loop", False))
    return tg.Graph.radius(pos, kw.get("cutoff", 0.2), query=query, loop=kw.get("loop", False),
                           max_neighbors=kw.get("max_neighbors"))


def _rows(kind, pos, query=None, **kw):
    if kind == "knn":
        return knn_rows(pos, kw.get("k", 5), query, kw.get("loop", False))
    return radius_rows(pos, kw.get("cutoff", 0.2), query, kw.get("loop", False),
                       kw.get("max_neighbors"))


CASES = [("radius", {}), ("radius", {"loop": True}), ("radius", {"max_neighbors": 3}),
         ("knn", {}), ("knn", {"k": 9, "loop": True})]


def _route(model, **kw) -> str:
    return str(model.explain(**kw))


@pytest.mark.parametrize("kind, kw", CASES)
@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("points", ["uniform", "grid", "duplicated"])
def test_fused_sum_matches_oracle(kind, kw, d, points):
    rng = np.random.default_rng(d)
    pos = point_sets(rng, points, 140, d)
    if points == "grid":
        kw = dict(kw, cutoff=0.125)
    x = rng.random((140, 3))
    g = _graph(kind, pos, **kw)
    model = DistanceSum()
    y = np.asarray(model(graph=g, src={"x": x}))
    dist = pair_distances(pos, pos)
    w = dense_weights(_rows(kind, pos, **kw), 140, lambda i, j, dist=dist: np.exp(-dist[i, j]))
    np.testing.assert_allclose(y, w @ x, rtol=1e-12, atol=1e-12)
    text = _route(model, graph=g, src={"x": x})
    assert "fused " + kind in text and "no edge list" in text
    assert ("tiled scan" in text) == (d > 3)
    assert g._csr is None          # the compiled route never materialised the edges


@pytest.mark.parametrize("kind, kw", CASES)
def test_fused_mean_max_update_and_query(kind, kw):
    rng = np.random.default_rng(11)
    pos = point_sets(rng, "clustered", 180, 3)
    query = rng.random((60, 3))
    g = _graph(kind, pos, query=query, **{k: v for k, v in kw.items() if k != "loop"})
    rows = _rows(kind, pos, query, **{k: v for k, v in kw.items() if k != "loop"})
    s, h, x = rng.random((180, 1)), rng.random((60, 3)), rng.random(180)
    got = np.asarray(DisplacementMean()(graph=g, src={"s": s}, dst={"h": h}))
    want = np.zeros((60, 3))
    for i, src in enumerate(rows):
        if len(src):
            want[i] = ((pos[src] - query[i]) * s[src] + h[i]).mean(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    got = np.asarray(NearestMax()(graph=g, src={"x": x}, dst={"h": h[:, 0]}))
    dist = pair_distances(pos, query)
    want = np.array([(x[src] - dist[i, src]).max() if len(src) else 0.0
                     for i, src in enumerate(rows)]) + h[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_float32_coordinates():
    rng = np.random.default_rng(2)
    pos = point_sets(rng, "uniform", 300, 3, np.float32)
    x = rng.random((300, 2)).astype(np.float32)
    for g, rows in ((tg.Graph.radius(pos, 0.15), radius_rows(pos, 0.15)),
                    (tg.Graph.knn(pos, 7), knn_rows(pos, 7))):
        y = np.asarray(DistanceSum()(graph=g, src={"x": x}))
        dist = pair_distances(pos, pos).astype(np.float64)
        w = dense_weights(rows, 300, lambda i, j, dist=dist: np.exp(-dist[i, j]))
        np.testing.assert_allclose(y, w @ x, rtol=2e-5, atol=1e-5)


def test_max_neighbors_truncation_reported_by_explain():
    pos = point_sets(np.random.default_rng(4), "uniform", 200, 2)
    g = tg.Graph.radius(pos, 0.25, max_neighbors=5)
    model = DistanceSum()
    model(graph=g, src={"x": np.ones((200, 1))})
    from .oracle import truncated
    want = truncated(pos, 0.25, 5)
    assert want > 0
    assert f"{want} row(s) truncated" in str(model.explain(graph=g, src={"x": np.ones((200, 1))}))


def test_new_coordinates_rebind_the_compiled_executable():
    rng = np.random.default_rng(8)
    model = DistanceSum()
    x = rng.random((256, 4))
    model(graph=tg.Graph.radius(rng.random((256, 3)), 0.2), src={"x": x})
    misses = CACHE.stats.misses
    for _ in range(3):
        pos = rng.random((256, 3))
        y = np.asarray(model(graph=tg.Graph.radius(pos, 0.2), src={"x": x}))
        dist = pair_distances(pos, pos)
        w = dense_weights(radius_rows(pos, 0.2), 256, lambda i, j, dist=dist: np.exp(-dist[i, j]))
        np.testing.assert_allclose(y, w @ x, rtol=1e-12)
    # other sizes and cutoffs reuse it too: the kernel depends on structure only
    last = dict(graph=tg.Graph.radius(rng.random((500, 3)), 0.1), src={"x": rng.random((500, 4))})
    model(**last)
    assert CACHE.stats.misses == misses
    assert "hit (memory; executable rebound" in str(model.explain(**last))


def _fd(f, arr, eps=1e-6, picks=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    idx = [tuple(rng.integers(0, n) for n in arr.shape) for _ in range(picks)]
    for i in idx:
        a = arr.copy()
        a[i] += eps
        up = f(a)
        a[i] -= 2 * eps
        out.append((up - f(a)) / (2 * eps))
    return idx, np.array(out)


@pytest.mark.parametrize("kind", ["radius", "knn"])
def test_position_and_feature_gradients_finite_differences(kind):
    rng = np.random.default_rng(21)
    pos, x = rng.random((70, 3)), rng.random((70, 2))

    def loss(p, x):
        g = tg.Graph.radius(p, 0.35) if kind == "radius" else tg.Graph.knn(p, 6)
        y = tg.propagate(g, lambda s, d, e: s.x * tg.math.exp(-e.distance) +
                         tg.math.sum(e.displacement, axis=-1)[..., None] * 0.1,
                         tg.sum(), src={"x": x})
        return tg.math.sum(y * y)

    def ref(p, x):
        rows = radius_rows(p, 0.35) if kind == "radius" else knn_rows(p, 6)
        total = np.zeros((70, 2))
        for i, src in enumerate(rows):
            disp = p[src] - p[i]
            dist = np.sqrt((disp ** 2).sum(axis=1))
            total[i] = (x[src] * np.exp(-dist)[:, None]
                        + 0.1 * disp.sum(axis=1)[:, None]).sum(axis=0)
        return float((total ** 2).sum())

    gp, gx = tg.grad(loss, argnums=(0, 1))(pos, x)
    gp, gx = np.asarray(gp), np.asarray(gx)
    # small steps keep the topology fixed (no pair crosses the cutoff or swaps rank)
    idx, fd = _fd(lambda a: ref(a, x), pos)
    np.testing.assert_allclose([gp[i] for i in idx], fd, rtol=1e-5, atol=1e-6)
    idx, fd = _fd(lambda a: ref(pos, a), x)
    np.testing.assert_allclose([gx[i] for i in idx], fd, rtol=1e-5, atol=1e-6)


def test_jit_keeps_radius_symbolic():
    def f(p, x):
        g = tg.Graph.radius(p, 0.3)
        return DistanceSum()(graph=g, src={"x": x})

    prog = tg.make_program(f)(np.zeros((10, 2)), np.zeros((10, 1)))
    assert "radius[" in str(prog)
    rng = np.random.default_rng(1)
    p, x = rng.random((50, 2)), rng.random((50, 1))
    got = np.asarray(tg.jit(f)(p, x))
    dist = pair_distances(p, p)
    w = dense_weights(radius_rows(p, 0.3), 50, lambda i, j, dist=dist: np.exp(-dist[i, j]))
    np.testing.assert_allclose(got, w @ x, rtol=1e-12)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 60), d=st.integers(1, 3), cutoff=st.floats(0.01, 0.8),
       seed=st.integers(0, 2 ** 16), k=st.integers(1, 8))
def test_property_fused_equals_oracle(n, d, cutoff, seed, k):
    rng = np.random.default_rng(seed)
    pos = np.round(rng.random((n, d)) * 8) / 8     # lattice values: ties and exact cutoffs
    x = rng.random((n, 2))
    model = DistanceSum()
    for g, rows in ((tg.Graph.radius(pos, cutoff), radius_rows(pos, cutoff)),
                    (tg.Graph.knn(pos, min(k, n), loop=True), knn_rows(pos, min(k, n),
                                                                      loop=True))):
        y = np.asarray(model(graph=g, src={"x": x}))
        dist = pair_distances(pos, pos)
        w = dense_weights(rows, n, lambda i, j, dist=dist: np.exp(-dist[i, j]))
        np.testing.assert_allclose(y, w @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k", [1, 5, 12])
def test_knn_sparse_outliers_take_the_shell_walk(k):
    """A dense cluster sets the density estimate; far outliers have fewer than k sources
    within the prefilter distance, so their rows must fall back to growing shells."""
    rng = np.random.default_rng(k)
    pos = np.concatenate([0.5 + 0.01 * rng.random((300, 3)), rng.random((25, 3)) * 4.0 - 2.0])
    x = rng.random((325, 2))
    for g, rows in ((tg.Graph.knn(pos, k), knn_rows(pos, k)),
                    (tg.Graph.knn(pos, k, query=rng.random((40, 3)) * 6 - 3), None)):
        if rows is None:
            rows = knn_rows(pos, k, query=g.params["query"])
            q = g.params["query"]
        else:
            q = pos
        y = np.asarray(DistanceSum()(graph=g, src={"x": x}))
        dist = pair_distances(pos, q)
        w = dense_weights(rows, 325, lambda i, j, dist=dist: np.exp(-dist[i, j]))
        np.testing.assert_allclose(y, w @ x, rtol=1e-12, atol=1e-12)


def test_traced_relations_run_the_fused_kernel(monkeypatch):
    """radius on traced coordinates (inside tg.grad) is planned once the relation exists:
    the forward propagate takes the fused generated-relation kernel, not the interpreter."""
    from tiga.xla_free_runtime.backends.cpu import generated as lg

    runs = []
    original = lg.GeneratedPlan.run
    monkeypatch.setattr(lg.GeneratedPlan, "run",
                        lambda self, *a: runs.append(self.spec.kind) or original(self, *a))
    rng = np.random.default_rng(3)
    pos, x = rng.random((80, 2)), rng.random((80, 1))

    def loss(p, x):
        g = tg.Graph.radius(p, 0.2)
        return tg.math.sum(DistanceSum()(graph=g, src={"x": x}))

    value, _ = tg.value_and_grad(loss)(pos, x)
    dist = pair_distances(pos, pos)
    w = dense_weights(radius_rows(pos, 0.2), 80, lambda i, j: np.exp(-dist[i, j]))
    np.testing.assert_allclose(float(np.asarray(value)), float((w @ x).sum()), rtol=1e-12)
    assert "radius" in runs


class SoftmaxAttention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        return self.reducer(-edge.distance * dst.t, src.v)


@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min", "prod", "softmax"])
@pytest.mark.parametrize("kind", ["radius", "knn", "radius_bounded"])
@pytest.mark.parametrize("d", [2, 8])
def test_every_reducer_matches_the_reference_path(reducer, kind, d):
    """The fused kernel (no edge list) against the reference interpreter on the resolved CSR."""
    rng = np.random.default_rng(len(reducer) + d)
    pos = rng.random((90, d))
    cutoff = 0.3 if d == 2 else 0.9
    make = {"radius": lambda: tg.Graph.radius(pos, cutoff),
            "knn": lambda: tg.Graph.knn(pos, 6),
            "radius_bounded": lambda: tg.Graph.radius(pos, cutoff, max_neighbors=4)}[kind]
    v, t = rng.random((90, 3)), rng.random(90) + 0.5
    if reducer == "softmax":
        model = SoftmaxAttention()
        kw = {"src": {"v": v}, "dst": {"t": t}}
    else:
        class Model(tg.MessagePassing):
            pass
        Model.reducer = getattr(tg, reducer)()
        Model.edge = lambda self, src, dst, edge: src.v * (1.5 - edge.distance)
        model = Model()
        kw = {"src": {"v": v}}
    g = make()
    got = np.asarray(model(graph=g, **kw))
    assert g._csr is None and "no edge list" in str(model.explain(graph=g, **kw))
    want = np.asarray(model.reference(graph=make(), **kw))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
