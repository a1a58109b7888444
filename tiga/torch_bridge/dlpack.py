"""torch_bridge: zero-copy conversion between torch tensors and numpy / tg.Tensor (DLPack)."""
from __future__ import annotations

import numpy as np
import torch
import torch._C._functorch as _F

from ..core.dtypes import as_dtype, bfloat16
from ..core.errors import DTypeError, UnsupportedError
from ..core.graph_validate import layout_problem
from .transforms import plain


def is_torch(x) -> bool:
    return isinstance(x, torch.Tensor)


def to_numpy(t: torch.Tensor, name: str = "tensor") -> np.ndarray:
    """A read-only numpy view of `t` (detached from autograd).

    Zero-copy for CPU tensors, strided ones included (numpy keeps torch's strides). Copies
    only where memory cannot be shared: tensors on an accelerator (copied to the host),
    conjugate/negative-bit views (materialised). The view is read-only so that no numpy
    rule can write into the caller's tensor.
    """
    arr = host_view(t)
    if arr is not None:
        return arr
    t = plain(t, name)   # torch.func's grad wrappers hold the value; vmap's batch raises
    # (below torch.func, torch ops on the unwrapped value would be wrapped again)
    with torch._C._DisableFuncTorch():
        arr = _host_view(t, name)
    try:
        as_dtype(arr.dtype)
    except DTypeError as exc:  # complex and other numpy-only types: name the argument
        raise DTypeError(f"{name}: torch dtype {t.dtype} is not supported ({exc})") from exc
    arr = arr.view()
    arr.flags.writeable = False
    return arr


# a plain dense CPU tensor of these dtypes, outside torch.func: the common warm call's
# operands, viewed without the general route's checks (about 15 us less per tensor)
_PLAIN_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.int64,
                           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def host_view(t) -> np.ndarray | None:
    """to_numpy's view of a plain CPU tensor (the tensor or a Parameter, strided, not
    nested, no conjugate/negative bit, a dtype numpy has, no torch.func transform live),
    read-only; None for anything else (to_numpy's general route)."""
    if (type(t) not in PLAIN_TYPES or not t.is_cpu or t.dtype not in _PLAIN_DTYPES
            or t.layout is not torch.strided or t.is_nested or t.is_conj() or t.is_neg()
            or _F.peek_interpreter_stack() is not None):
        return None
    arr = t.detach().numpy()
    arr.flags.writeable = False
    return arr


def _host_view(t: torch.Tensor, name: str) -> np.ndarray:
    """The numpy view of a plain tensor (to_numpy without the read-only flag and checks)."""
    check_strided(t, name)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # the reference route runs on the host: one copy
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        # numpy has no bfloat16: view the bits as int16 and reinterpret (ml_dtypes), no copy
        arr = t.view(torch.int16).numpy().view(bfloat16.np)
    else:
        try:
            arr = t.numpy()
        except TypeError as exc:  # complex32, float8, quantized types, ...
            raise DTypeError(f"{name}: torch dtype {t.dtype} has no Tiga counterpart; "
                             "expected a float, integer or bool tensor") from exc
    return arr


def check_strided(t: torch.Tensor, name: str) -> None:
    """Tiga reads dense (strided) tensors with data: name layout or device, not the dtype."""
    problem = layout_problem(t)
    if problem is not None:
        raise UnsupportedError(f"{name}: {problem[0]}", hint=problem[1])


def to_torch(array) -> torch.Tensor:
    """A CPU torch tensor sharing memory with `array` (numpy array or tg.Tensor).

    Copies only where torch cannot alias the buffer: read-only arrays (torch would write
    through them), negative strides and non-native byte order.
    """
    if hasattr(array, "__tiga_type__"):
        array = array.numpy()  # host tier: the storage's own ndarray, no copy
    elif not isinstance(array, np.ndarray):
        if hasattr(array, "__dlpack__") and not isinstance(array, np.generic):
            return torch.from_dlpack(array)
        array = np.asarray(array)
    if array.dtype == bfloat16.np:
        return to_torch(array.view(np.int16)).view(torch.bfloat16)
    if (not array.flags.writeable or any(s < 0 for s in array.strides)
            or not array.dtype.isnative):
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="C")
    return torch.from_numpy(array)
