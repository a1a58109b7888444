"""core: GraphProgram, the typed, immutable, ANF program representation (jaxpr-like)."""
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
            from .pprint import pp_program  # the printer is the canonical serialization

            h = hashlib.sha256(pp_program(self, literal_digests=True).encode())
            self._key.append(h.hexdigest())
        return self._key[0]

    def __eq__(self, other) -> bool:
        return isinstance(other, GraphProgram) and self.structure_key() == other.structure_key()

    def __hash__(self) -> int:
        return hash(self.structure_key())

    def __str__(self) -> str:
        from .pprint import pp_program

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
