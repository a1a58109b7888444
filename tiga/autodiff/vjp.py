"""autodiff: vjp_program, GraphProgram -> GraphProgram computing outputs and cotangents."""
from __future__ import annotations

from ..core.check import check_program
from ..core.config import config
from ..core.errors import TigaError
from ..core.passes import dce
from ..core.program import GraphProgram, Lit
from ..core.types import TensorType
from ..trace import math as m
from ..trace.staging import trace_flat
from .inlining import inline_custom_calls, replay_inlined
from .registry import NONDIFF, vjp_rules


def differentiable(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_float


def vjp_program(program: GraphProgram, wrt) -> GraphProgram:
    """Program `(*ins, *ct_outs) -> (*outs, *ct_ins[wrt])`; cotangent binders are typed like
    the outputs. Inputs not in `wrt` (or not floating) get no cotangent output."""
    wrt = list(wrt)
    n_in = len(program.in_binders)
    out_types = [t.strong() for t in program.out_types]

    def fn(*args):
        primals, cts = args[:n_in], args[n_in:]
        outs, ct_ins = backward_pass(program, primals, cts)
        grads = [ct_ins[i] if ct_ins[i] is not None else m.zeros_like(primals[i])
                 for i in range(n_in) if wrt[i]]
        return list(outs) + grads

    prog, caps, _ = trace_flat(fn, [t.strong() if isinstance(t, TensorType) else t
                                    for t in program.in_types] + out_types)
    if caps:
        raise TigaError("vjp_program: the program closes over outer values")
    prog = dce(inline_custom_calls(prog))   # (what derived programs bind: no custom call)
    if config.check:
        check_program(prog)
    return prog


def backward_pass(program: GraphProgram, primals, cts):
    """Replay `program` on `primals` (binding into the current trace), then pull `cts` back.
    Returns (outputs, cotangent per input or None)."""
    read = replay_inlined(program, primals)   # (custom calls: their function, inlined)
    ct_env: dict[int, object] = {}

    def add_ct(a, ct):
        if ct is None or isinstance(a, Lit) or not differentiable(a.type):
            return
        ct_env[id(a)] = ct if id(a) not in ct_env else m.add(ct_env[id(a)], ct)

    for a, ct in zip(program.outs, cts):
        add_ct(a, ct)
    for eqn in reversed(program.eqns):
        _pull_back(eqn, read, ct_env, add_ct)
    return [read(a) for a in program.outs], [ct_env.get(id(v)) for v in program.in_binders]


def _pull_back(eqn, read, ct_env, add_ct):
    if not any(id(v) in ct_env for v in eqn.outputs):
        return
    rule = vjp_rules.get(eqn.primitive)
    if rule is NONDIFF:
        return
    if rule is None:
        raise TigaError(f"{eqn.primitive.name} has no VJP rule")
    outs = [read(v) for v in eqn.outputs]
    ct_outs = [ct_env[id(v)] if id(v) in ct_env else
               (m.zeros_like(o) if differentiable(v.type) else None)
               for v, o in zip(eqn.outputs, outs)]
    ins = [read(a) for a in eqn.inputs]
    cts = rule(ct_outs if eqn.primitive.multiple_results else ct_outs[0],
               outs if eqn.primitive.multiple_results else outs[0], *ins, **eqn.params)
    for a, ct in zip(eqn.inputs, cts):
        add_ct(a, ct)
