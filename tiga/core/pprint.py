"""core: deterministic jaxpr-style printer for GraphPrograms."""
from __future__ import annotations

import numpy as np

from .program import ClosedProgram, GraphProgram, Lit, Var, array_digest
from .types import GraphType


class _Names:
    def __init__(self):
        self.names: dict[int, str] = {}

    def __call__(self, v: Var) -> str:
        if id(v) not in self.names:
            self.names[id(v)] = _letters(len(self.names))
        return self.names[id(v)]


def _letters(n: int) -> str:
    s = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def pp_program(program: GraphProgram, *, literal_digests: bool = False) -> str:
    """`{ lambda ; a:f32[N] g:csr[N,N;E]. let b:f32[N] = ... in (b,) }`"""
    return _pp(program, _Names(), 0, literal_digests)


def _pp(program: GraphProgram, names: _Names, indent: int, digests: bool) -> str:
    pad = " " * indent
    binders = " ".join(f"{names(v)}:{v.type}" for v in program.in_binders)
    lines = [f"{{ lambda ; {binders}. let"]
    for eqn in program.eqns:
        outs = " ".join(f"{names(v)}:{v.type}" for v in eqn.outputs)
        ins = " ".join(_atom(a, names, digests) for a in eqn.inputs)
        params = _params(eqn.params, names, indent + 4, digests)
        lines.append(f"{pad}    {outs} = {eqn.primitive.name}{params} {ins}".rstrip())
    outs = ", ".join(_atom(a, names, digests) for a in program.outs)
    lines.append(f"{pad}  in ({outs}{',' if len(program.outs) == 1 else ''}) }}")
    return "\n".join(lines)


def _atom(a, names: _Names, digests: bool) -> str:
    if isinstance(a, Var):
        return names(a)
    return _literal(a, digests)


def _literal(a: Lit, digests: bool) -> str:
    if isinstance(a.type, GraphType):
        if not digests:
            return f"const:{a.type}"
        row_ptr, col_idx = a.value.resolve_csr()
        return f"graph#{array_digest(row_ptr)}{array_digest(col_idx)}:{a.type}"
    if a.value.ndim == 0:
        return f"{_scalar(a.value.item())}:{a.type}"
    if a.value.size <= 4 and not digests:
        return f"[{','.join(_scalar(v) for v in a.value.ravel().tolist())}]:{a.type}"
    return f"array#{array_digest(a.value)}:{a.type}"


def _scalar(v) -> str:
    if isinstance(v, float) and np.isfinite(v):
        return np.format_float_positional(v, unique=True, trim="0")
    return repr(v)


def _params(params: dict, names: _Names, indent: int, digests: bool) -> str:
    if not params:
        return ""
    parts = [f"{k}={_param(v, names, indent, digests)}" for k, v in params.items()]
    return "[" + " ".join(parts) + "]"


def _param(v, names: _Names, indent: int, digests: bool) -> str:
    if isinstance(v, ClosedProgram):
        consts = "" if not v.consts else "consts#" + ",".join(array_digest(c) for c in v.consts)
        return consts + _pp(v.program, names, indent, digests)
    if isinstance(v, GraphProgram):
        return _pp(v, names, indent, digests)
    if isinstance(v, tuple):
        inner = ",".join(_param(x, names, indent, digests) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    if hasattr(v, "pp_param"):
        return v.pp_param()
    if isinstance(v, np.ndarray):
        return f"array#{array_digest(v)}"
    return str(v)
