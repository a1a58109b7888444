"""lower: GraphProgram -> Domain/Iter/Kernel/Task IR -> backend code (LLVM for CPU)."""
from .backends import BACKENDS as _BACKENDS
from .backends import CPU_LLVM_AVAILABLE
from .registry import REFERENCE_ONLY, lowering_rules  # noqa: F401

if CPU_LLVM_AVAILABLE:  # without llvmlite every propagate runs on the reference
    from . import llvm  # noqa: F401  (registers lowering_rules["cpu-llvm"])

from . import triton as _triton_renderer  # noqa: E402,F401  (registers lowering_rules["triton"])

# rendering needs nothing; running needs triton + torch (and a CUDA device for triton-gpu)
TRITON_GPU_AVAILABLE = _BACKENDS["triton"].available()[0]
TRITON_INTERPRETER_AVAILABLE = _BACKENDS["triton-interpreter"].available()[0]
