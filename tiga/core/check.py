"""core: check_program verifies binding, single assignment and types via abstract eval."""
from __future__ import annotations

from .errors import ProgramError
from .primitive import abstract_eval_rules
from .program import ClosedProgram, GraphProgram, Lit, Var
from .types import GraphType, TensorType


def check_program(program: GraphProgram) -> None:
    """Raise ProgramError on the first violation; sub-programs are checked recursively."""
    defined: set[int] = set()

    def define(v, where: str):
        if not isinstance(v, Var):
            raise ProgramError(f"{where}: expected a Var binder, found {type(v).__name__}")
        if not isinstance(v.type, (TensorType, GraphType)):
            raise ProgramError(f"{where}: binder has no valid type ({v.type!r})")
        if id(v) in defined:
            raise ProgramError(f"{where}: variable {v} is assigned twice (single assignment)")
        defined.add(id(v))

    def use(a, where: str):
        if isinstance(a, Lit):
            return
        if not isinstance(a, Var) or id(a) not in defined:
            raise ProgramError(f"{where}: {a!r} is used before it is defined")

    for i, v in enumerate(program.in_binders):
        define(v, f"in_binders[{i}]")
    for k, eqn in enumerate(program.eqns):
        where = f"eqn {k} ({eqn.primitive.name})"
        for a in eqn.inputs:
            use(a, where)
        _check_eqn_types(eqn, where)
        for v in eqn.outputs:
            define(v, where)
        for p in eqn.params.values():
            for sub in _sub_programs(p):
                check_program(sub)
    for i, a in enumerate(program.outs):
        use(a, f"outs[{i}]")


def _check_eqn_types(eqn, where: str) -> None:
    rule = abstract_eval_rules.get(eqn.primitive)
    if rule is None:
        raise ProgramError(f"{where}: primitive has no abstract-eval rule")
    try:
        expected = rule(*[a.type for a in eqn.inputs], **eqn.params)
    except Exception as exc:  # a rule's own error is the finding; re-raise as a program error
        raise ProgramError(f"{where}: abstract evaluation failed: {exc}") from exc
    found = [v.type for v in eqn.outputs]
    if [_strip(t) for t in expected] != [_strip(t) for t in found]:
        raise ProgramError(f"{where}: outputs typed {', '.join(map(str, found))} but the rule "
                           f"gives {', '.join(map(str, expected))}")


def _strip(t):
    return t.strong() if isinstance(t, TensorType) else t


def _sub_programs(p):
    if isinstance(p, ClosedProgram):
        yield p.program
    elif isinstance(p, GraphProgram):
        yield p
    elif isinstance(p, tuple):
        for x in p:
            yield from _sub_programs(x)
