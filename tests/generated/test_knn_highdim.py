"""kNN in any number of coordinate dims (issue 14) and non-finite distances (issue 13).

Above 3 dims the compiled route walks knn-tiled-scan (a register-blocked product, a proven
filter and an exact re-check); it must give the reference interpreter's neighbours exactly,
in the same order (ties by smaller source index). Oracles: a brute-force Python sort of
distances computed pair by pair (tests/generated/oracle.py), scipy's cKDTree in float64, and
float64 finite differences for gradients.
"""
from __future__ import annotations

import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial import cKDTree

import tiga as tg

from .oracle import knn_rows, pair_distances

BASE = 1024.0   # ids < 1024 and k <= 5: the ordered ids fit a float64 exactly


def _seq_combine(a, b):
    return a * BASE + b


SEQ = tg.Reducer("seq", 0.0, _seq_combine, commutative=False, associative=False)


class Order(tg.MessagePassing):
    """Folds source ids (+1) in edge order: the result encodes each row's ordered list."""

    reducer = SEQ

    def edge(self, src, dst, edge):
        return src.id


def _decode(values: np.ndarray, k: int) -> np.ndarray:
    v = np.rint(np.asarray(values, np.float64)).astype(np.int64)
    out = np.empty((len(v), k), np.int64)
    for j in range(k - 1, -1, -1):
        out[:, j] = v % int(BASE) - 1
        v //= int(BASE)
    return out


@pytest.fixture
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


def _compiled_rows(pos, k, query=None, loop=False) -> np.ndarray:
    g = tg.Graph.knn(pos, k, query=query, loop=loop)
    ids = np.arange(1.0, len(pos) + 1.0)
    return _decode(Order()(graph=g, src={"id": ids}), k)


def _reference_rows(pos, k, query=None, loop=False) -> np.ndarray:
    row_ptr, col = tg.Graph.knn(pos, k, query=query, loop=loop).resolve_csr()
    return np.asarray(col).reshape(-1, k)


def _check_kdtree(pos, rows, k, query, loop, rtol):
    """Our k-th distances (recomputed in float64) equal cKDTree's: the set is optimal up to
    distance ties and the dtype's rounding."""
    q = (pos if query is None else query).astype(np.float64)
    p64 = pos.astype(np.float64)
    extra = 1 if query is None and not loop else 0
    want, idx = cKDTree(p64).query(q, k=k + extra)
    want = np.asarray(want).reshape(len(q), -1)
    if extra:   # drop each row's own point (always at distance 0 and listed first or tied)
        idx = np.asarray(idx).reshape(len(q), -1)
        keep = idx != np.arange(len(q))[:, None]
        keep[keep.sum(axis=1) > k, -1] = False
        want = want[keep].reshape(len(q), k)
    got = np.sort(np.linalg.norm(p64[rows] - q[:, None, :], axis=-1), axis=1)
    np.testing.assert_allclose(got, want[:, :k], rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 3, 9, 16, 64, 100])
@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("with_query", [False, True])
def test_knn_any_dims_matches_reference_and_oracles(d, loop, with_query, strict):
    rng = np.random.default_rng(d)
    pos = rng.standard_normal((137, d))
    query = rng.standard_normal((61, d)) if with_query else None
    k = 5
    got = _compiled_rows(pos, k, query, loop)
    ref = _reference_rows(pos, k, query, loop)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, np.stack(knn_rows(pos, k, query, loop)))
    _check_kdtree(pos, got, k, query, loop, rtol=1e-12)


@pytest.mark.parametrize("d", [9, 64])
def test_float32_any_dims(d, strict):
    rng = np.random.default_rng(7)
    pos = rng.standard_normal((203, d)).astype(np.float32)
    query = rng.standard_normal((40, d)).astype(np.float32)
    for q in (None, query):
        got = _compiled_rows(pos, 5, q)
        np.testing.assert_array_equal(got, _reference_rows(pos, 5, q))
        np.testing.assert_array_equal(got, np.stack(knn_rows(pos, 5, q)))
        _check_kdtree(pos, got, 5, q, False, rtol=1e-5)


