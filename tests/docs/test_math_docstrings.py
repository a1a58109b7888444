"""Every public function of tg.math (defined there, not imported into it) has a docstring,
so `help(tg.math.add)` answers."""
from __future__ import annotations

import inspect

import pytest

import tiga

MATH = tiga.math
FUNCTIONS = sorted(n for n, f in vars(MATH).items() if not n.startswith("_")
                   and inspect.isfunction(f) and f.__module__ == MATH.__name__)


def test_there_are_math_functions():
    assert len(FUNCTIONS) > 60 and "add" in FUNCTIONS and "matmul" in FUNCTIONS


@pytest.mark.parametrize("name", FUNCTIONS)
def test_math_function_has_a_docstring(name):
    assert (getattr(MATH, name).__doc__ or "").strip(), f"tg.math.{name} has no docstring"
