"""autodiff: batching (vmap), GraphProgram -> GraphProgram with a rule per primitive.

`batch_rules[p](args, batched, size, **params) -> (outs, out_batched)`: a batched value
carries the batch as its leading axis (size `size`), an unbatched one is shared by every
instance. Rules are built from primitives, so a batched program compiles like any other.
Relations are never batched.
"""
from __future__ import annotations

from collections.abc import Callable

from ..core.errors import TigaError
from ..core.passes import dce, use_counts
from ..core.primitive import Primitive, abstract_eval_rules
from ..core.prims.graph import propagate_p
from ..core.prims.shape import broadcast_in_dim_p, transpose_p
from ..core.program import ClosedProgram, GraphProgram, Lit
from ..core.types import TensorType
from ..trace import math as m
from ..trace.staging import trace_flat
from ..trace.tracer import Tracer, aval_of, bind
from .inlining import bind_inlined

batch_rules: dict[Primitive, Callable] = {}


def with_batch(t: TensorType, size) -> TensorType:
    return TensorType((size,) + tuple(t.shape), t.dtype)


def broadcast_batch(x, size):
    """An unbatched value shared by every instance, materialised with the batch axis."""
    t = aval_of(x)
    return bind(broadcast_in_dim_p, m.asvalue(x), shape=(size,) + tuple(t.shape),
                broadcast_dimensions=tuple(range(1, t.ndim + 1)))


# Transposes move_axis emitted in the batched program being traced: id(result) ->
# (result, operand, permutation). A move that undoes an earlier one returns that move's
# operand instead of a second transpose: `vmap(f, in_axes=1)` of a propagate moves the
# batch to the front (batch_program) and straight back behind the rows (the propagate's
# rule), and the results the other way; composed, nothing moves. (One table per
# batch_program trace; entries hold their result, so an id is never reused while listed.)
_moves: list[dict] = []


def move_axis(x, src: int, dst: int):
    """Move axis `src` of `x` to position `dst` (a transpose; none when equal, nor when it
    undoes the transpose that made `x`)."""
    nd = aval_of(x).ndim
    if src == dst:
        return x
    order = [i for i in range(nd) if i != src]
    order.insert(dst, src)
    moves = _moves[-1] if _moves and isinstance(x, Tracer) else None
    if moves is not None:
        made = moves.get(id(x))
        if (made is not None and made[0] is x
                and tuple(made[2][i] for i in order) == tuple(range(nd))):
            return made[1]
    out = m.transpose(x, tuple(order))
    if moves is not None and isinstance(out, Tracer):
        moves[id(out)] = (out, x, tuple(order))
    return out


def batch_replay(program: GraphProgram, args, batched, size):
    """Bind `program` on `args` (batched ones with a leading batch axis) into the current
    trace, each equation through its batching rule; returns (outs, out_batched)."""
    env, benv = {}, {}
    for v, a, b in zip(program.in_binders, args, batched):
        env[id(v)], benv[id(v)] = a, bool(b)

    def read(a):
        return (a.value, False) if isinstance(a, Lit) else (env[id(a)], benv[id(a)])

    for eqn in program.eqns:
        ins, bs = zip(*[read(a) for a in eqn.inputs]) if eqn.inputs else ((), ())
        if not any(bs):
            outs, obs = bind_inlined(eqn.primitive, list(ins), eqn.params), None
        else:
            rule = batch_rules.get(eqn.primitive)
            if rule is None:
                raise TigaError(f"{eqn.primitive.name} has no batching rule")
            outs, obs = rule(list(ins), list(bs), size, **eqn.params)
        obs = obs or [False] * len(outs)
        for v, o, b in zip(eqn.outputs, outs, obs):
            env[id(v)], benv[id(v)] = o, bool(b)
    res = [read(a) for a in program.outs]
    return [r[0] for r in res], [r[1] for r in res]


