"""The cell walks' vector candidate test (compress store or branch-free stores) and the kNN
rank selection (or the insertions past RANK_MAX candidates) against the brute-force oracle:
the same neighbours, in both coordinate dtypes, both vector widths."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.lower import schedule
from tiga.lower.llvm import generated
from tiga.lower.llvm.geo_vector import RANK_MAX
from tiga.xla_free_runtime.caches.executables import CACHE

from .oracle import dense_weights, knn_rows, pair_distances, point_sets, radius_rows


@pytest.fixture(params=[True, False], ids=["wide", "narrow"])
def lanes(request, monkeypatch, tmp_path):
    """Kernels rendered for 512-bit (AVX-512 hosts only) or 256-bit candidate vectors."""
    if request.param and not schedule.host_wide_vectors():
        pytest.skip("the host has no 512-bit vectors")
    monkeypatch.setattr(generated, "geo_lanes_wide", lambda: request.param)
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    CACHE.clear_memory()
    yield request.param
    CACHE.clear_memory()


def _check(kind, pos, x, query=None, **kw):
    q = pos if query is None else query
    edge = lambda src, dst, e: src.x * tg.math.exp(-e.distance)  # noqa: E731
    if kind == "knn":
        g = tg.Graph.knn(pos, kw["k"], query=query, loop=kw.get("loop", False))
        rows = knn_rows(pos, kw["k"], query, kw.get("loop", False))
    else:
        g = tg.Graph.radius(pos, kw["cutoff"], query=query, loop=kw.get("loop", False))
        rows = radius_rows(pos, kw["cutoff"], query, kw.get("loop", False))
    y = np.asarray(tg.propagate(g, edge, tg.sum(), src={"x": x}))
    dist = pair_distances(pos, q)
    w = dense_weights(rows, len(pos), lambda i, j: np.exp(-float(dist[i, j])))
    tol = 1e-5 if pos.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, w @ x, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("points", ["uniform", "clustered", "duplicated"])
@pytest.mark.parametrize("case", [("radius", {"cutoff": 0.15}),
                                  ("radius", {"cutoff": 0.15, "loop": True}),
                                  ("knn", {"k": 7}), ("knn", {"k": 5, "loop": True})])
def test_vector_walk_matches_oracle(lanes, dtype, points, case):
    kind, kw = case
    rng = np.random.default_rng(3)
    pos = point_sets(rng, points, 300, 3, dtype)
    _check(kind, pos, rng.random(300), **kw)
    if kind == "knn" and not kw.get("loop"):
        _check(kind, pos, rng.random(300), query=point_sets(rng, "uniform", 50, 3, dtype), **kw)


@pytest.mark.parametrize("copies", [RANK_MAX // 2, RANK_MAX + 1, 600])
def test_knn_many_candidates_per_row(lanes, copies):
    """Rows whose prefilter holds <= RANK_MAX candidates (ranked), more (inserted), and more
    than the candidate buffer (flushed mid-row into insertions): ties by smaller index."""
    rng = np.random.default_rng(copies)
    base = rng.random((40, 3))
    pos = np.concatenate([np.repeat(base[:2], copies, axis=0), base[2:]])
    _check("knn", pos, rng.random(len(pos)), k=9)
    _check("radius", pos, rng.random(len(pos)), cutoff=0.05)
