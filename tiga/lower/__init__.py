"""lower: GraphProgram -> Domain/Iter/Kernel/Task IR -> backend code (later issues)."""
from .registry import REFERENCE_ONLY, lowering_rules  # noqa: F401

CPU_LLVM_AVAILABLE = False
TRITON_GPU_AVAILABLE = False
TRITON_INTERPRETER_AVAILABLE = False