def batch_closed(closed: ClosedProgram, batched, size, force=None):
    """(the sub-program over batched binders, which outputs are batched). `force[k]` True
    makes output k batched even where it does not depend on a batched input."""
    nc = len(closed.consts)
    avals = [with_batch(t.strong(), size) if b else _strong(t)
             for t, b in zip(closed.in_types, batched)]
    out_batched: list = []

    def fn(*args):
        outs, obs = batch_replay(closed.program, list(closed.consts) + list(args),
                                 [False] * nc + list(batched), size)
        if force is not None:
            outs = [broadcast_batch(o, size) if f and not b else o
                    for o, b, f in zip(outs, obs, force)]
            obs = [b or bool(f) for b, f in zip(obs, force)]
        out_batched.extend(obs)
        return outs

    prog, caps, _ = trace_flat(fn, avals)
    if caps:
        raise TigaError("batching: a sub-program closes over outer values")
    return ClosedProgram(prog), out_batched


def _strong(t):
    return t.strong() if isinstance(t, TensorType) else t


def batch_program(program: GraphProgram, batched, size, in_axes, out_axes) -> GraphProgram:
    """The batched program: binders as given (a batched input carries its batch at
    `in_axes[i]`), outputs with the batch at `out_axes[k]` (unbatched ones broadcast)."""
    avals = []
    for t, b, ax in zip(program.in_types, batched, in_axes):
        if b:
            shape = list(t.shape)
            shape.insert(ax, size)
            t = TensorType(tuple(shape), t.dtype)
        avals.append(_strong(t))

    def fn(*args):
        vals = [move_axis(a, ax, 0) if b else a for a, b, ax in zip(args, batched, in_axes)]
        outs, obs = batch_replay(program, vals, batched, size)
        outs = [o if b else broadcast_batch(o, size) for o, b in zip(outs, obs)]
        return [move_axis(o, 0, ax) for o, ax in zip(outs, out_axes)]

    _moves.append({})
    try:
        prog, caps, _ = trace_flat(fn, avals)
    finally:
        _moves.pop()
    if caps:
        raise TigaError("vmap: the program closes over outer values")
    # (custom calls stay, batched with their rules: a transformation around the vmap may
    # differentiate them; a caller that runs the program inlines them first)
    return prog


def final_batch_moves(program: GraphProgram, out_axes) -> tuple:
    """(program, perms): the batched program without the final transposes that only move a
    propagate's batch axis (which its rule leaves beside the features) to `out_axes[k]`;
    `perms[k]` is the permutation the caller applies to output k as a view (np.transpose,
    no copy), None where the output is returned as it is. Only a propagate's own result
    qualifies: it is a fresh array, so the view aliases no argument, constant or other
    output (a value read by another equation or returned twice keeps its transpose)."""
    producer = {id(v): e for e in program.eqns for v in e.outputs}
    uses = use_counts(program)
    outs, perms = [], []
    for a, ax in zip(program.outs, out_axes):
        e = producer.get(id(a))
        perm = e.params["permutation"] if e is not None and e.primitive is transpose_p else None
        src = e.inputs[0] if perm is not None else None
        made = producer.get(id(src)) if src is not None else None
        if (made is None or made.primitive is not propagate_p or uses[id(a)] != 1 or
                uses[id(src)] != 1 or [p for i, p in enumerate(perm) if i != ax] !=
                sorted(p for i, p in enumerate(perm) if i != ax)):
            outs.append(a)
            perms.append(None)
        else:
            outs.append(src)
            perms.append(tuple(perm))
    if all(p is None for p in perms):
        return program, perms
    return dce(GraphProgram(program.in_binders, program.eqns, tuple(outs))), perms


def unbatched_types(ins, batched) -> list:
    """The operand types of one instance."""
    out = []
    for x, b in zip(ins, batched):
        t = aval_of(x)
        out.append(TensorType(t.shape[1:], t.dtype, t.weak) if b else t)
    return out


def instance_out_types(prim, ins, batched, params) -> list:
    return abstract_eval_rules[prim](*unbatched_types(ins, batched), **params)
