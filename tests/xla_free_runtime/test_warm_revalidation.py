"""A layer's warm call (trace/warm_calls.py: straight to the prepared launch list) re-checks
everything the full path decides from: each test runs a signature warm (the memo is taken:
the call cache's staging is not reached), then changes one thing between calls (the
relation object, TIGA_NUM_THREADS, a layer attribute or module global the
edge function reads, the class's edge method, a field's dtype, a keyword operand's value,
the call cache) and checks the answer against numpy and that the change was seen (the full
path ran, or the runtime prepared the new setting). TIGA_BACKEND: tests/triton/
test_warm_backend_switch.py. Oracle: numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.trace import call_cache, warm_calls
from tiga.xla_free_runtime.caches import programs as program_cache

N, E = 40, 160
GAIN = 1.0


class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self, scale: float = 2.0):
        self.scale = scale

    def edge(self, src, dst, edge, alpha=1.0):
        return src.x * edge.w * (self.scale * GAIN * alpha)


def _relation(seed: int):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, N, E), rng.integers(0, N, E)
    return tg.Graph.from_coo(s, d, num_src=N, num_dst=N), s, d


def _fields(seed: int, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, 3)).astype(dtype), rng.standard_normal((E, 1)).astype(dtype)


def _want(s, d, x, w, factor: float) -> np.ndarray:
    out = np.zeros((N, x.shape[1]))
    np.add.at(out, d, x[s].astype(np.float64) * w.astype(np.float64) * factor)
    return out


class _Staging:
    """Counts the calls that reached the call cache's staging (the full path)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = call_cache.staged_program

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)
        monkeypatch.setattr(call_cache, "staged_program", counted)


def _check(layer, g, s, d, x, w, factor, **params):
    got = np.asarray(layer(graph=g, src={"x": x}, edge={"w": w}, **params))
    tol = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, _want(s, d, x, w, factor), rtol=tol, atol=tol)


def _warm(layer, g, s, d, x, w, factor, staging, **params):
    """Two calls take the memo; a third must not reach the staging."""
    _check(layer, g, s, d, x, w, factor, **params)
    _check(layer, g, s, d, x, w, factor, **params)
    before = staging.calls
    _check(layer, g, s, d, x, w, factor, **params)
    assert staging.calls == before, "the warm call did not take the layer's memo"


