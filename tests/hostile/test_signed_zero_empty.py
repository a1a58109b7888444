"""`empty=-0.0` keeps its sign on every backend (issue 41): a row without edges gives -0.0 from
tg.min / tg.max / tg.prod on the reference interpreter, cpu-llvm and triton-interpreter alike.
Triton builds a literal zero of either sign as a null value, so the Triton renderer gave +0.0
there before (`np.signbit` false). A hub above the split degree takes the chunked path beside
the empty rows. tg.sum and tg.mean take no `empty=`: their empty rows are +0.0 everywhere (the
additive identity), which is checked too so that no backend drifts from the reference."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import tiga as tg

BACKENDS = ["reference", "cpu-llvm"] + (
    ["triton-interpreter"] if importlib.util.find_spec("triton") and
    importlib.util.find_spec("torch") else [])
EMPTY_ROWS = (1, 3, 5)


def _graph(hub: bool):
    # rows 0, 2, 4 have edges, rows 1, 3, 5 none; with `hub` row 0 has 300 (chunked on Triton)
    src, dst = [0, 1, 2, 3, 0], [0, 0, 2, 2, 4]
    if hub:
        src, dst = src + [i % 6 for i in range(300)], dst + [0] * 300
    return tg.Graph.from_coo(np.array(src), np.array(dst), num_src=6, num_dst=6)


def _run(backend, f, args, monkeypatch):
    if backend == "reference":
        (out,) = tg.eval_program(tg.make_program(f)(*args), *args)
        return np.asarray(out)
    if backend == "triton-interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tg.config, "_backend", backend)   # (restored to None: TIGA_BACKEND)
    monkeypatch.setattr(tg.config, "strict", True)        # no silent fallback to another route
    return np.asarray(f(*args))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("name", ["min", "max", "prod"])
@pytest.mark.parametrize("hub", [False, True])
@pytest.mark.parametrize("feat", [(), (3,)])
def test_empty_minus_zero_keeps_its_sign(backend, dtype, name, hub, feat, monkeypatch):
    g = _graph(hub)
    red = getattr(tg, name)(empty=-0.0)
    # powers of two whose exponents cycle to 0: every product is exact in any order or chunking
    base = np.array([1.0, 2.0, 0.5, 4.0, 0.25, 1.0])
    k = np.arange(int(np.prod(feat))).reshape(feat)
    x = base[(np.arange(6).reshape((6,) + (1,) * len(feat)) + k) % 6].astype(dtype)

    def f(x):
        return tg.propagate(g, lambda s, d, e: s.x, red, src={"x": x})
    y = _run(backend, f, (x,), monkeypatch)
    want = _run("reference", f, (x,), monkeypatch) if backend != "reference" else y
    for r in EMPTY_ROWS:
        assert np.all(y[r] == 0) and np.all(np.signbit(y[r])), (backend, name, dtype, y[r])
    full = [r for r in range(6) if r not in EMPTY_ROWS]
    np.testing.assert_array_equal(y[full], want[full])
    assert np.all(np.signbit(y[full]) == np.signbit(want[full]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["min", "max"])
def test_empty_plus_zero_and_default_stay_positive(backend, name, monkeypatch):
    """The fix builds -0.0 only for a negative zero: empty=0.0 and the default stay +0.0."""
    g = _graph(False)
    x = np.arange(6, dtype="float64") + 1
    for red in (getattr(tg, name)(), getattr(tg, name)(empty=0.0)):
        def f(x, red=red):
            return tg.propagate(g, lambda s, d, e: s.x, red, src={"x": x})
        y = _run(backend, f, (x,), monkeypatch)
        assert not np.any(np.signbit(y[list(EMPTY_ROWS)])), (backend, name, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sum_and_mean_empty_rows_agree_with_the_reference(backend, name, monkeypatch):
    """sum/mean have no `empty=` (TypeError); an empty row is +0.0 on every backend, and a row
    whose messages are all -0.0 gives the reference's sign."""
    with pytest.raises(TypeError):
        getattr(tg, name)(empty=-0.0)
    g = _graph(False)
    x = np.full(6, -0.0)

    def f(x):
        return tg.propagate(g, lambda s, d, e: s.x, getattr(tg, name)(), src={"x": x})
    y = _run(backend, f, (x,), monkeypatch)
    want = _run("reference", f, (x,), monkeypatch) if backend != "reference" else y
    assert np.all(y == 0)
    assert not np.any(np.signbit(y[list(EMPTY_ROWS)])), (backend, name, y)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(want))
