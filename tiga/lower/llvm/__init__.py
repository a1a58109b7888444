"""lower/llvm: LLVM IR code generation for the CPU backend (fused propagate kernels; their
signatures and sources are lower/abi.py's).

Importing this package registers the per-primitive codegen rules in
`lowering_rules["cpu-llvm"]`. It needs llvmlite; `tiga.lower.CPU_LLVM_AVAILABLE` says
whether it imports.
"""
from ...core.prims.graph import propagate_p
from ..registry import lowering_rules, register_lowered
from . import rules  # noqa: F401  (registers lowering_rules["cpu-llvm"])
from .kernel import KernelSchedule, codegen_propagate
from .render import PropagateLowering, propagate_lowering_rule
from .values import CodegenUnsupported

lowering_rules["cpu-llvm"][propagate_p] = propagate_lowering_rule
register_lowered("cpu-llvm")

__all__ = ["codegen_propagate", "KernelSchedule", "CodegenUnsupported", "PropagateLowering"]