@pytest.mark.parametrize("d", [9, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ties_and_duplicates_break_by_smaller_index(d, dtype, strict):
    """Small integer coordinates: every distance is exact in both dtypes, so ties are real
    ties and the oracle's (distance, index) order is unambiguous."""
    rng = np.random.default_rng(d)
    base = rng.integers(0, 2, (30, d))
    pos = base[rng.integers(0, 30, 120)].astype(dtype)     # many duplicate points
    for loop in (False, True):
        got = _compiled_rows(pos, 5, loop=loop)
        d2 = ((pos[:, None, :].astype(np.float64) - pos[None]) ** 2).sum(-1)
        if not loop:
            np.fill_diagonal(d2, np.inf)
        order = np.lexsort((np.broadcast_to(np.arange(120), d2.shape), d2), axis=1)
        want = order[:, :5]
        if not loop:   # the diagonal was pushed last by hand; it never reaches the first 5
            assert not (want == np.arange(120)[:, None]).any()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, _reference_rows(pos, 5, loop=loop))


@pytest.mark.parametrize("d", [2, 9, 64])
@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e200), (np.float32, 1e30)])
def test_overflowing_distances_never_list_oneself(d, dtype, scale, strict):
    """Issue 13: squared distances overflow to +inf; loop=False must still drop (i, i)
    (by index), and inf ties go to the smaller index in both routes."""
    rng = np.random.default_rng(d)
    pos = (rng.standard_normal((24, d)) * scale).astype(dtype)
    pos[5] = pos[11]
    for loop in (False, True):
        got = _compiled_rows(pos, 3, loop=loop)
        ref = _reference_rows(pos, 3, loop=loop)
        np.testing.assert_array_equal(got, ref)
        own = (got == np.arange(24)[:, None]).any(axis=1)
        assert not own.any() if not loop else own.all()
        with np.errstate(over="ignore"):
            d2 = pair_distances(pos, pos) ** 2
        assert np.isinf(d2).any()
        for i in range(24):
            keys = sorted((float(d2[i, j]), j) for j in range(24) if loop or j != i)
            assert got[i].tolist() == [j for _, j in keys[:3]]


def test_overflow_risk_takes_the_plain_exact_scan():
    pos = np.random.default_rng(0).standard_normal((20, 9)) * 1e200
    g = tg.Graph.knn(pos, 3)
    text = str(Order().explain(graph=g, src={"id": np.arange(1.0, 21.0)}))
    assert "plain exact scan" in text


def test_k_larger_than_the_candidates_is_an_error():
    pos = np.random.default_rng(0).random((10, 64))
    with pytest.raises(tg.GraphValidationError, match=r"k: is 10, expected 1 <= k <= 9"):
        tg.Graph.knn(pos, 10)
    with pytest.raises(tg.GraphValidationError, match=r"k: is 11, expected 1 <= k <= 10"):
        tg.Graph.knn(pos, 11, query=pos[:3])
    assert tg.Graph.knn(pos, 10, loop=True).num_edges == 100


@pytest.mark.parametrize("d, walk", [(3, "knn-shells"), (4, "knn-tiled-scan"),
                                     (64, "knn-tiled-scan")])
def test_explain_and_iter_ir_name_the_walk(d, walk):
    pos = np.random.default_rng(0).random((50, d))
    call = {"graph": tg.Graph.knn(pos, 4), "src": {"id": np.arange(1.0, 51.0)}}
    assert f'coordinate_hierarchy = "{walk}"' in Order().ir("iter", **call)
    ex = str(Order().explain(**call))
    assert walk in ex and "cpu-llvm" in ex


def test_many_tiles_and_chunks(monkeypatch, strict):
    """Row tiles and source chunks are run-time sizes: shrink them so one call crosses
    many of each (same executable), with tails in every dimension."""
    from tiga.lower import schedule
    from tiga.xla_free_runtime.caches import equations as equation_cache

    monkeypatch.setattr(schedule, "KNN_ROWS_PER_TILE", 7)     # the launch's schedule tiles
    monkeypatch.setattr(schedule, "KNN_CHUNK_BYTES", 1)
    monkeypatch.setattr(equation_cache, "_MEMOS", weakref.WeakKeyDictionary())  # lowered anew
    rng = np.random.default_rng(5)
    pos = rng.standard_normal((301, 17))
    query = rng.standard_normal((45, 17))
    for q in (None, query):
        np.testing.assert_array_equal(_compiled_rows(pos, 5, q), _reference_rows(pos, 5, q))


def test_fewer_sources_than_one_panel(strict):
    rng = np.random.default_rng(1)
    pos, query = rng.standard_normal((3, 12)), rng.standard_normal((9, 12))
    np.testing.assert_array_equal(_compiled_rows(pos, 3, query),
                                  _reference_rows(pos, 3, query))


def test_reference_tiles_bound_memory(monkeypatch):
    import tracemalloc

    from tiga.core import graph_generated as geo

    rng = np.random.default_rng(2)
    pos = rng.standard_normal((1500, 24))
    want = geo.knn_csr(pos, None, 4, False)[1]
    monkeypatch.setattr(geo, "TILE_ELEMENTS", 1 << 15)
    tracemalloc.start()
    got = geo.knn_csr(pos, None, 4, False)[1]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(got, want)
    assert peak < 1500 * 1500 * 8 // 4     # far below one N x N float64 array


