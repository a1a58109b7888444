"""runtime: tensors and storage tiers, route selection and execution."""
from .backends import register
from .backends.cpu.backend import CpuLLVM
from .backends.triton.backend import Triton

# the backend table's built-in entries (tests may register others in their place)
register(CpuLLVM())
register(Triton())
