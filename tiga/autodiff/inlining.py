"""autodiff: custom calls replaced by their primal function (derived programs never hold one).

A custom_vjp / custom_jvp call carries its rule for differentiation only: a VJP, JVP or
batched program binds the primal function's equations in its place, so it compiles like
the function. `inline_custom_calls` does the same for a whole program (sub-programs too).
"""
from __future__ import annotations

from ..core.errors import TigaError
from ..core.prims.custom import custom_jvp_call_p, custom_vjp_call_p, fun_operands
from ..core.program import ClosedProgram, GraphProgram, Lit
from ..core.types import TensorType
from ..trace.staging import inline_program, trace_flat
from ..trace.tracer import bind

CUSTOM_CALLS = (custom_vjp_call_p, custom_jvp_call_p)


def inline_call(prim, ins, params) -> list:
    """The outputs of one custom call, bound as its primal function's equations."""
    fun = params["fun"]
    return inline_program(inline_custom_calls(fun.program), *fun.consts,
                          *fun_operands(ins, params["counts"]))


def bind_inlined(prim, ins, params) -> list:
    """`bind` that inlines a custom call; a list of outputs either way."""
    if prim in CUSTOM_CALLS:
        return inline_call(prim, ins, params)
    params = {k: _inlined(v) for k, v in params.items()}
    out = bind(prim, *ins, **params)
    return list(out) if prim.multiple_results else [out]


def replay_inlined(program: GraphProgram, args):
    """trace.staging.replay with custom calls inlined: `read(atom) -> value`."""
    env = {id(v): a for v, a in zip(program.in_binders, args)}

    def read(a):
        return a.value if isinstance(a, Lit) else env[id(a)]

    for e in program.eqns:
        outs = bind_inlined(e.primitive, [read(a) for a in e.inputs], e.params)
        for v, o in zip(e.outputs, outs):
            env[id(v)] = o
    return read


def has_custom_calls(program: GraphProgram) -> bool:
    for e in program.eqns:
        if e.primitive in CUSTOM_CALLS:
            return True
        if any(isinstance(p, ClosedProgram) and has_custom_calls(p.program)
               for p in _closed_params(e.params)):
            return True
    return False


def inline_custom_calls(program: GraphProgram) -> GraphProgram:
    """`program` with every custom call (also inside edge, update and loop bodies)
    replaced by its primal function; the program itself when it has none."""
    if not has_custom_calls(program):
        return program

    def fn(*args):
        read = replay_inlined(program, args)
        return [read(a) for a in program.outs]

    types = [t.strong() if isinstance(t, TensorType) else t for t in program.in_types]
    prog, caps, _ = trace_flat(fn, types)
    if caps:
        raise TigaError("inline_custom_calls: the program closes over outer values")
    return prog


def _closed_params(params: dict):
    """Every sub-program param, those inside a tuple too (a cond's branches)."""
    for p in params.values():
        yield from (p if isinstance(p, tuple) else (p,))


def _inlined(param):
    if isinstance(param, tuple):
        return tuple(_inlined(p) for p in param)
    if isinstance(param, ClosedProgram) and has_custom_calls(param.program):
        return ClosedProgram(inline_custom_calls(param.program), param.consts)
    return param
