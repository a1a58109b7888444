"""runtime: tensors and storage tiers, route selection and execution."""
from .backends import register
from .backends.cpu.backend import CpuLLVM

register(CpuLLVM())     # (the backend table's built-in entry; tests may register others)
