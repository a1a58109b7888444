"""lower/passes: helpers every pass shares: level checks, op rewriting, fresh names."""
from __future__ import annotations

import re
from dataclasses import replace

from ...core.errors import CompilationError
from ..ir.base import Module, Region, TensorOp, is_regions, map_regions


def expect_level(module, cls: type, pass_name: str) -> None:
    if not isinstance(module, cls):
        found = (f"{_a(module.level)} {module.level} module" if isinstance(module, Module)
                 else type(module).__name__)
        raise CompilationError(f"{pass_name}: expects {_a(cls.level)} {cls.level} module, "
                               f"found {found}")


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def map_ops(region: Region, fn) -> Region:
    """Apply `fn(op) -> op` to every op of a block, inner gf_tensor regions (loop bodies) first."""
    ops = []
    for op in region.ops:
        if isinstance(op, TensorOp) and op.regions:
            op = replace(op, params=tuple(
                (k, map_regions(v, lambda r: map_ops(r, fn)) if is_regions(v) else v)
                for k, v in op.params))
        ops.append(fn(op))
    return replace(region, ops=tuple(ops))


class Namer:
    """Fresh SSA names within one region: a hint (`x`, `x_1`, ...) or a number (`0`, `1`)."""

    def __init__(self, taken=()):
        self.used = set(taken)
        self.count = 0
        self.names: dict[int, object] = {}

    def fresh(self, hint: str | None = None) -> str:
        # value names are ASCII ([A-Za-z0-9_.$]); a non-ASCII field name keeps its text in
        # input_names and only its SSA name is spelled with underscores
        hint = re.sub(r"[^A-Za-z0-9_.$]", "_", hint) if hint else None
        if hint is None:
            while str(self.count) in self.used:
                self.count += 1
            name = str(self.count)
            self.count += 1
        else:
            name, k = hint, 1
            while name in self.used:
                name, k = f"{hint}_{k}", k + 1
        self.used.add(name)
        return name
