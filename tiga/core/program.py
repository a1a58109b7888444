"""core: GraphProgram, the typed, immutable, ANF program representation (jaxpr-like), and
its deterministic printer (pp_program, the canonical serialization)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .primitive import Primitive
from .types import GraphType, TensorType, Type


class Var:
    """A program variable; identity-compared (structure equality is on whole programs)."""

    __slots__ = ("type",)

    def __init__(self, type: Type):
        self.type = type

    def __repr__(self) -> str:
        return f"Var({self.type})"


class Lit:
    """A literal value inlined in a program (Python scalar or small numpy array)."""

    __slots__ = ("value", "type")

    def __init__(self, value: Any, type: TensorType):
        self.value = np.asarray(value, dtype=type.dtype.np)
        self.type = type

    def __repr__(self) -> str:
        return f"Lit({self.value!r}, {self.type})"


Atom = Var | Lit


@dataclass(frozen=True, eq=False)
class Eqn:
    primitive: Primitive
    inputs: tuple
    params: dict
    outputs: tuple


@dataclass(frozen=True, eq=False)
class GraphProgram:
    """`{ lambda ; in_binders. let eqns in outs }`. Equality and hash are structural."""

    in_binders: tuple
    eqns: tuple
    outs: tuple
    _key: list = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "in_binders", tuple(self.in_binders))
        object.__setattr__(self, "eqns", tuple(self.eqns))
        object.__setattr__(self, "outs", tuple(self.outs))

    @property
    def in_types(self) -> list:
        """The types of the program's inputs, in order."""
        return [v.type for v in self.in_binders]

    @property
    def out_types(self) -> list:
        """The types of the program's outputs, in order."""
        return [a.type for a in self.outs]

    def structure_key(self) -> str:
        """A digest of the program's structure: what the jit cache keys on (never `id`)."""
        if not self._key:
            # the printer is the canonical serialization
            h = hashlib.sha256(pp_program(self, literal_digests=True).encode())
            self._key.append(h.hexdigest())
        return self._key[0]

    def __eq__(self, other) -> bool:
        return isinstance(other, GraphProgram) and self.structure_key() == other.structure_key()

    def __hash__(self) -> int:
        return hash(self.structure_key())

    def __str__(self) -> str:
        return pp_program(self)

    __repr__ = __str__


@dataclass(frozen=True, eq=False)
class ClosedProgram:
    """A sub-program plus values bound to its first `len(consts)` binders."""

    program: GraphProgram
    consts: tuple = ()

    @property
    def in_types(self) -> list:
        return self.program.in_types[len(self.consts):]

    @property
    def out_types(self) -> list:
        return self.program.out_types

    def read_inputs(self) -> set:
        """Positions of the (non-const) binders an equation or an output reads: the
        operands the sub-program uses (a derived edge function takes every operand)."""
        read = {id(a) for e in self.program.eqns for a in e.inputs}
        read |= {id(a) for a in self.program.outs}
        binders = self.program.in_binders[len(self.consts):]
        return {i for i, v in enumerate(binders) if id(v) in read}

    def structure_key(self) -> str:
        digest = hashlib.sha256(self.program.structure_key().encode())
        for c in self.consts:
            digest.update(array_digest(c).encode())
        return digest.hexdigest()

    def __eq__(self, other) -> bool:
        return isinstance(other, ClosedProgram) and self.structure_key() == other.structure_key()

    def __hash__(self) -> int:
        return hash(self.structure_key())

    def __str__(self) -> str:
        return str(self.program)


def array_digest(value) -> str:
    arr = np.ascontiguousarray(np.asarray(value))
    h = hashlib.sha256(str((arr.dtype.str, arr.shape)).encode())
    h.update(arr.reshape(-1).view(np.uint8) if arr.size else b"")   # (no copy)
    return h.hexdigest()[:16]


def is_graph_type(t: Type) -> bool:
    return isinstance(t, GraphType)


# ---- the printer: deterministic, jaxpr-style (the canonical serialization) ----------

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
