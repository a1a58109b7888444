"""torch_bridge: the torch tensors the Triton launcher passes as kernel pointers (Triton takes
torch tensors: CPU tensors under its interpreter, CUDA tensors on the GPU). The facade hands
these functions to xla_free_runtime/triton_launch.py, which never imports torch itself."""
from __future__ import annotations

import numpy as np
import torch

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64, "int8": torch.int8, "int16": torch.int16,
           "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}


def from_array(x, dtype: str, device: str) -> torch.Tensor:
    """A contiguous tensor of `dtype` on `device` holding `x` (numpy or torch); never empty
    (the interpreter reads an empty tensor's pointer as null)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=_DTYPES[dtype]).contiguous()
    arr = np.ascontiguousarray(np.asarray(x), dtype=np.dtype(dtype))
    if not arr.flags.writeable:
        arr = arr.copy()   # torch wraps only writable memory without a warning
    if arr.size == 0:
        arr = np.zeros(1, dtype=arr.dtype)
    t = torch.from_numpy(arr)
    return t if device == "cpu" else t.to(device)


def zeros(shape: tuple, dtype: str, device: str) -> torch.Tensor:
    return torch.zeros(shape, dtype=_DTYPES[dtype], device=device)


def to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    return t.cpu().numpy().astype(dtype, copy=False)


def adopt_cuda(call) -> None:
    """Replace a call's CUDA DLPack producers (not torch) by torch tensors on the same memory
    (torch.from_dlpack: zero-copy), so the call runs through the torch bridge on the GPU."""
    from ..core.graph_validate import input_device

    def adopt(v):
        if isinstance(v, torch.Tensor) or input_device(v) == "cpu":
            return v
        return torch.from_dlpack(v)

    call.fields = {role: {n: adopt(v) for n, v in f.items()} for role, f in call.fields.items()}
    call.params = {k: adopt(v) for k, v in call.params.items()}
