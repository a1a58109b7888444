"""The warm call's memos (issue 11) keep every check a cold call makes: operand dtypes and
names, device routing, TIGA_NUM_THREADS, the route of each relation and the executable
cache are all exercised after the same call signature has run warm. Oracle: the reference
interpreter (`.reference`)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg
from tiga.lower.backends import BACKENDS
from tiga.xla_free_runtime.caches import executables as cache_mod

N = 7


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def _inputs(seed: int, n: int = N, degree: int = 3):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, n * degree)
    dst = rng.integers(0, n, n * degree)
    return src, dst, rng.standard_normal((n, 2)), rng.standard_normal(n * degree)


def _warm(m, g, x, w, times: int = 3):
    for _ in range(times):
        m(graph=g, src={"x": x}, edge={"w": w})


class FakeCuda:
    """A DLPack producer that says it lives on cuda:0; reading it fails the test."""

    def __init__(self, data):
        self.data = np.asarray(data)
        self.dtype, self.shape = self.data.dtype, self.data.shape

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        raise AssertionError("CUDA data must not be read on the host")


def test_warm_signature_still_checks_operands():
    src, dst, x, w = _inputs(0)
    g, m = tg.Graph.from_coo(src, dst, num_src=N, num_dst=N), WeightedSum()
    _warm(m, g, x, w)
    with pytest.raises(tg.DTypeError, match=r"src\.x: dtype complex128 is not supported"):
        m(graph=g, src={"x": x.astype(np.complex128)}, edge={"w": w})
    with pytest.raises(tg.DTypeError, match=r"edge\.w: dtype <U3 is not supported"):
        m(graph=g, src={"x": x}, edge={"w": np.array(["abc"] * len(w))})
    with pytest.raises(tg.TigaError, match="src: field names must be identifiers"):
        m(graph=g, src={"not a name": x}, edge={"w": w})
    with pytest.raises(tg.ShapeError, match=r"src\.x: src fields need a leading axis of 7"):
        m(graph=g, src={"x": x[:-1]}, edge={"w": w})
    np.testing.assert_allclose(m(graph=g, src={"x": x}, edge={"w": w}),
                               m.reference(graph=g, src={"x": x}, edge={"w": w}),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(BACKENDS["triton"].available()[0], reason="a usable GPU runs CUDA inputs")
def test_warm_numpy_signature_still_routes_cuda_inputs():
    src, dst, x, w = _inputs(1)
    g, m = tg.Graph.from_coo(src, dst, num_src=N, num_dst=N), WeightedSum()
    _warm(m, g, x, w)
    with pytest.raises(tg.UnsupportedError, match=r"src\.x: lives on cuda:0"):
        m(graph=g, src={"x": FakeCuda(x)}, edge={"w": w})
    with pytest.raises(tg.UnsupportedError, match=r"edge\.w: lives on cuda:0"):
        tg.propagate(g, lambda s, d, e: s.x * e.w, tg.sum(), src={"x": x},
                     edge={"w": FakeCuda(w)})


def test_thread_count_is_read_on_every_call(monkeypatch):
    src, dst, x, w = _inputs(2, n=64, degree=600)   # enough work for several row chunks
    g, m = tg.Graph.from_coo(src, dst, num_src=64, num_dst=64), WeightedSum()
    want = m.reference(graph=g, src={"x": x}, edge={"w": w})
    for value in ("2", "1", "3"):
        monkeypatch.setenv("TIGA_NUM_THREADS", value)
        _warm(m, g, x, w, times=2)
        np.testing.assert_allclose(m(graph=g, src={"x": x}, edge={"w": w}), want,
                                   rtol=1e-10, atol=1e-10)
    monkeypatch.setenv("TIGA_NUM_THREADS", "zero")
    for _ in range(2):   # a bad value raises each time (never remembered as valid)
        with pytest.raises(tg.TigaError, match="TIGA_NUM_THREADS must be a positive integer, "
                                               "found 'zero'"):
            m(graph=g, src={"x": x}, edge={"w": w})


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_route_is_per_relation(seed):
    """One call signature over relations of the same kind and sizes but other layouts (a
    COO relation keeps an edge permutation, a CSR one does not): every call runs the
    kernel of its own relation, alternating."""
    src, dst, x, w = _inputs(seed)
    coo = tg.Graph.from_coo(src, dst, num_src=N, num_dst=N)
    order = np.argsort(dst, kind="stable")
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))])
    csr = tg.Graph.from_csr(row_ptr, src[order], num_src=N)
    m = WeightedSum()
    for g, ew in [(coo, w), (csr, w[order])] * 2:
        np.testing.assert_allclose(m(graph=g, src={"x": x}, edge={"w": ew}),
                                   m.reference(graph=g, src={"x": x}, edge={"w": ew}),
                                   rtol=1e-12, atol=1e-12)


def test_cleared_cache_is_not_bypassed(tmp_path, monkeypatch):
    """A warm call's remembered kernel is used only while the cache holds it: after
    clear_memory the next call reloads it from disk, and warm calls count memory hits."""
    monkeypatch.setenv("TIGA_CACHE_DIR", str(tmp_path))
    cache = cache_mod.CACHE
    cache.clear_memory()
    cache.reset_stats()
    try:
        src, dst, x, w = _inputs(3)
        g, m = tg.Graph.from_coo(src, dst, num_src=N, num_dst=N), WeightedSum()
        want = m.reference(graph=g, src={"x": x}, edge={"w": w})
        _warm(m, g, x, w, times=4)
        assert cache.stats.misses == 1 and cache.stats.memory_hits >= 3
        cache.clear_memory()
        np.testing.assert_allclose(m(graph=g, src={"x": x}, edge={"w": w}), want,
                                   rtol=1e-12, atol=1e-12)
        assert cache.stats.disk_hits == 1 and cache.stats.misses == 1
    finally:
        cache.clear_memory()


def test_thread_count_pin_ends_with_a_failing_call(monkeypatch):
    """execute reads TIGA_NUM_THREADS once per call; a call that raises inside it must not
    leave that value pinned for the calls after it."""
    from tiga.trace.message_passing import PropagateCall
    from tiga.xla_free_runtime.executor import execute

    src, dst, x, w = _inputs(4)
    g = tg.Graph.from_coo(src, dst, num_src=N, num_dst=N)
    call = PropagateCall(g, lambda s, d, e: s.x * e.w, tg.sum(), {"x": x}, {}, {"w": w},
                         None, {})
    program, args = call.staged_program()
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    execute(program, args)
    with pytest.raises(tg.ShapeError, match="expected shape"):
        execute(program, [args[0], args[1][:, :1], args[2]])
    monkeypatch.setenv("TIGA_NUM_THREADS", "zero")
    with pytest.raises(tg.TigaError, match="TIGA_NUM_THREADS must be a positive integer"):
        execute(program, args)
