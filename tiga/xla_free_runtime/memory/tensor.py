"""runtime: tg.Tensor, a typed value over one storage tier; asarray and DLPack import."""
from __future__ import annotations

import functools
import importlib
import os
import shutil
import weakref
from pathlib import Path

import numpy as np

from ...core.dtypes import as_dtype, bfloat16
from ...core.errors import StorageError, UnsupportedError
from ...core.types import TensorType
from ...trace.array_ops import ArrayOps
from ...trace.tracer import set_concrete_wrapper
from ..store import save_target
from ..store.versions import is_store
from . import budgets as memory
from . import scope as sc
from .dlpack_export import bfloat16_capsule
from .tiers import DiskStorage, HostStorage
from .tiers import device as device_storage
from .tiers.files import fsync_dir, fsync_tree

_DEVICES = ("cpu",)
_TIERS = ("host", "disk", "device", "cuda")


class Tensor(ArrayOps):
    """A logical array value: its TensorType and a storage handle on one tier."""

    __array_priority__ = 1000
    __slots__ = ("_storage", "_type", "_spilled", "_charge", "_pins", "__weakref__")

    def __init__(self, storage, type_: TensorType):
        self._storage = storage
        self._type = type_
        self._spilled = False     # on disk by spill(): the next read restores it
        self._charge = None       # memory.Charge of a buffer the storage layer allocated
        self._pins = 0            # >0 while a paged run reads the host buffer

    @property
    def __tiga_type__(self) -> TensorType:
        return self._type

    @property
    def tier(self) -> str:
        """Where the value lives: "host", "disk" or "device"."""
        return self._storage.tier

    @property
    def device(self) -> str:
        """"cpu" for the host and disk tiers, "cuda" for the device tier."""
        return self._storage.device

    def numpy(self) -> np.ndarray:
        """The value as a host ndarray (no copy on the host tier; a spilled tensor is
        restored first, a disk tensor is read into a fresh array)."""
        if self._spilled:
            self.restore()
        if self._charge is not None:
            memory.touch(self._charge)
        return self._storage.read()

    # ---- tiers -----------------------------------------------------------------------------

    def to(self, tier: str) -> Tensor:
        """A copy on `tier` ("host", "disk"; "cuda"/"device" only where CUDA exists), or
        this tensor when it is there already."""
        if tier not in _TIERS:
            raise UnsupportedError(f"to: tier {tier!r} is unknown",
                                   hint="use 'host', 'disk' or 'cuda'")
        if tier in ("cuda", "device"):
            return self if self.tier == "device" else _to_device(self)
        if tier == self.tier and not self._spilled:
            return self
        if tier == "host":
            return _host_copy(self, 0, len(self) if self._type.shape else None)
        return Tensor(_to_disk(self._storage, "tensor"), self._type)

    def spill(self) -> Tensor:
        """Release the host buffer and keep the value on disk (under the scope's spill_dir);
        the next read restores it. A disk tensor is left as it is."""
        if self.tier == "host":
            disk = _to_disk(self._storage, "spill")
            self._release_host()
            self._storage, self._spilled = disk, True
        return self

    def restore(self) -> Tensor:
        """Back on the host tier: same values, dtype and shape."""
        if self.tier == "disk":
            disk = self._storage
            ch = memory.charge("host", disk.nbytes, "restore")
            host = HostStorage(disk.read())
            if self._spilled:
                disk.release()
            self._storage, self._spilled = host, False
            _own(self, ch)
        return self

    def _release_host(self) -> None:
        self._storage.release()
        if self._charge is not None:
            self._charge.credit()
            self._charge = None

    def __getitem__(self, index):
        """A row range `t[a:b]` of a disk tensor reads only the chunks it needs; other
        indexing reads the value (the traced operator)."""
        if (self.tier == "disk" and isinstance(index, slice) and self._type.shape and
                index.step in (None, 1)):
            start, stop, _ = index.indices(len(self))
            return _host_copy(self, start, max(start, stop))
        return super().__getitem__(index)

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

    @property
    def __cuda_array_interface__(self) -> dict:
        """A device tensor's memory, read in place by torch, CuPy and Triton."""
        if self._storage.tier != "device":
            raise AttributeError("__cuda_array_interface__: only a device-tier tensor has "
                                 "one (t.to('cuda'))")
        return self._storage.__cuda_array_interface__

    def __dlpack_device__(self):
        if self._storage.tier in ("host", "disk"):
            return (1, 0)        # kDLCPU: a disk tensor is read to the host, never read here
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
        """The one element of a size-1 tensor, as a Python scalar."""
        return self.numpy().item()

    def tolist(self):
        """The value as nested Python lists (numpy's tolist)."""
        return self.numpy().tolist()

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tg.Tensor(")
        return f"tg.Tensor({body}, dtype={self._type.dtype.name})"


def _to_device(t: Tensor) -> Tensor:
    """A copy of t in CUDA memory (storage/device), charged to the device budget."""
    if not device_storage.available():
        raise UnsupportedError("to: the device tier needs a CUDA device and cuda-python, "
                               "and this machine has none", hint="use 'host' or 'disk'")
    arr = t.numpy()
    ch = memory.charge("device", arr.nbytes, "to('cuda')")
    try:
        st = device_storage.DeviceStorage.from_host(arr)
    except BaseException:
        ch.credit()
        raise
    out = Tensor(st, t._type)
    _own(out, ch)
    weakref.finalize(out, st.release)
    return out


def _own(t: Tensor, ch) -> None:
    """Tie a charge to t's buffer: given back when the buffer is released or t dies."""
    t._charge = ch
    if ch.tier == "host":
        memory.track(t, ch)
    weakref.finalize(t, ch.credit)


def _host_copy(t: Tensor, start: int, stop: int | None) -> Tensor:
    """Rows [start, stop) of t (the whole 0-d value when stop is None) in a new host
    buffer, charged before it is allocated."""
    st, shape = t._storage, t._type.shape
    rows = () if stop is None else (stop - start,)
    nbytes = int(np.prod(rows + tuple(shape[1:]), dtype=np.int64)) * t._type.dtype.np.itemsize
    ch = memory.charge("host", nbytes, "to('host')" if stop is None or
                       (start, stop) == (0, len(t)) else f"rows [{start}:{stop})")
    try:
        if stop is None:
            arr = np.array(st.read())
        else:
            arr = st.read_rows(start, stop)
            arr = np.array(arr) if t.tier == "host" else arr
    except BaseException:
        ch.credit()
        raise
    out = Tensor(HostStorage(arr), TensorType(arr.shape, t._type.dtype))
    _own(out, ch)
    return out


def _to_disk(st, stem: str, path=None) -> DiskStorage:
    """A disk copy of storage `st` (an owned spill file unless `path` is given)."""
    arr = st.read() if st.tier == "host" else None
    shape = arr.shape if arr is not None else st.shape
    dtype = arr.dtype if arr is not None else st.dtype
    ch = memory.charge("disk", int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                       f"{stem} on disk") if path is None else None
    disk = DiskStorage.create(path or sc.spill_path(stem), shape, dtype, owned=path is None)
    if arr is not None or not shape:
        disk.write(arr if arr is not None else st.read())
    else:
        step = disk.chunk_rows * 4
        for a in range(0, shape[0], step):
            disk.write_rows(a, st.read_rows(a, a + step))
    if ch is not None:
        weakref.finalize(disk, ch.credit)
        weakref.finalize(disk, shutil.rmtree, str(disk.path), True)
    return disk


def save(t, path, *, overwrite: bool = False) -> None:
    """Write `t` as a zarr v3 array at `path`, atomically: the array is written and fsynced
    beside it, then swapped in by one rename (a crash keeps the previous array).

    `path` may name nothing yet, or an array tg.save wrote, which is replaced. Anything else
    there (a regular file, a link, an empty directory, a zarr array Tiga did not write) is
    replaced only with overwrite=True; a store (or a path inside one) and a directory that
    holds other files are never replaced. A refusal, or any file-system failure, is a
    tg.StorageError naming the path."""
    t = asarray(t)
    path = save_target.absolute(path, "save")
    try:
        ident = save_target.check(path, overwrite)
        path.parent.mkdir(parents=True, exist_ok=True)
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"save: cannot create the directory of {path} ({exc})") from exc
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        _to_disk(t._storage, "save", path=tmp)
        fsync_tree(tmp)
        _replace_dir(tmp, path)
        if _ident(tmp) != ident:    # another process put something there meanwhile
            _replace_dir(tmp, path)
            raise StorageError(f"save: {path} changed while the array was written; it was "
                               "put back and nothing was replaced")
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"save: writing {path} failed ({exc})") from exc
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def _replace_dir(new: Path, path: Path) -> None:
    """Swap `new` in at `path`; what was there ends at `new`, for the caller to check and
    remove."""
    if os.path.lexists(path) and _exchange(new, path):
        return
    if os.path.lexists(path):
        old = path.parent / f".{path.name}.old-{os.urandom(4).hex()}"
        os.rename(path, old)
        os.rename(new, path)
        os.rename(old, new)
    else:
        os.rename(new, path)
    fsync_dir(path.parent)


