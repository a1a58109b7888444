"""opt: dead-code elimination as a program pass. The implementation stays in core/passes.py
because autodiff (below this layer) cleans up the programs it derives with it."""
from __future__ import annotations

from ..core.passes import dce
from ..core.program import GraphProgram
from .facts import ProgramFacts


def dce_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """Equations whose results no output reads are dropped."""
    return dce(program), []


__all__ = ["dce_pass"]
