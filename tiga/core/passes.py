"""core: program-to-program cleanup passes (dead-code elimination, common subexpressions)."""
from __future__ import annotations

import numpy as np

from .program import GraphProgram, Lit, Var


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
        return ("lit", str(a.type), a.value.tobytes())
    return ("var", id(a))


def _hashable(v):
    if isinstance(v, np.ndarray):   # repr elides the middle of a large array
        return ("array", v.dtype.str, v.shape, v.tobytes())
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)
