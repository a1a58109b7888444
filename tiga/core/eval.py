"""core: the reference interpreter (numpy impl rules); the oracle for every compiled path."""
from __future__ import annotations

import numpy as np

from .errors import ProgramError, ShapeError, UnsupportedError
from .primitive import elementwise_batch_rule, impl_rules, row_batch_rules
from .program import ClosedProgram, GraphProgram, Lit
from .types import Dim, GraphType


def eval_program(program: GraphProgram, *args, overrides: dict | None = None) -> list:
    """Run `program` on concrete values with the numpy impl rules.

    `overrides` maps a primitive, or an equation's `id()`, to `rule(eqn, values) -> outputs`
    run instead of the impl rule (the runtime's compiled propagates and loops); a rule that
    returns None hands the equation back to the impl rule. An equation id wins over its
    primitive.
    """
    if len(args) != len(program.in_binders):
        raise ProgramError(f"eval_program: program takes {len(program.in_binders)} inputs, "
                           f"got {len(args)}")
    env: dict[int, object] = {}
    for v, x in zip(program.in_binders, args):
        # a value on the disk tier stays there for the overriding rules (a paged propagate
        # reads it page by page); an impl rule that reads it converts it then
        env[id(v)] = host_value(v, x, overrides is not None)
    if overrides is not None:
        return _eval_overridden(program, env, overrides)
    dims = bind_dims(program.in_binders, [env[id(v)] for v in program.in_binders])
    read = _reader(env)
    for eqn in program.eqns:
        rule = impl_rules.get(eqn.primitive)
        if rule is None:
            raise UnsupportedError(f"{eqn.primitive.name} has no reference implementation")
        params = eqn.params if not dims else {k: resolve_dims(p, dims)
                                              for k, p in eqn.params.items()}
        outs = rule(*[read(a) for a in eqn.inputs], **params)
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = o
    return [read(a) for a in program.outs]


def _eval_overridden(program: GraphProgram, env: dict, overrides: dict) -> list:
    """eval_program's loop with per-primitive / per-equation rules in front of the impl
    rules. A generated relation's edge count stays unbound: counting it walks its CSR, which
    a compiled route keeps unmaterialised."""
    dims = bind_dims(program.in_binders, [env[id(v)] for v in program.in_binders],
                     resolve=False)
    read = _reader(env)
    for eqn in program.eqns:
        outs = run_eqn(eqn, [read(a) for a in eqn.inputs], overrides, dims)
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = o
    return [read(a) for a in program.outs]


def run_eqn(eqn, vals: list, overrides: dict, dims: dict) -> list:
    """One equation on concrete values: its override (by equation id, then primitive), or
    the impl rule when there is none or it hands the equation back (returns None). The
    runtime's Task interpreter runs every equation that is not a kernel launch through this
    same step."""
    rule = overrides.get(id(eqn)) or overrides.get(eqn.primitive)
    outs = None if rule is None else rule(eqn, vals)
    if outs is None:
        impl = impl_rules.get(eqn.primitive)
        if impl is None:
            raise UnsupportedError(f"{eqn.primitive.name} has no reference implementation")
        params = eqn.params if not dims else {k: resolve_dims(p, dims)
                                              for k, p in eqn.params.items()}
        outs = impl(*[host_array(x) for x in vals], **params)
    return outs


def host_array(x):
    """A value as impl rules read it (numpy): a lazy disk-tier value is read here, where it
    is used, and a device tensor a compiled propagate left on its GPU is copied here (the
    next compiled propagate takes it back there)."""
    if getattr(x, "tier", None) == "disk":
        return np.asarray(x)
    if on_device(x):
        return x.detach().cpu().numpy()
    return x


def on_device(x) -> bool:
    """A torch tensor on an accelerator (core never imports torch: read by duck typing)."""
    return (getattr(getattr(x, "device", None), "type", "cpu") not in ("cpu", "meta") and
        hasattr(x, "detach"))