def _ident(p: Path):
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False when the
    system cannot."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, exchange = -100, 2
    ok = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange) == 0
    if ok:
        fsync_dir(b.parent)
    return ok


def load(path, tier: str = "disk") -> Tensor:
    """The array tg.save wrote: lazily on disk (default) or read onto the host. A path
    that holds no such array (nothing, a file, a store) is a tg.StorageError naming it."""
    if tier not in ("disk", "host"):
        raise UnsupportedError(f"load: tier {tier!r} is not supported",
                               hint="use tier='disk' or tier='host'")
    path = save_target.absolute(path, "load")
    if is_store(path):
        raise StorageError(f"load: {path} is a tg.store, not an array; open it with "
                           "tg.store.open(path) (its fields) or tg.Graph.open(path)")
    disk = DiskStorage.open(path)
    t = Tensor(disk, TensorType(disk.shape, as_dtype(disk.dtype)))
    return t.to("host") if tier == "host" else t


def _wrap(arr: np.ndarray) -> Tensor:
    if isinstance(arr, Tensor):       # a paged run's result already owns its storage
        return arr
    if type(arr) is not np.ndarray:
        arr = np.asarray(arr)
    # (TensorTypes are immutable: one per shape and dtype serves every result of that type;
    # building one costs a warm call ~1 us)
    return Tensor(HostStorage(arr), _tensor_type(arr.shape, arr.dtype))


@functools.lru_cache(maxsize=1024)     # a memo of a pure function of (shape, numpy dtype)
def _tensor_type(shape: tuple, dtype: np.dtype) -> TensorType:
    return TensorType(shape, as_dtype(dtype))


def asarray(obj, dtype=None, device: str = "cpu") -> Tensor:
    """Make a tg.Tensor from numpy arrays, lists, scalars, tg.Tensors or DLPack producers."""
    if device not in _DEVICES:
        raise UnsupportedError(f"asarray: device {device!r} is not available",
                               hint="use device='cpu'; the CUDA tier comes with the GPU backend")
    if isinstance(obj, Tensor) and dtype is None:
        return obj
    if (not isinstance(obj, (np.ndarray, list, tuple, int, float, bool, Tensor)) and
            hasattr(obj, "__dlpack__")):
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
    return (str(getattr(x, "dtype", "")).rsplit(".", 1)[-1] == "bfloat16" and
        callable(getattr(x, "view", None)))


def _int16_like(x):
    # the producer's own int16 dtype object (torch.int16), found without importing torch
    return importlib.import_module(type(x.dtype).__module__).int16


set_concrete_wrapper(_wrap)
