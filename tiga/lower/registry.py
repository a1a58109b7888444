"""lower: the lowering-rule registry and the explicit reference-only markers.

`lowering_rules[p](ctx, in_types, out_types, *in_vals, **params) -> list[val]`. A primitive
without a lowering must be listed in REFERENCE_ONLY with the reason, so the route
`explain()` reports is never a silent fallback.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.primitive import Primitive, all_primitives

lowering_rules: dict[str, dict[Primitive, Callable]] = {"cpu-llvm": {}, "triton": {}}

_NO_BACKEND_YET = ("no compiled backend exists yet; the numpy reference interpreter runs it "
                   "and explain() reports route=reference")
REFERENCE_ONLY: dict[Primitive, str] = {p: _NO_BACKEND_YET for p in all_primitives()}
