"""torch_bridge: the only layer that imports torch (DLPack conversion, torch.autograd)."""
from __future__ import annotations

from .autograd import run_call_torch
from .dlpack import to_numpy, to_torch

__all__ = ["run_call_torch", "to_numpy", "to_torch"]
