"""autodiff: the VJP rule registry.

`vjp_rules[p](ct_outs, outs, *ins, **params) -> tuple[ct or None, ...]`, built from
primitives so the backward pass is a program like any other. `NONDIFF` marks primitives
whose inputs never receive cotangents (integer/topology/piecewise-constant results).
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.primitive import Primitive

NONDIFF = object()
vjp_rules: dict[Primitive, Callable | object] = {}


def defvjp(prim: Primitive):
    def register(fn):
        vjp_rules[prim] = fn
        return fn
    return register
