"""lower/ir: IR regions back to GraphPrograms, so primitives' abstract-eval rules type-check
IR ops and the reference interpreter can run any level (the oracle for lowering)."""
from __future__ import annotations

import numpy as np

from ...core import reducers
from ...core.errors import CompilationError, UnsupportedError
from ...core.primitive import get_primitive
from ...core.prims.graph import propagate_p
from ...core.program import ClosedProgram, Eqn, GraphProgram, Lit, Var
from .base import Module, Region, TensorOp, op_label


def closed_from_region(region: Region) -> ClosedProgram:
    return ClosedProgram(program_from_region(region))


def program_from_module(module: Module) -> GraphProgram:
    """The module's function as a GraphProgram (every level keeps the computation)."""
    return program_from_region(module.body)


def program_from_region(region: Region) -> GraphProgram:
    env: dict[str, object] = {}
    binders = []
    for a in region.args:
        env[a.name] = Var(a.type)
        binders.append(env[a.name])
    eqns: list = []
    for op in region.ops:
        _convert_op(op, env, eqns)
    try:
        outs = tuple(env[v.name] for v in region.results)
    except KeyError as exc:
        raise CompilationError(f"%{exc.args[0]} is yielded but never defined") from None
    return GraphProgram(tuple(binders), tuple(eqns), outs)


def _convert_op(op, env: dict, eqns: list) -> None:
    if getattr(op, "op_name", "").startswith("gf_storage."):
        return  # transfers, releases and joins order work; they compute no values
    if getattr(op, "op_name", "") == "gf_task.launch":
        return _inline_task(op, env, eqns)
    if isinstance(op, TensorOp) and op.prim == "constant":
        (res,) = op.results
        t = res.type
        env[res.name] = Lit(np.reshape(np.asarray(op.params[0][1], t.dtype.np), t.shape), t)
        return
    try:
        inputs = tuple(env[v.name] for v in op.operands)
    except KeyError as exc:
        raise CompilationError(f"{op_label(op)}: %{exc.args[0]} is used before it is "
                               "defined") from None
    outs = tuple(Var(v.type) for v in op.results)
    if isinstance(op, TensorOp):
        params = {k: closed_from_region(v) if isinstance(v, Region) else v for k, v in op.params}
        eqns.append(Eqn(get_primitive(op.prim), inputs, params, outs))
    elif hasattr(op, "comp"):
        eqns.append(Eqn(propagate_p, inputs, propagate_params(op.comp), outs))
    else:
        raise UnsupportedError(f"{op_label(op)} has no GraphProgram form",
                               hint="a constant relation is kept by digest only: lower a "
                                    "program that takes the relation as an argument")
    for v, var in zip(op.results, outs):
        env[v.name] = var


def _inline_task(op, env: dict, eqns: list) -> None:
    """A task computes what its region computes, once its events fired."""
    inner = {a.name: env[v.name] for a, v in zip(op.body.args, op.inputs)}
    for inner_op in op.body.ops:
        _convert_op(inner_op, inner, eqns)
    for v, r in zip(op.results, op.body.results):
        env[v.name] = inner[r.name]


def propagate_params(comp) -> dict:
    """The propagate parameters a Domain/Iter/Kernel computation stands for."""
    return dict(edge_fn=closed_from_region(comp.edge), reducer=reducer_from_spec(comp.reducer),
                roles=comp.input_roles, names=comp.input_names, reduce_by=comp.reduce_by,
                update=None if comp.update is None else closed_from_region(comp.update))


def _region_only(*_args):
    raise UnsupportedError("this reducer was rebuilt from IR and exists only as regions",
                           hint="trace the original Python reducer to call its functions")


def reducer_from_spec(spec) -> reducers.Reducer:
    if spec.builtin:
        if spec.name not in reducers.BUILTIN:
            raise CompilationError(f"reducer {spec.name!r} is not built in")
        if spec.name == "online_softmax":
            found = reducers.online_softmax(spec.prune_threshold)
            return found.with_stats() if spec.stats else found
        if spec.name in reducers.ARG:
            return getattr(reducers, spec.name)(spec.of)
        if spec.name in reducers.EMPTY_SETTABLE:
            return getattr(reducers, spec.name)(spec.empty)
        return getattr(reducers, spec.name)()
    r = reducers.Reducer(spec.name, spec.identity, combine=_region_only,
                         commutative=spec.commutative, associative=spec.associative)
    return r.with_regions(tuple(None if g is None else closed_from_region(g)
                                for g in (spec.lift, spec.combine, spec.finalize)))
