"""lower: render a scheduled Kernel IR module to LLVM text (`tiga-opt FILE --render`).

Each `gf_kernel.launch` is rendered from its own attributes: the computation (edge, reducer
and update regions), the traversal and the Schedule `select_kernel_schedule` chose, through
the same `codegen_propagate` the runtime compiles. Walks whose tables are not in the IR text
(a stencil's offsets, cu_seqlens, radius/kNN parameters) are refused with their name.
"""
from __future__ import annotations

from ..core.errors import UnsupportedError
from .ir import KernelModule, LaunchOp
from .ir.convert import propagate_params

RELATION_OF = {"csr-row": ("csr",), "transposed-csr-row": ("csr",), "dense-row": ("dense",),
               "triangular-row": ("triangular",)}


def render_kernel_module(module: KernelModule) -> str:
    """The LLVM text of every launch of a kernel-level module, in order."""
    from . import CPU_LLVM_AVAILABLE

    if not isinstance(module, KernelModule):
        raise UnsupportedError(f"--render needs a kernel-level module, found a {module.level} "
                               "module", hint="run --lower-iter-to-kernel first")
    if not CPU_LLVM_AVAILABLE:
        raise UnsupportedError("--render needs llvmlite (the cpu-llvm backend)")
    launches = [op for op in module.body.ops if isinstance(op, LaunchOp)]
    return "".join(render_launch(op, symbol=f"{module.name}_{i}")
                   for i, op in enumerate(launches))


def render_launch(op: LaunchOp, *, symbol: str) -> str:
    from .llvm import KernelSchedule, codegen_propagate

    relation = RELATION_OF.get(op.traversal)
    if relation is None:
        raise UnsupportedError(f"gf_kernel.launch: traversal {op.traversal!r} cannot be "
                               "rendered from IR text (its walk tables are call data)",
                               hint=f"renderable: {', '.join(RELATION_OF)}")
    if op.schedule is None:
        raise UnsupportedError("gf_kernel.launch: no schedule attributes",
                               hint="run --select-kernel-schedule first")
    gtype = op.comp.relation.type
    in_types = [gtype] + [v.type for v in op.comp.inputs]
    schedule = KernelSchedule(has_edge_perm=False, relation=relation, launch=op.schedule)
    text, _ = codegen_propagate(propagate_params(op.comp), in_types, gtype.index_dtype,
                                schedule, symbol=symbol)
    return text
