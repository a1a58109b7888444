"""core: program-to-program cleanup passes (dead-code elimination, common subexpressions)."""
from __future__ import annotations

import hashlib

import numpy as np

from .program import GraphProgram, Lit, Var

_COPIED_BYTES = 1 << 16    # constants up to this size are keyed by their bytes


def dce(program: GraphProgram, keep_outputs=None) -> GraphProgram:
    """Drop equations whose results are unused; optionally keep only some outputs."""
    outs = program.outs if keep_outputs is None else tuple(
        program.outs[i] for i in keep_outputs)
    live = {id(a) for a in outs if isinstance(a, Var)}
    kept = []
    for eqn in reversed(program.eqns):
        if any(id(v) in live for v in eqn.outputs):
            kept.append(eqn)
            live.update(id(a) for a in eqn.inputs if isinstance(a, Var))
    return GraphProgram(program.in_binders, tuple(reversed(kept)), outs)


def use_counts(program: GraphProgram) -> dict:
    """id(var) -> how many equation inputs and program outputs read it."""
    count: dict = {}
    for e in program.eqns:
        for a in e.inputs:
            count[id(a)] = count.get(id(a), 0) + 1
    for a in program.outs:
        count[id(a)] = count.get(id(a), 0) + 1
    return count


def cse(program: GraphProgram) -> GraphProgram:
    """Merge equations with the same primitive, inputs and params (programs are pure)."""
    from .program import Eqn

    rename: dict[int, Var] = {}
    seen: dict[tuple, tuple] = {}
    eqns = []

    def sub(a):
        return rename.get(id(a), a) if isinstance(a, Var) else a

    for eqn in program.eqns:
        inputs = tuple(sub(a) for a in eqn.inputs)
        key = (eqn.primitive.name, tuple(_atom_key(a) for a in inputs),
               tuple(sorted((k, _hashable(v)) for k, v in eqn.params.items())))
        if key in seen:
            for old, new in zip(eqn.outputs, seen[key]):
                rename[id(old)] = new
            continue
        seen[key] = eqn.outputs
        eqns.append(Eqn(eqn.primitive, inputs, eqn.params, eqn.outputs))
    return GraphProgram(program.in_binders, eqns, tuple(sub(a) for a in program.outs))


def _atom_key(a):
    if isinstance(a, Lit):
        if not isinstance(a.value, np.ndarray | np.generic):   # a relation: by identity
            return ("lit-object", id(a.value))
        return ("lit", str(a.type), _content(a.value))
    return ("var", id(a))


def _content(value) -> bytes:
    """The bytes of a small constant; a large one's SHA-256 read in place (tobytes copied
    every large constant once per use: a gradient's per-edge or per-node constants)."""
    if value.nbytes <= _COPIED_BYTES:
        return value.tobytes()
    arr = np.ascontiguousarray(value)
    return hashlib.sha256(arr.reshape(-1).view(np.uint8)).digest()


def _hashable(v):
    if isinstance(v, np.ndarray):   # repr elides the middle of a large array
        return ("array", v.dtype.str, v.shape, v.tobytes())
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)


# A folded value is held by the program (and the caches that hold it) for its lifetime:
# larger results stay equations, computed per call.
FOLD_ELEMENTS = 1 << 22


def bind_constants(program: GraphProgram, values: dict) -> GraphProgram:
    """`program` with the binders at the positions in `values` ({position: array}) replaced
    by literals, and the tensor equations that then read only literals evaluated once (a
    tg.grad seed of ones broadcast to a field's shape is an array, not per-call work)."""
    from .eval import run_eqn  # (eval imports the registries this module sits below)
    lit = {id(program.in_binders[i]): Lit(v, program.in_binders[i].type)
           for i, v in values.items()}
    eqns = []
    for eqn in program.eqns:
        inputs = tuple(lit.get(id(a), a) for a in eqn.inputs)
        if _foldable(eqn, inputs):
            outs = run_eqn(eqn, [a.value for a in inputs], {}, {})
            lit.update((id(v), Lit(o, v.type)) for v, o in zip(eqn.outputs, outs))
            continue
        eqns.append(type(eqn)(eqn.primitive, inputs, eqn.params, eqn.outputs))
    binders = [b for i, b in enumerate(program.in_binders) if i not in values]
    return GraphProgram(binders, eqns, [lit.get(id(a), a) for a in program.outs])


def _foldable(eqn, inputs) -> bool:
    from .types import TensorType
    if _spreads_one_value(eqn, inputs):
        return False
    return (all(isinstance(a, Lit) and isinstance(a.type, TensorType) for a in inputs)
            and not any(hasattr(p, "program") for p in eqn.params.values())
            and all(isinstance(v.type, TensorType) and _small(v.type.shape)
                    for v in eqn.outputs))


def _spreads_one_value(eqn, inputs) -> bool:
    """A one-element literal broadcast to many: kept as an equation (tg.grad's seed of ones
    over a field's shape). Folded, it is an array that every cache key hashes and every
    walk reads; as an equation, opt's uniform_fields makes it a literal of the edge
    functions that read it, and elsewhere numpy broadcasts it per call."""
    return (eqn.primitive.name == "broadcast_in_dim" and len(inputs) == 1
            and isinstance(inputs[0], Lit) and inputs[0].value.size == 1
            and all(type(d) is int for d in eqn.outputs[0].type.shape)
            and int(np.prod(eqn.outputs[0].type.shape)) > _SPREAD_ELEMENTS)


_SPREAD_ELEMENTS = 1 << 12


def _small(shape) -> bool:
    # (a symbolic size is known only per call)
    return all(type(d) is int for d in shape) and int(np.prod(shape)) <= FOLD_ELEMENTS