def test_a_warm_call_skips_staging_and_sees_new_values(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(), _relation(0)
    x, w = _fields(1)
    _warm(layer, g, s, d, x, w, 2.0, staging)
    hits = call_cache.STATS["hits"]
    x2, w2 = _fields(2)                       # new values, same types: still warm
    _check(layer, g, s, d, x2, w2, 2.0)
    assert call_cache.STATS["hits"] == hits + 1
    assert staging.calls == 1                 # only the first call was staged


def test_how_the_roles_are_given(monkeypatch):
    from types import MappingProxyType
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(), _relation(18)
    x, w = _fields(19)
    _warm(layer, g, s, d, x, w, 2.0, staging)
    got = np.asarray(layer(graph=g, src={"x": x}, dst={}, edge={"w": w}))   # {} as None
    np.testing.assert_allclose(got, _want(s, d, x, w, 2.0), rtol=1e-12, atol=1e-12)
    got = np.asarray(layer(graph=g, src=MappingProxyType({"x": x}), edge={"w": w}))
    np.testing.assert_allclose(got, _want(s, d, x, w, 2.0), rtol=1e-12, atol=1e-12)
    for more in (dict(src={"x": x, "y": x}, edge={"w": w}),      # an unread field
                 dict(src={"x": x}, dst={"h": x}, edge={"w": w})):   # an unread role
        got = np.asarray(layer(graph=g, **more))
        np.testing.assert_allclose(got, _want(s, d, x, w, 2.0), rtol=1e-12, atol=1e-12)
    with pytest.raises(tg.FieldError, match="edge.w"):               # a field it reads gone
        layer(graph=g, src={"x": x})
    _check(layer, g, s, d, x, w, 2.0)


def test_another_relation_object_misses_the_memo(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g1, s1, d1), (g2, s2, d2) = Scaled(), _relation(3), _relation(4)
    x, w = _fields(5)
    _warm(layer, g1, s1, d1, x, w, 2.0, staging)
    before = staging.calls
    for _ in range(2):     # alternating relations of the same sizes: each its own edges
        _check(layer, g2, s2, d2, x, w, 2.0)
        _check(layer, g1, s1, d1, x, w, 2.0)
    assert staging.calls > before


def test_thread_count_change_between_warm_calls(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(), _relation(6)
    x, w = _fields(7)
    monkeypatch.setenv("TIGA_NUM_THREADS", "1")
    _warm(layer, g, s, d, x, w, 2.0, staging)
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    before = staging.calls
    _check(layer, g, s, d, x, w, 2.0)
    assert staging.calls == before + 1        # the prepared list was for one thread
    _check(layer, g, s, d, x, w, 2.0)
    prepared = [p for _, preps in program_cache.entries("prepared") for p in preps]
    assert any(p.threads == 2 for p in prepared)
    monkeypatch.setenv("TIGA_NUM_THREADS", "0")     # a bad value still raises warm
    with pytest.raises(tg.TigaError, match="TIGA_NUM_THREADS"):
        layer(graph=g, src={"x": x}, edge={"w": w})


def test_layer_attribute_global_and_method_changes_retrace(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(2.0), _relation(10)
    x, w = _fields(11)
    _warm(layer, g, s, d, x, w, 2.0, staging)

    def doubled(self, src, dst, edge, alpha=1.0):
        return src.x * edge.w * (2.0 * self.scale * GAIN * alpha)

    changes = [(lambda: setattr(layer, "scale", 3.0), 3.0),     # an attribute it reads
               (lambda: monkeypatch.setitem(globals(), "GAIN", 0.5), 1.5),   # a global
               (lambda: setattr(layer, "note", "unread"), 1.5),   # any attribute: the key's
               (lambda: monkeypatch.setattr(Scaled, "edge", doubled), 3.0)]   # the method
    for change, factor in changes:
        change()
        before = staging.calls
        _check(layer, g, s, d, x, w, factor)
        assert staging.calls == before + 1, "a change the call cache keys on kept the memo"
        _check(layer, g, s, d, x, w, factor)
        assert staging.calls == before + 1, "the new signature was not remembered"


def test_dtype_operand_and_cache_changes(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(), _relation(12)
    x, w = _fields(13)
    _warm(layer, g, s, d, x, w, 0.5, staging, alpha=0.25)
    _check(layer, g, s, d, x, w, 1.0, alpha=0.5)           # a new keyword value
    _check(layer, g, s, d, x.astype(np.float32), w.astype(np.float32), 1.0, alpha=0.5)
    _check(layer, g, s, d, x, w, 2.0, alpha=1)              # an int operand: its own type
    misses = call_cache.STATS["misses"]
    call_cache.clear()
    _check(layer, g, s, d, x, w, 2.0, alpha=1)
    assert call_cache.STATS["misses"] == misses + 1         # cleared: traced again
    with pytest.raises(tg.ShapeError):
        layer(graph=g, src={"x": x[:-1]}, edge={"w": w})
    with pytest.raises(tg.TigaError, match="egde"):
        layer(graph=g, src={"x": x}, edge={"w": w}, egde=1.0)


def test_strict_mode_and_profile_take_the_full_path(monkeypatch):
    staging = _Staging(monkeypatch)
    layer, (g, s, d) = Scaled(), _relation(14)
    x, w = _fields(15)
    _warm(layer, g, s, d, x, w, 2.0, staging)
    with tg.profile() as prof:
        _check(layer, g, s, d, x, w, 2.0)
    assert prof.calls, "a warm call inside tg.profile() made no run report"
    monkeypatch.setattr(tg.config, "strict", True)
    before = staging.calls
    _check(layer, g, s, d, x, w, 2.0)
    assert staging.calls == before + 1


def test_the_memo_dies_with_its_layer():
    layer, (g, s, d) = Scaled(), _relation(16)
    x, w = _fields(17)
    for _ in range(2):
        _check(layer, g, s, d, x, w, 2.0)
    key = id(layer)
    assert key in warm_calls._MEMOS
    del layer
    assert key not in warm_calls._MEMOS
