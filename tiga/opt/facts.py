"""opt: what the caller knows about a program, which decides the passes it gets.

A pass never guesses where it runs: the entry point says so. `stage` names the point:

- "staged": a traced forward before autodiff (plain calls, tg.jit, tg.grad / tg.vjp, the
  torch bridge): the VJP is derived from the rewritten program.
- "vjp": a derived backward program (tg.grad / tg.vjp, the torch bridge).
- "execute": about to run with concrete relations, whose kinds decide walk fusion. Not
  applied where a program is traced: what users print or lower stays as traced.
"""
from __future__ import annotations

from ..core.errors import TigaError
from ..core.program import GraphProgram
from ..core.records import record

STAGES = ("staged", "vjp", "execute")


@record
class ProgramFacts:
    """stage: one of STAGES. relation_kinds: ((id(graph variable), kind), ...) with kind
    None, "directed" or "symmetric" (opt.fuse_walks.relation_kinds), read at "execute".
    bridge: the torch bridge's forward, which runs as staged (no "execute" stage follows),
    so it folds negations at staging. forward: at "vjp", the forward program that runs right
    before the VJP (torch.autograd): the VJP then reads its intermediates as residuals."""

    stage: str
    relation_kinds: tuple = ()
    bridge: bool = False
    forward: GraphProgram | None = None

    def __post_init__(self):
        if self.stage not in STAGES:
            raise TigaError(f"ProgramFacts.stage: expected one of {STAGES}, "
                            f"found {self.stage!r}")
        if self.forward is not None and self.stage != "vjp":
            raise TigaError(f"ProgramFacts.forward: only a 'vjp' program reads a forward's "
                            f"residuals, found stage {self.stage!r}")

    def kind_of(self, var_id: int):
        """The kind of the relation variable with this id (None: unknown)."""
        return dict(self.relation_kinds).get(var_id)


__all__ = ["ProgramFacts", "STAGES"]
