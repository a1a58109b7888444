"""Runtime bounds and traced values (issue 41, items 4 and 6): under tg.jit a negative runtime
while_loop bound is a TigaError at run time, as it is eagerly (on 58b7cff it ran 0 steps
and returned the initial state), and .item() / .tolist() / .numpy() on a traced value is a
TigaError saying why and what to do (on 58b7cff: a raw AttributeError).

Oracle: a Python loop over floats for the trip counts."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg


def _loop(x, n):
    return tg.while_loop(lambda s: s < 1000.0, lambda s: s * 2.0 + 1.0, x, n)


def _oracle(x: float, n: int) -> float:
    for _ in range(n):
        if not x < 1000.0:
            break
        x = x * 2.0 + 1.0
    return x


@pytest.mark.parametrize("bound", [-1, -7, -(2 ** 40)])
@pytest.mark.parametrize("kind", ["jit", "eager"])
def test_a_negative_runtime_bound_is_an_error(bound, kind):
    f = tg.jit(_loop) if kind == "jit" else _loop
    f(np.float64(0.5), np.int64(3))                    # (traced and compiled first)
    with pytest.raises(tg.TigaError, match=rf"max_iterations must be >= 0, found {bound}"):
        f(np.float64(0.5), np.int64(bound))


def test_a_negative_bound_is_caught_for_every_int_dtype():
    f = tg.jit(_loop)
    for dt in (np.int8, np.int16, np.int32, np.int64):
        with pytest.raises(tg.TigaError, match="max_iterations must be >= 0"):
            f(np.float64(0.5), dt(-3))


@pytest.mark.parametrize("bound", [0, 1, 2, 5, 12, 40])
def test_non_negative_runtime_bounds_agree_with_the_oracle(bound):
    f = tg.jit(_loop)
    for x in (0.5, 3.0, 999.0, 2000.0):
        got = float(np.asarray(f(np.float64(x), np.int64(bound))))
        assert got == _oracle(x, bound), (x, bound, got)
        assert float(np.asarray(_loop(np.float64(x), np.int64(bound)))) == got


def test_a_static_negative_bound_is_an_error_when_traced():
    with pytest.raises(tg.TigaError, match="max_iterations must be >= 0, found -1"):
        tg.jit(lambda x: _loop(x, -1))(np.float64(1.0))


def test_a_user_loop_whose_bound_is_the_counting_sentinel_is_not_mistaken():
    """A Python bound equal to the counted loop's internal one (2**62) with a negative second
    carry is a user's loop, not a counted one: no bound error."""
    def f(s):
        return tg.while_loop(lambda t: t[0] < 3.0, lambda t: (t[0] + 1.0, t[1]), s, 2 ** 62)
    out = tg.jit(f)((np.float64(0.0), np.int64(-5)))
    assert float(np.asarray(out[0])) == 3.0 and int(np.asarray(out[1])) == -5


@pytest.mark.parametrize("method", ["item", "tolist", "numpy"])
@pytest.mark.parametrize("transform", ["jit", "grad"])
def test_concrete_values_of_a_traced_value_say_why_and_what_to_do(method, transform):
    def f(x):
        y = (x * x).sum()
        getattr(y, method)()
        return y

    fn = tg.jit(f) if transform == "jit" else tg.grad(f)
    with pytest.raises(tg.TigaError) as info:
        fn(np.arange(3.0))
    msg = str(info.value)
    assert f".{method}() of the traced value f64[]" in msg
    assert "traced once for every input" in msg and "outside the traced function" in msg
    assert not isinstance(info.value, AttributeError)


def test_concrete_values_outside_a_trace_still_work():
    y = tg.jit(lambda x: (x * x).sum())(np.arange(3.0))
    assert y.item() == 5.0 and y.tolist() == 5.0 and y.numpy() == 5.0
