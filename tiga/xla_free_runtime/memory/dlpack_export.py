"""runtime: DLPack export for host arrays numpy cannot export itself (bfloat16).

numpy's `__dlpack__` rejects ml_dtypes' bfloat16, so `torch.from_dlpack(tg_tensor)` would
fail on exactly the storage type mixed-precision users hold. This module builds the DLPack
structs with ctypes and hands out a capsule over the array's own memory (no copy): the
legacy `dltensor` capsule, or `dltensor_versioned` (DLPack 1.x, with the read-only flag)
when the consumer asks for it through `max_version`.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...core.errors import StorageError

_KDL_CPU = 1
_KDL_BFLOAT = 4
_FLAG_READ_ONLY = 1
_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# Exported structs by address: each keeps its array (and shape/stride buffers) alive until the
# consumer calls the deleter, or the capsule dies unconsumed.
_LIVE: dict[int, tuple] = {}
_LIVE_LOCK = threading.Lock()


@_DELETER
def _delete(address):
    with _LIVE_LOCK:
        _LIVE.pop(address, None)


# The destructor sees the dying capsule as a raw pointer: wrapping it in a py_object would
# take a reference to an object whose refcount already reached zero.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_new = _api.PyCapsule_New
_new.restype, _new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p,
                                                  _CAPSULE_DESTRUCTOR)
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))


def _unconsumed(name: bytes):
    """Capsule destructor: a consumer renames the capsule (`used_...`) and owns the deleter;
    a capsule still carrying its original name was never consumed, so free it here."""
    @_CAPSULE_DESTRUCTOR
    def destroy(capsule):
        if _is_valid(capsule, name):
            _delete(_get_pointer(capsule, name))
    return destroy


_DESTROY = {_LEGACY: _unconsumed(_LEGACY), _VERSIONED: _unconsumed(_VERSIONED)}


def bfloat16_capsule(arr: np.ndarray, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule viewing `arr` (a bfloat16 host array) without a copy."""
    if dl_device is not None and tuple(dl_device) != (_KDL_CPU, 0):
        raise BufferError(f"__dlpack__: dl_device={tuple(dl_device)} requested; "
                          "tg.Tensor storage lives on the host (device (1, 0))")
    if copy:
        arr = arr.copy()
    if arr.dtype.itemsize != 2:
        raise StorageError(f"__dlpack__: expected a 2-byte bfloat16 array, found {arr.dtype}")
    ndim = arr.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // 2 for s in arr.strides))
    tensor = _DLTensor(arr.ctypes.data, _Device(_KDL_CPU, 0), ndim, _DataType(_KDL_BFLOAT, 16, 1),
                       shape, strides, 0)
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    if versioned:
        flags = 0 if arr.flags.writeable else _FLAG_READ_ONLY
        managed = _ManagedVersioned(_Version(1, 0), None, _delete, flags, tensor)
        name = _VERSIONED
    else:
        if not arr.flags.writeable:
            # the legacy protocol has no read-only flag: a consumer could write through it
            raise BufferError("__dlpack__: cannot export a read-only bfloat16 array through "
                              "the legacy DLPack protocol; pass copy=True or use a consumer "
                              "that supports DLPack 1.0 (max_version)")
        managed = _Managed(tensor, None, _delete)
        name = _LEGACY
    address = ctypes.addressof(managed)
    with _LIVE_LOCK:
        _LIVE[address] = (arr, managed, shape, strides)
    return _new(address, name, _DESTROY[name])
