"""torch_bridge: the torch tensors the Triton launcher passes as kernel pointers (Triton takes
torch tensors: CPU tensors under its interpreter, CUDA tensors on the GPU). The facade hands
these functions to xla_free_runtime/backends/triton/launch.py, which never imports torch itself."""
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
    if dtype == "bfloat16":   # torch cannot wrap ml_dtypes' bfloat16: share its bits
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    return t if device == "cpu" else t.to(device)


# A CPU tensor over a numpy array's memory, no copy (a prepared Triton-interpreter launch:
# the caller checked it is a writable, C-contiguous, non-empty array of a torch dtype).
# torch's own function, not a wrapper: a warm launch calls it once per operand.
wrap_host = torch.from_numpy


def on_device(memory) -> torch.Tensor:
    """A tensor over the CUDA memory `memory` exposes (`__cuda_array_interface__`: a
    device-tier buffer), in place."""
    return torch.as_tensor(memory, device="cuda")


def zeros(shape: tuple, dtype: str, device: str) -> torch.Tensor:
    return torch.zeros(shape, dtype=_DTYPES[dtype], device=device)


def cell_directory(pos: torch.Tensor, lo, inv_w: float, dims) -> tuple:
    """(cell_start int64[cells + 1], order int64[N]) of points `pos` [N, d] on their own
    device: a counting sort by C-order linear cell, stable (cell coordinates in float64,
    clamped to the grid, as core.graph_generated.cell_coords places them)."""
    lo_t = torch.as_tensor(np.asarray(lo, np.float64), device=pos.device)
    dims_t = torch.as_tensor(np.asarray(dims, np.int64), device=pos.device)
    c = torch.floor((pos.to(torch.float64) - lo_t) * inv_w)
    c = torch.minimum(torch.clamp(c, min=0), (dims_t - 1).to(torch.float64)).to(torch.int64)
    lin = torch.zeros(pos.shape[0], dtype=torch.int64, device=pos.device)
    for k in range(pos.shape[1]):
        lin = lin * int(dims[k]) + c[:, k]
    cells = int(np.prod(np.asarray(dims, np.int64)))
    start = torch.zeros(cells + 1, dtype=torch.int64, device=pos.device)
    torch.cumsum(torch.bincount(lin, minlength=cells), 0, out=start[1:])
    order = torch.sort(lin, stable=True).indices
    return start, (order if order.numel() else start.new_zeros(1))


def to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    if t.dtype == torch.bfloat16:   # numpy has no bfloat16 of torch's: ml_dtypes' bits
        return (t.cpu().view(torch.int16).numpy().view(np.dtype("bfloat16"))
            .astype(dtype, copy=False))
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
