"""lower: the lowering-rule registry and the explicit reference-only markers.

`lowering_rules[p](ctx, in_types, out_types, *in_vals, **params) -> list[val]`. A primitive
without a lowering must be listed in REFERENCE_ONLY with the reason, so the route
`explain()` reports is never a silent fallback.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.primitive import Primitive, all_primitives
from ..core.prims import elementwise as ew

lowering_rules: dict[str, dict[Primitive, Callable]] = {"cpu-llvm": {}, "triton": {}}

_NO_BACKEND_YET = ("no compiled backend exists yet; the numpy reference interpreter runs it "
                   "and explain() reports route=reference")
REFERENCE_ONLY: dict[Primitive, str] = {p: _NO_BACKEND_YET for p in all_primitives()}

_TOP_LEVEL_ONLY = ("cpu-llvm: runs on the numpy impl rules; cpu-llvm compiles propagate "
                   "kernels and the row-level primitives inside them, and {name} occurs only "
                   "outside row-level functions, in tensor code that is not compiled yet; "
                   "triton: no GPU backend yet")
_OTHER_BACKENDS = ("{lowered}: compiled; {missing}: no lowering yet, so the reference "
                   "interpreter runs it there and explain() reports route=reference")


_LOOPS = ("cpu-llvm: the executor steps {name} itself (not compiled), so the propagates in its "
          "body compile; triton: no GPU backend yet")
_BRANCHES = ("cpu-llvm: the executor runs the taken branch of a cond itself (the branch is "
             "not fused into a kernel), so the propagates in it compile; triton: no GPU "
             "backend yet")


def register_elementwise(backend: str, unary: Callable, binary: Callable, compare: Callable,
                         select: Callable, convert: Callable, stop_gradient: Callable) -> None:
    """A backend's elementwise rules into its table: `unary(name)`, `binary(name)` and
    `compare(name)` make the rule of every primitive of their family (core/prims/elementwise
    names them), `select`, `convert` and `stop_gradient` are the rules themselves."""
    rules = lowering_rules[backend]
    for family, make in ((ew.unary_p, unary), (ew.binary_p, binary), (ew.compare_p, compare)):
        for name, p in family.items():
            rules[p] = make(name)
    rules[ew.select_p] = select
    rules[ew.convert_p] = convert
    rules[ew.stop_gradient_p] = stop_gradient


def register_lowered(backend: str) -> None:
    """Rewrite the markers once `backend` registered its rules: a primitive it lowers stays
    marked only for the backends that still lack it; the others say why they fall back.

    REFERENCE_ONLY is one reason per primitive (not per backend), so the entry names which
    backend compiles it and which does not.
    """
    for p in list(REFERENCE_ONLY):
        lowered = [b for b, rules in lowering_rules.items() if p in rules]
        missing = [b for b in lowering_rules if b not in lowered]
        if not missing:
            REFERENCE_ONLY.pop(p)
        elif lowered:
            REFERENCE_ONLY[p] = _OTHER_BACKENDS.format(lowered=", ".join(lowered),
                                                       missing=", ".join(missing))
        elif p.name in ("repeat", "while_loop"):
            REFERENCE_ONLY[p] = _LOOPS.format(name=p.name)
        elif p.name == "cond":
            REFERENCE_ONLY[p] = _BRANCHES
        else:
            REFERENCE_ONLY[p] = _TOP_LEVEL_ONLY.format(name=p.name)
