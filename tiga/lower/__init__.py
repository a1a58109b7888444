"""lower: GraphProgram -> Domain/Iter/Kernel/Task IR -> backend code (LLVM for CPU)."""
from .registry import REFERENCE_ONLY, lowering_rules  # noqa: F401

try:  # the CPU backend needs llvmlite; without it every propagate runs on the reference
    import llvmlite  # noqa: F401
except ImportError:  # pragma: no cover - llvmlite is a core dependency
    CPU_LLVM_AVAILABLE = False
else:
    from . import llvm  # noqa: F401  (registers lowering_rules["cpu-llvm"])

    CPU_LLVM_AVAILABLE = True

from . import triton as _triton_renderer  # noqa: E402,F401  (registers lowering_rules["triton"])
from .backends import BACKENDS as _BACKENDS  # noqa: E402

# rendering needs nothing; running needs triton + torch (and a CUDA device for triton-gpu)
TRITON_GPU_AVAILABLE = _BACKENDS["triton"].available()[0]
TRITON_INTERPRETER_AVAILABLE = _BACKENDS["triton-interpreter"].available()[0]
