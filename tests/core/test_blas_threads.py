"""numpy's OpenBLAS thread count around Tiga's own products: one thread for small products,
the caller's setting restored afterwards (core/blas_threads.py, dot_general's impl rule)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tiga.core import blas_threads
from tiga.core.primitive import impl_rules
from tiga.core.prims.linalg import dot_general_p

FOUND = blas_threads._openblas()
needs_openblas = pytest.mark.skipif(not FOUND, reason="numpy is not linked to a loaded OpenBLAS")


def counts():
    return [get() for get, _ in FOUND]


@pytest.fixture
def two_threads():
    before = counts()
    for _, put in FOUND:
        put(2)
    yield
    for (_, put), n in zip(FOUND, before):
        put(n)


def observed_during(monkeypatch, fn):
    """The OpenBLAS thread counts while numpy's tensordot/einsum runs inside fn()."""
    seen = []
    for name in ("tensordot", "einsum"):
        real = getattr(np, name)

        def spy(*a, _real=real, **k):
            seen.append(counts())
            return _real(*a, **k)
        monkeypatch.setattr(np, name, spy)
    out = fn()
    monkeypatch.undo()
    return seen, out


@needs_openblas
def test_small_product_runs_on_one_thread_and_restores(monkeypatch, two_threads):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((500, 11)), rng.standard_normal((11, 32))
    rule = impl_rules[dot_general_p]
    seen, out = observed_during(
        monkeypatch, lambda: rule(x, w, dimension_numbers=(((1,), (0,)), ((), ())))[0])
    assert seen and all(c == [1] * len(FOUND) for c in seen)
    assert counts() == [2] * len(FOUND)
    np.testing.assert_allclose(out, x @ w, rtol=1e-12)


@needs_openblas
def test_batched_small_product_restores(monkeypatch, two_threads):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 6, 5)), rng.standard_normal((4, 5, 3))
    rule = impl_rules[dot_general_p]
    seen, out = observed_during(
        monkeypatch, lambda: rule(x, y, dimension_numbers=(((2,), (1,)), ((0,), (0,))))[0])
    assert seen and all(c == [1] * len(FOUND) for c in seen)
    assert counts() == [2] * len(FOUND)
    np.testing.assert_allclose(out, np.matmul(x, y), rtol=1e-12)


@needs_openblas
def test_large_product_keeps_the_callers_threads(two_threads):
    with blas_threads.one_blas_thread(blas_threads.ONE_THREAD_BELOW):
        assert counts() == [2] * len(FOUND)
    assert counts() == [2] * len(FOUND)


@needs_openblas
def test_nested_and_concurrent_uses_restore_once(two_threads):
    inside = threading.Barrier(3)

    def hold():
        with blas_threads.one_blas_thread(10):
            inside.wait()       # all three inside at once
            inside.wait()       # until every one has checked the count
    helpers = [threading.Thread(target=hold) for _ in range(2)]
    for t in helpers:
        t.start()
    with blas_threads.one_blas_thread(10):
        with blas_threads.one_blas_thread(10):
            inside.wait()
            assert counts() == [1] * len(FOUND)
            inside.wait()
    for t in helpers:
        t.join()
    assert counts() == [2] * len(FOUND)


@needs_openblas
def test_an_exception_restores(two_threads):
    with pytest.raises(ValueError):
        with blas_threads.one_blas_thread(10):
            raise ValueError("inside")
    assert counts() == [2] * len(FOUND)


def test_callers_single_thread_setting_is_left_alone():
    before = counts()
    with blas_threads.one_blas_thread(10):
        pass
    assert counts() == before


@needs_openblas
def test_the_thread_local_count_applies_to_the_calling_thread_only():
    local = blas_threads.thread_local_setter()
    if local is None:
        pytest.skip("this OpenBLAS has no openblas_set_num_threads_local")
    get, put = FOUND[0]
    saved = get()
    put(2)
    try:
        seen = {}
        worker = threading.Thread(target=lambda: seen.update(n=(local(1), get(), local(2))))
        worker.start()
        worker.join()
        assert seen["n"][1] == 1      # the worker thread saw its own count
        assert get() == 2             # ... and this thread's count never changed
    finally:
        put(saved)
