"""tg.TraceWarning: a Python loop unrolled inside a trace (8 or more propagates of one
structure) is flagged once, pointing at the user's line and naming tg.repeat and tg.scan; tg.repeat,
short loops and propagates of different structure stay silent."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import tiga as tg

G = tg.Graph.from_csr([0, 1, 2, 3, 4], [1, 2, 3, 0], num_src=4)


class Spread(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.r


def _sweep(r):
    return 0.15 / 4 + 0.85 * Spread()(graph=G, src={"r": r})


def _caught(fn, *args):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [w for w in seen if issubclass(w.category, tg.TraceWarning)]


def test_trace_warning_is_a_public_warning():
    assert issubclass(tg.TraceWarning, Warning) and "TraceWarning" in tg.__all__
    assert not issubclass(tg.TraceWarning, tg.TigaError)


def test_unrolled_python_loop_warns_once_naming_repeat():
    @tg.jit
    def unrolled(r):
        for _ in range(12):
            r = _sweep(r)
        return r

    out, seen = _caught(unrolled, np.full(4, 0.25))
    assert len(seen) == 1
    assert "tg.repeat" in str(seen[0].message) and "tg.scan" in str(seen[0].message)
    assert seen[0].filename == __file__           # the user's line, not Tiga's
    np.testing.assert_allclose(np.asarray(out), 0.25)
    _, again = _caught(unrolled, np.full(4, 0.5))  # cached: no second trace, no warning
    assert again == []


def test_repeat_and_short_loops_do_not_warn():
    @tg.jit
    def repeated(r):
        return tg.repeat(50, _sweep, r)

    @tg.jit
    def short(r):
        for _ in range(7):
            r = _sweep(r)
        return r

    for fn in (repeated, short):
        out, seen = _caught(fn, np.full(4, 0.25))
        assert seen == [], fn
        np.testing.assert_allclose(np.asarray(out), 0.25)


def test_propagates_of_different_structure_do_not_add_up():
    class Double(tg.MessagePassing):
        reducer = tg.max()

        def edge(self, src, dst, edge):
            return 2.0 * src.r

    @tg.jit
    def mixed(r):
        for _ in range(5):
            r = _sweep(r)
            r = Double()(graph=G, src={"r": r})
        return r

    _, seen = _caught(mixed, np.full(4, 0.25))
    assert seen == []


def test_grad_through_an_unrolled_loop_warns_too():
    def loss(r):
        for _ in range(8):
            r = _sweep(r)
        return r.sum()

    dr, seen = _caught(tg.grad(loss), np.full(4, 0.25))
    assert len(seen) == 1
    np.testing.assert_allclose(np.asarray(dr), 0.85 ** 8)


def test_the_warning_can_be_silenced_and_make_program_warns_too():
    def nine(r):
        for _ in range(9):
            r = _sweep(r)
        return r.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=tg.TraceWarning)
        tg.jit(nine)(np.full(4, 0.25))
    with pytest.warns(tg.TraceWarning, match="tg.repeat"):
        tg.make_program(nine)(np.full(4, 0.25))
