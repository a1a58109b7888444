"""lower: GraphProgram -> Domain/Iter/Kernel/Task IR -> backend code (LLVM for CPU)."""
from .registry import REFERENCE_ONLY, lowering_rules  # noqa: F401

try:  # the CPU backend needs llvmlite; without it every propagate runs on the reference
    import llvmlite  # noqa: F401
except ImportError:  # pragma: no cover - llvmlite is a core dependency
    CPU_LLVM_AVAILABLE = False
else:
    from . import llvm  # noqa: F401  (registers lowering_rules["cpu-llvm"])

    CPU_LLVM_AVAILABLE = True

TRITON_GPU_AVAILABLE = False
TRITON_INTERPRETER_AVAILABLE = False
