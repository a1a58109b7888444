"""opt: common-subexpression elimination as a program pass. The implementation stays in
core/passes.py because autodiff (below this layer) uses it on the programs it derives.

One trace holds a primal and its VJP: a value both halves compute (a rule reading `y` for
`y * y` twice) is evaluated once."""
from __future__ import annotations

from ..core.passes import cse
from ..core.program import GraphProgram
from .facts import ProgramFacts


def cse_pass(program: GraphProgram, facts: ProgramFacts) -> tuple[GraphProgram, list]:
    """Equations with the same primitive, inputs and params are merged."""
    return cse(program), []


__all__ = ["cse_pass"]
