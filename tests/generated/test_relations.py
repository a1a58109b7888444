"""radius / knn relations: edge sets against the brute-force oracle, validation, explain."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from .oracle import csr_rows, knn_rows, point_sets, radius_rows, truncated

KINDS = ["uniform", "clustered", "duplicated", "grid"]


def _same_rows(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"row {i}: {g} != {w}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("loop", [False, True])
def test_radius_edges_match_oracle(kind, d, loop):
    rng = np.random.default_rng(d * 7 + len(kind))
    pos = point_sets(rng, kind, 150, d)
    cutoff = 0.125 if kind == "grid" else 0.2   # grid: many pairs sit exactly at the cutoff
    g = tg.Graph.radius(pos, cutoff, loop=loop)
    _same_rows(csr_rows(g), radius_rows(pos, cutoff, loop=loop))
    assert g.kind == "radius" and g.num_edges == sum(len(r) for r in csr_rows(g))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [1, 2, 3, 6])
def test_knn_edges_match_oracle_with_ties(kind, d):
    rng = np.random.default_rng(d + len(kind))
    pos = point_sets(rng, kind, 120, d)
    g = tg.Graph.knn(pos, 6)
    _same_rows(csr_rows(g), knn_rows(pos, 6))
    assert g.num_edges == 120 * 6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_query_differs_from_positions(dtype):
    rng = np.random.default_rng(3)
    pos = point_sets(rng, "clustered", 200, 3, dtype)
    query = (rng.random((70, 3)) * 1.4 - 0.2).astype(dtype)  # some far outside the sources
    g = tg.Graph.radius(pos, 0.15, query=query)
    _same_rows(csr_rows(g), radius_rows(pos, 0.15, query=query))
    assert (g.num_src, g.num_dst) == (200, 70)
    gk = tg.Graph.knn(pos, 5, query=query)
    _same_rows(csr_rows(gk), knn_rows(pos, 5, query=query))


def test_empty_neighbourhoods():
    pos = point_sets(np.random.default_rng(0), "uniform", 80, 2)
    g = tg.Graph.radius(pos, 1e-9)
    assert g.resolve_csr()[0][-1] == 0
    assert g.num_edges == 0


@pytest.mark.parametrize("kind", ["uniform", "grid", "duplicated"])
def test_max_neighbors_keeps_nearest_and_counts_truncation(kind):
    pos = point_sets(np.random.default_rng(5), kind, 160, 2)
    g = tg.Graph.radius(pos, 0.3, max_neighbors=4)
    _same_rows(csr_rows(g), radius_rows(pos, 0.3, max_neighbors=4))
    assert g.truncated_rows == truncated(pos, 0.3, 4)
    assert g.truncated_rows > 0


@pytest.mark.parametrize("call, arg", [
    (lambda p: tg.Graph.radius(p, 0.0), "cutoff"),
    (lambda p: tg.Graph.radius(p, -1.0), "cutoff"),
    (lambda p: tg.Graph.radius(p, float("nan")), "cutoff"),
    (lambda p: tg.Graph.radius(p, -float("inf")), "cutoff"),    # (+inf: every pair)
    (lambda p: tg.Graph.radius(p, "x"), "cutoff"),
    (lambda p: tg.Graph.knn(p, 0), "k"),
    (lambda p: tg.Graph.knn(p, 10), "k"),             # 10 points, no self: 9 candidates
    (lambda p: tg.Graph.knn(p, 2.5), "k"),
    (lambda p: tg.Graph.knn(p, 3, query=p[:, :2]), "query"),
    (lambda p: tg.Graph.radius(p[:, 0], 0.1), "positions"),
    (lambda p: tg.Graph.radius(np.zeros((4, 0)), 0.1), "positions"),   # no coordinate dims
    (lambda p: tg.Graph.radius(p.astype(np.float32), 0.1, query=p), "query"),
    (lambda p: tg.Graph.radius(p, 0.1, max_neighbors=0), "max_neighbors"),
    (lambda p: tg.Graph.radius(p, 0.1, loop="yes"), "loop"),
])
def test_bad_input_names_the_argument(call, arg):
    pos = np.random.default_rng(0).random((10, 3))
    with pytest.raises(tg.GraphValidationError, match=rf"^{arg}:"):
        call(pos)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_coordinates_are_refused(bad):
    pos = np.random.default_rng(0).random((10, 3))
    pos[4, 1] = bad
    with pytest.raises(tg.GraphValidationError, match=r"^positions: entry \[4, 1\]"):
        tg.Graph.radius(pos, 0.1)
    with pytest.raises(tg.GraphValidationError, match=r"^query: entry \[4, 1\]"):
        tg.Graph.knn(np.zeros((5, 3)), 2, query=pos)


def test_k_equal_to_candidates_is_allowed():
    pos = np.random.default_rng(0).random((10, 2))
    g = tg.Graph.knn(pos, 9)
    _same_rows(csr_rows(g), knn_rows(pos, 9))
    g = tg.Graph.knn(pos, 10, loop=True)
    _same_rows(csr_rows(g), knn_rows(pos, 10, loop=True))


def test_stencil_matches_explicit_csr():
    shape, offsets = (5, 4, 3), [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, -1), (0, 0, 2)]
    g = tg.Graph.stencil(shape, offsets)
    rows, cols = [0], []
    for p in np.ndindex(*shape):
        for off in offsets:
            q = tuple(a + o for a, o in zip(p, off))
            if all(0 <= a < n for a, n in zip(q, shape)):
                cols.append(int(np.ravel_multi_index(q, shape)))
        rows.append(len(cols))
    explicit = tg.Graph.from_csr(np.array(rows), np.array(cols), num_src=g.num_src)
    rp, ci = g.resolve_csr()
    assert np.array_equal(rp, rows) and np.array_equal(ci, cols)
    x = np.random.default_rng(1).random((g.num_src, 3))

    def fn(s, d, e):
        return s.x * 2.0

    got = np.asarray(tg.propagate(g, fn, tg.sum(), src={"x": x}))
    want = np.asarray(tg.propagate(explicit, fn, tg.sum(), src={"x": x}))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_traced_knn_checks_k_when_tracing():
    pos = np.random.default_rng(0).random((12, 2))

    def f(p):
        g = tg.Graph.knn(p, 12)       # 11 candidates without self loops
        return tg.math.sum(tg.propagate(g, lambda s, d, e: e.distance, tg.sum()))

    with pytest.raises(tg.GraphValidationError, match=r"^k: is 12"):
        tg.grad(f)(pos)


def test_tensor_positions_are_accepted():
    pos = np.random.default_rng(1).random((40, 3))
    g = tg.Graph.radius(tg.asarray(pos), 0.3)
    _same_rows(csr_rows(g), radius_rows(pos, 0.3))