def host_value(binder, x, lazy_disk: bool):
    """An argument as the interpreter binds it: relations as they are; with `lazy_disk` (the
    runtime's overriding rules run it) a disk-tier value left lazy (read by rows) and a
    device tensor left on its device (the triton route's kernels read it there); anything
    else as numpy."""
    if type(x) is np.ndarray:    # (the common warm-call operand: nothing to convert)
        return x
    if isinstance(binder.type, GraphType) or (lazy_disk and getattr(x, "tier", None) == "disk"):
        return x
    return x if lazy_disk and on_device(x) else np.asarray(host_array(x))


def bind_dims(binders, values, *, resolve: bool = True) -> dict:
    """Sizes of the symbolic dims (N, S, E) of one call, read off its arguments
    (`resolve=False`: a generated relation's unknown edge count is left unbound)."""
    dims: dict[Dim, int] = {}
    for v, x in zip(binders, values):
        t = v.type
        if isinstance(t, GraphType):
            if x.num_edges is None and resolve:   # generated: the interpreter walks its CSR
                x.resolve_csr()
            pairs = [(t.num_src, x.num_src), (t.num_dst, x.num_dst)]
            if x.num_edges is not None:
                pairs.append((t.num_edges, x.num_edges))
        else:
            pairs = list(zip(t.shape, np.shape(x)))
        for d, n in pairs:
            if isinstance(d, Dim):
                if dims.setdefault(d, int(n)) != int(n):
                    raise ShapeError(f"symbolic size {d} is {dims[d]} for one argument and "
                                     f"{n} for another")
    return dims


def resolve_dims(param, dims: dict):
    """Replace symbolic dims inside a shape-like parameter by this call's sizes."""
    if isinstance(param, Dim):
        return dims.get(param, param)
    if isinstance(param, tuple):
        return tuple(resolve_dims(p, dims) for p in param)
    return param


def eval_closed(closed: ClosedProgram, *args) -> list:
    return eval_program(closed.program, *closed.consts, *args)


def _reader(env):
    def read(a):
        return a.value if isinstance(a, Lit) else env[id(a)]
    return read


def eval_rows(closed: ClosedProgram, args, batched, size: int) -> list:
    """Evaluate a row-level program for `size` rows at once.

    `args[i]` carries a leading row axis when `batched[i]`; unbatched values (parameters)
    are shared by every row. Every output comes back with the leading row axis.
    """
    env: dict[int, tuple] = {}
    program = closed.program
    for v, c in zip(program.in_binders, closed.consts):
        env[id(v)] = (np.asarray(c), False)
    for v, x, b in zip(program.in_binders[len(closed.consts):], args, batched):
        env[id(v)] = (np.asarray(x), bool(b))

    def read(a):
        return (a.value, False) if isinstance(a, Lit) else env[id(a)]

    for eqn in program.eqns:
        vals = [read(a) for a in eqn.inputs]
        outs, out_b = _eval_eqn_rows(eqn, vals, size)
        for v, o in zip(eqn.outputs, outs):
            env[id(v)] = (o, out_b)
    results = []
    for a in program.outs:
        x, b = read(a)
        results.append(x if b else np.broadcast_to(x, (size,) + np.shape(x)).copy())
    return results


def _eval_eqn_rows(eqn, vals, size):
    rule = impl_rules[eqn.primitive]
    if not any(b for _, b in vals):
        return rule(*[x for x, _ in vals], **eqn.params), False
    batch_rule = row_batch_rules.get(eqn.primitive)
    if batch_rule is None:
        raise UnsupportedError(f"{eqn.primitive.name} cannot run inside a per-edge or per-row "
                               "function", hint="compute it outside the edge/update function")
    if batch_rule is elementwise_batch_rule:
        # a rank-0 row meets shaped rows: give it trailing unit axes so numpy aligns the rows
        rank = max(np.ndim(x) - 1 if b else np.ndim(x) for x, b in vals)
        xs = [np.reshape(x, np.shape(x) + (1,) * (rank + 1 - np.ndim(x))) if b else x
              for x, b in vals]
        return rule(*xs, **eqn.params), True
    xs = [x if b else np.broadcast_to(x, (size,) + np.shape(x)) for x, b in vals]
    return rule(*xs, **batch_rule(**eqn.params)), True
