"""autodiff: forward mode, jvp_program: GraphProgram -> GraphProgram (outputs and tangents).

`jvp_rules[p](primals, tangents, **params) -> (outs, tangent_outs)`: lists in, lists out
(one entry per result, also for single-result primitives); a tangent is a value or None
(a symbolic zero, never materialised unless a rule needs it). Rules are built from
primitives, so the tangent program is traced, optimised and lowered like any program;
`NONDIFF` marks primitives whose results never carry a tangent.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.check import check_program
from ..core.config import config
from ..core.errors import TigaError
from ..core.passes import dce
from ..core.primitive import Primitive
from ..core.program import GraphProgram, Lit
from ..core.types import TensorType
from ..trace import math as m
from ..trace.staging import trace_flat
from ..trace.tracer import aval_of, bind
from .inlining import bind_inlined, inline_custom_calls
from .registry import NONDIFF

jvp_rules: dict[Primitive, Callable | object] = {}


def defjvp(prim: Primitive):
    def register(fn):
        jvp_rules[prim] = fn
        return fn
    return register


def differentiable(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.is_float


def instantiate(t, like):
    """A tangent as a value: zeros shaped like the primal `like` for a symbolic zero."""
    return m.zeros_like(like) if t is None else t


def bind_list(prim: Primitive, *args, **params) -> list:
    out = bind(prim, *args, **params)
    return list(out) if prim.multiple_results else [out]


def linear_rule(prim: Primitive):
    """The JVP of a primitive linear in all its operands: the primitive on the tangents."""
    def rule(primals, tangents, **params):
        outs = bind_list(prim, *primals, **params)
        ts = [instantiate(t, p) for t, p in zip(tangents, primals)]
        return outs, bind_list(prim, *ts, **params)
    return rule


def forward_pass(program: GraphProgram, primals, tangents):
    """Replay `program` on `primals` with `tangents` (None: zero) into the current trace.
    Returns (outputs, tangent per output or None)."""
    env, tenv = {}, {}
    for v, p, t in zip(program.in_binders, primals, tangents):
        env[id(v)] = p
        if t is not None and differentiable(v.type):
            tenv[id(v)] = t

    def read(a):
        return a.value if isinstance(a, Lit) else env[id(a)]

    for eqn in program.eqns:
        ins = [read(a) for a in eqn.inputs]
        tins = [None if isinstance(a, Lit) else tenv.get(id(a)) for a in eqn.inputs]
        outs, touts = apply_jvp(eqn.primitive, ins, tins, eqn.params)
        for v, o, t in zip(eqn.outputs, outs, touts):
            env[id(v)] = o
            if t is not None and differentiable(v.type):
                tenv[id(v)] = t
    return ([read(a) for a in program.outs],
            [None if isinstance(a, Lit) else tenv.get(id(a)) for a in program.outs])


def apply_jvp(prim: Primitive, ins: list, tins: list, params: dict):
    """(outs, tangent outs) of one application; no rule runs when every tangent is zero."""
    rule = jvp_rules.get(prim)
    if rule is NONDIFF or all(t is None for t in tins):
        outs = bind_inlined(prim, ins, params)
        return outs, [None] * len(outs)
    if rule is None:
        raise TigaError(f"{prim.name} has no JVP rule")
    outs, touts = rule(ins, tins, **params)
    return list(outs), list(touts)


def jvp_program(program: GraphProgram, wrt) -> GraphProgram:
    """Program `(*ins, *tangents[wrt]) -> (*outs, *tangent_outs)`; tangent binders are typed
    like their inputs; inputs not in `wrt` (or not floating) have a zero tangent. Every
    output gets a tangent (zeros where it does not depend on the inputs in `wrt`)."""
    wrt = [bool(w) and differentiable(t) for w, t in zip(wrt, program.in_types)]
    n_in = len(program.in_binders)
    in_types = [t.strong() if isinstance(t, TensorType) else t for t in program.in_types]
    t_types = [t for t, w in zip(in_types, wrt) if w]

    def fn(*args):
        primals, it = args[:n_in], iter(args[n_in:])
        tangents = [next(it) if w else None for w in wrt]
        outs, touts = forward_pass(program, primals, tangents)
        return list(outs) + [instantiate(t, o) for t, o in zip(touts, outs)]

    prog, caps, _ = trace_flat(fn, in_types + t_types)
    if caps:
        raise TigaError("jvp_program: the program closes over outer values")
    prog = dce(inline_custom_calls(prog))   # (an untouched custom call: its function)
    if config.check:
        check_program(prog)
    return prog


def type_of(v):
    t = aval_of(v)
    return t.strong() if isinstance(t, TensorType) else t
