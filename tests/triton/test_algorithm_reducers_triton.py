"""argmin/argmax and `empty=` on the Triton route (triton-interpreter, strict) against the
per-row loop oracle of tests/core/test_algorithm_reducers.py: random relations with empty
rows, duplicates, NaN/inf and ties; a destination hub above the split degree (chunks merged
in order); radius(cutoff=inf) and tg.edge_map through the generated-relation kernels."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tiga as tg

_SPEC = importlib.util.spec_from_file_location(
    "algorithm_reducers_oracle", Path(__file__).parents[1] / "core" / "test_algorithm_reducers.py")
core = sys.modules.setdefault(_SPEC.name, importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(core)


def _run_triton(mp, **kw):
    old = tg.config._backend, tg.config.strict
    tg.config.backend, tg.config.strict = "triton-interpreter", True
    try:
        return np.asarray(mp(**kw))
    finally:
        tg.config._backend, tg.config.strict = old


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(core.relations(), st.sampled_from(sorted(core.REDUCERS)), st.sampled_from([(), (3,)]),
       st.integers(0, 2 ** 31))
def test_triton_matches_the_loop_oracle(rel, key, feat, seed):
    rng = np.random.default_rng(seed)
    x = rng.choice(core.VALUES, (rel.num_src,) + feat)
    w = rng.choice((0.0, 0.0, 1.0, math.nan), (len(rel.edges),) + feat)
    want = core.oracle(rel, key, x, w)
    got = _run_triton(core.layer(core.REDUCERS[key]()), graph=rel.graph, src={"x": x},
                      edge={"w": w})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want, err_msg=key)


@pytest.mark.parametrize("key", ["argmin", "argmax_edge", "min_inf", "prod_7"])
def test_split_rows_merge_in_order(key):
    """A hub of 300 edges (split into chunks) with many ties: the merged winner is the
    smallest id, as in one fold."""
    rng = np.random.default_rng(5)
    src = np.concatenate([rng.integers(0, 12, 300), rng.integers(0, 12, 40)])
    dst = np.concatenate([np.zeros(300, np.int64), rng.integers(1, 30, 40)])
    perm = rng.permutation(len(src))
    edges = list(zip(src[perm].tolist(), dst[perm].tolist()))
    g = tg.Graph.from_coo(src[perm], dst[perm], num_src=12, num_dst=31)
    rel = core.Rel(g, 12, 31, edges)
    x = rng.choice([-1.0, 0.0, 2.0, 1.0], (12, 2)) if key != "prod_7" else \
        rng.choice([1.0, -1.0], (12, 2))
    w = np.zeros((len(edges), 2))
    want = core.oracle(rel, key, x, w)
    got = _run_triton(core.layer(core.REDUCERS[key]()), graph=g, src={"x": x}, edge={"w": w})
    np.testing.assert_array_equal(got, want)


def test_radius_inf_and_edge_map_on_triton():
    rng = np.random.default_rng(6)
    pos = rng.uniform(-1, 1, (20, 3))
    g = tg.Graph.radius(pos, math.inf)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)

    class Nearest(tg.MessagePassing):
        reducer = tg.argmin()

        def edge(self, src, dst, edge):
            return edge.distance

    old = tg.config._backend, tg.config.strict
    tg.config.backend, tg.config.strict = "triton-interpreter", True
    try:
        nearest = np.asarray(Nearest()(graph=g))
        dist = np.asarray(tg.edge_map(g, lambda s, d, e: e.distance))
    finally:
        tg.config._backend, tg.config.strict = old
    row_ptr, col_idx = g.resolve_csr()
    np.testing.assert_allclose(dist, d[np.repeat(np.arange(20), np.diff(row_ptr)), col_idx],
                               rtol=1e-14)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_array_equal(nearest, d.argmin(axis=1))