class Field(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * tg.math.exp(-0.5 * edge.distance) + \
            (edge.displacement * src.w).sum(axis=-1, keepdims=True)


def _fd(f, arr, picks, eps=1e-6, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(picks):
        i = tuple(int(rng.integers(0, s)) for s in arr.shape)
        a, b = arr.copy(), arr.copy()
        a[i] += eps
        b[i] -= eps
        out.append((i, (f(a) - f(b)) / (2 * eps)))
    return out


@pytest.mark.parametrize("d", [9, 64])
def test_gradients_through_displacement_and_distance(d):
    rng = np.random.default_rng(d)
    pos, qry = rng.standard_normal((60, d)), rng.standard_normal((25, d))
    x, w = rng.standard_normal((60, 1)), rng.standard_normal((60, d))

    def loss(p, q, x):
        g = tg.Graph.knn(p, 4, query=q)
        return tg.math.sum(Field()(graph=g, src={"x": x, "w": w}) ** 2)

    def ref(p, q, x):
        g = tg.Graph.knn(p, 4, query=q)
        return float(np.sum(np.asarray(Field().reference(graph=g, src={"x": x, "w": w})) ** 2))

    gp, gq, gx = (np.asarray(v) for v in tg.grad(loss, argnums=(0, 1, 2))(pos, qry, x))
    for arr, grad, f in ((pos, gp, lambda a: ref(a, qry, x)), (qry, gq, lambda a: ref(pos, a, x)),
                         (x, gx, lambda a: ref(pos, qry, a))):
        for i, fd in _fd(f, arr, picks=6):
            assert grad[i] == pytest.approx(fd, rel=1e-5, abs=1e-6)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), d=st.sampled_from([4, 9, 33]), k=st.integers(1, 5),
       loop=st.booleans(), nq=st.integers(0, 12), f32=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_property_tiled_knn_equals_oracle(n, d, k, loop, nq, f32, seed):
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    pos = (np.round(rng.standard_normal((n, d)) * 2) / 2).astype(dtype)   # ties
    query = (np.round(rng.standard_normal((nq, d)) * 2) / 2).astype(dtype) if nq else None
    k = min(k, n - (1 if query is None and not loop else 0))
    if k < 1:
        return
    got = _compiled_rows(pos, k, query, loop)
    np.testing.assert_array_equal(got, np.stack(knn_rows(pos, k, query, loop)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset, spread", [(1e3, 1e-2), (1e5, 1e-2), (0.0, 1e-25)])
def test_filter_is_exact_under_cancellation_and_underflow(dtype, offset, spread, strict):
    """Far from the origin |p|^2 - 2 q.p cancels almost every digit (the filter must still
    admit every true neighbour); tiny coordinates underflow their squares."""
    rng = np.random.default_rng(11)
    pos = (offset + rng.standard_normal((180, 32)) * spread).astype(dtype)
    np.testing.assert_array_equal(_compiled_rows(pos, 5), _reference_rows(pos, 5))


def test_torch_route_selects_in_the_call_and_its_vjp_adopts_the_ids(monkeypatch):
    """A 16-D kNN through the torch bridge is not resolved in numpy first: the forward
    takes knn-tiled-scan and the backward reuses its ids; gradients equal a dense torch
    computation on the reference relation."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    pos = torch.tensor(rng.standard_normal((70, 16)), requires_grad=True)
    x = torch.tensor(rng.standard_normal((70, 2)), requires_grad=True)
    from tiga.core import graph_generated as geo

    reference_selection = geo.knn_csr
    monkeypatch.setattr(geo, "knn_csr", None)      # calling it would fail the test
    g = tg.Graph.knn(pos, 6)
    model = Field()
    y = model(graph=g, src={"x": x, "w": torch.ones(70, 16, dtype=torch.float64)})
    assert "knn-tiled-scan" in str(model.explain(
        graph=g, src={"x": x, "w": torch.ones(70, 16, dtype=torch.float64)}))
    gp, gx = torch.autograd.grad((y ** 2).sum(), (pos, x))
    monkeypatch.setattr(geo, "knn_csr", reference_selection)
    cols = torch.tensor(_reference_rows(pos.detach().numpy(), 6).reshape(-1))
    rows = torch.arange(70).repeat_interleave(6)
    disp = pos[cols] - pos[rows]
    msg = x[cols] * torch.exp(-0.5 * disp.norm(dim=-1, keepdim=True)) + \
        disp.sum(-1, keepdim=True)
    want = torch.zeros(70, 2, dtype=torch.float64).index_add(0, rows, msg)
    wp, wx = torch.autograd.grad((want ** 2).sum(), (pos, x))
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(gp, wp)
    torch.testing.assert_close(gx, wx)
