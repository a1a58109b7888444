"""runtime: tg.Tensor, a typed value over one storage tier; asarray and DLPack import."""
from __future__ import annotations

import importlib

import numpy as np

from ..core.dtypes import as_dtype, bfloat16
from ..core.errors import StorageError, UnsupportedError
from ..core.types import TensorType
from ..trace.array_ops import ArrayOps
from ..trace.tracer import set_concrete_wrapper
from .dlpack_export import bfloat16_capsule
from .storage import HostStorage

_DEVICES = ("cpu",)


class Tensor(ArrayOps):
    """A logical array value: its TensorType and a storage handle on one tier."""

    __array_priority__ = 1000
    __slots__ = ("_storage", "_type", "__weakref__")

    def __init__(self, storage, type_: TensorType):
        self._storage = storage
        self._type = type_

    @property
    def __tiga_type__(self) -> TensorType:
        return self._type

    @property
    def tier(self) -> str:
        return self._storage.tier

    @property
    def device(self) -> str:
        return self._storage.device

    def numpy(self) -> np.ndarray:
        """The value as a host ndarray (no copy on the host tier)."""
        return self._storage.read()

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        arr = self.numpy()
        if any(st < 0 for st in arr.strides):
            # DLPack allows negative strides but torch aborts the process on them: hand out
            # a contiguous copy unless the consumer forbade copies
            if copy is False:
                raise BufferError("__dlpack__: the array has negative strides and copy=False; "
                                  "some consumers (torch) cannot import negative strides")
            arr = np.ascontiguousarray(arr)
        if arr.dtype == bfloat16.np:  # numpy cannot export bfloat16: build the capsule here
            return bfloat16_capsule(arr, max_version, dl_device, copy)
        kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device),
                                    ("copy", copy)) if v is not None}
        return arr.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        return self.numpy().__dlpack_device__()

    def __len__(self) -> int:
        if not self._type.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._type.shape[0]

    def __iter__(self):
        return iter(self.numpy())

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __bool__(self) -> bool:
        return bool(self.numpy())

    def item(self):
        return self.numpy().item()

    def tolist(self):
        return self.numpy().tolist()

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tg.Tensor(")
        return f"tg.Tensor({body}, dtype={self._type.dtype.name})"


def _wrap(arr: np.ndarray) -> Tensor:
    arr = np.asarray(arr)
    return Tensor(HostStorage(arr), TensorType(arr.shape, as_dtype(arr.dtype)))


def asarray(obj, dtype=None, device: str = "cpu") -> Tensor:
    """Make a tg.Tensor from numpy arrays, lists, scalars, tg.Tensors or DLPack producers."""
    if device not in _DEVICES:
        raise UnsupportedError(f"asarray: device {device!r} is not available",
                               hint="use device='cpu'; the CUDA tier comes with the GPU backend")
    if isinstance(obj, Tensor) and dtype is None:
        return obj
    if not isinstance(obj, (np.ndarray, list, tuple, int, float, bool, Tensor)) and \
            hasattr(obj, "__dlpack__"):
        obj = from_dlpack(obj)
    arr = np.asarray(obj)
    if dtype is not None:
        arr = arr.astype(as_dtype(dtype).np, copy=False)
    as_dtype(arr.dtype)  # rejects unsupported dtypes with a DTypeError
    return _wrap(arr)


def from_dlpack(x) -> Tensor:
    """Zero-copy import from any DLPack producer on the CPU."""
    if hasattr(x, "detach") and callable(x.detach):
        x = x.detach()  # torch refuses to export tensors that require grad
    bf16 = _is_bfloat16(x)
    if bf16:
        # numpy's DLPack import rejects bfloat16: import the same bits as int16 (torch's
        # view(dtype) shares storage) and reinterpret them as ml_dtypes' bfloat16, no copy
        x = x.view(_int16_like(x))
    try:
        arr = np.from_dlpack(x)
    except (BufferError, TypeError, RuntimeError) as exc:
        raise StorageError(f"from_dlpack: cannot import {type(x).__name__} without a copy "
                           f"({exc}); pass tg.asarray(np.asarray(x)) to copy") from exc
    if bf16:
        arr = arr.view(bfloat16.np)
    return _wrap(arr)


def _is_bfloat16(x) -> bool:
    """A torch-like bfloat16 tensor (recognised by its dtype's name: no torch import here)."""
    return str(getattr(x, "dtype", "")).rsplit(".", 1)[-1] == "bfloat16" and \
        callable(getattr(x, "view", None))


def _int16_like(x):
    # the producer's own int16 dtype object (torch.int16), found without importing torch
    return importlib.import_module(type(x.dtype).__module__).int16


set_concrete_wrapper(_wrap)
