"""runtime: device-tier storage: CUDA memory through cuda-python (`cuda.bindings.runtime`).

Allocation, release and host <-> device copies of whole values and row ranges. Each storage
copies on its own CUDA stream (cudaMemcpyAsync, then a synchronize of that stream: the host
buffer a copy reads or fills belongs to the caller again when the call returns). A device
tensor exposes `__cuda_array_interface__`, so torch, CuPy and Triton read it in place.
Used only where CUDA exists: `available()` says whether cuda-python imports and a device
answers; elsewhere `t.to("cuda")` is a tg.UnsupportedError.
"""
from __future__ import annotations

import numpy as np

from ....core.errors import ShapeError, StorageError, UnsupportedError

_H2D, _D2H = "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost"


def runtime():
    """cuda.bindings.runtime, or UnsupportedError naming what is missing."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:
        raise UnsupportedError("the device tier needs cuda-python (cuda.bindings)",
                               hint="pip install 'cuda-python==13.4.4' (the gpu extra) on a "
                                    "machine with a CUDA driver") from exc
    return rt


def available() -> bool:
    """cuda-python imports and at least one CUDA device answers."""
    try:
        rt = runtime()
        err, count = rt.cudaGetDeviceCount()
    except Exception:       # (no driver: an error code, or a loader error in some builds)
        return False
    return err == rt.cudaError_t.cudaSuccess and count > 0


def synchronize() -> None:
    """Wait for all work on the device (a kernel launched on another stream, before its
    results are copied back on a storage's own stream)."""
    rt = runtime()
    _check(rt, rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _check(rt, result, what: str):
    """The value of a cuda-python call `(error, value...)`, or StorageError naming it."""
    err = result[0] if isinstance(result, tuple) else result
    if err != rt.cudaError_t.cudaSuccess:
        raise StorageError(f"device tier: {what} failed ({getattr(err, 'name', err)})")
    if isinstance(result, tuple) and len(result) > 1:
        return result[1]
    return None


class DeviceStorage:
    """A C-contiguous array in CUDA device memory."""

    tier = "device"
    device = "cuda"

    def __init__(self, ptr: int, stream, shape: tuple, dtype):
        self._ptr, self._stream = ptr, stream
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)

    @classmethod
    def alloc(cls, shape, dtype, nonblocking: bool = False) -> DeviceStorage:
        """`nonblocking`: its stream does not wait for the legacy default stream (where torch
        launches kernels), so its copies overlap them; the caller orders them (a paged
        run's page buffers: host-side, through its events)."""
        rt = runtime()
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        ptr = _check(rt, rt.cudaMalloc(max(nbytes, 1)), f"cudaMalloc of {nbytes} bytes")
        try:
            # (cudaStreamNonBlocking is 1 in CUDA's headers, where a binding lacks the name)
            flag = getattr(rt, "cudaStreamNonBlocking", 1)
            stream = (_check(rt, rt.cudaStreamCreateWithFlags(flag),
                             "cudaStreamCreateWithFlags") if nonblocking else
                _check(rt, rt.cudaStreamCreate(), "cudaStreamCreate"))
        except StorageError:
            rt.cudaFree(ptr)
            raise
        return cls(int(ptr), stream, shape, dtype)

    @classmethod
    def from_host(cls, value) -> DeviceStorage:
        arr = np.ascontiguousarray(value)
        st = cls.alloc(arr.shape, arr.dtype)
        st.write(arr)
        return st

    # ---- the tier protocol -----------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def _live(self) -> int:
        if self._ptr is None:
            raise StorageError("device storage was released; copy the value back first")
        return self._ptr

    def _copy(self, dst: int, src: int, nbytes: int, kind: str) -> None:
        if nbytes <= 0:
            return
        rt = runtime()
        _check(rt, rt.cudaMemcpyAsync(dst, src, nbytes, getattr(rt.cudaMemcpyKind, kind),
                                      self._stream), f"{kind} copy of {nbytes} bytes")
        _check(rt, rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def read(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self._copy(out.ctypes.data, self._live(), self.nbytes, _D2H)
        return out

    view = read

    def read_rows(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [start, stop) copied to the host (into `out`'s leading rows when it fits)."""
        if not self.shape:
            raise ShapeError("read_rows: a 0-d value has no rows")
        start, stop = max(0, int(start)), min(int(stop), self.shape[0])
        n = max(0, stop - start)
        fits = (out is not None and out.dtype == self.dtype and out.flags.c_contiguous and
            out.shape[1:] == self.shape[1:] and len(out) >= n)
        rows = out[:n] if fits else np.empty((n,) + self.shape[1:], self.dtype)
        self._copy(rows.ctypes.data, self._live() + start * self.row_bytes,
                   n * self.row_bytes, _D2H)
        return rows

    def take_rows(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows at sorted indices `rows`: one copy per run of consecutive rows."""
        rows = np.asarray(rows, dtype=np.int64)
        fits = (out is not None and out.dtype == self.dtype and out.flags.c_contiguous and
            out.shape[1:] == self.shape[1:] and len(out) >= len(rows))
        got = out[:len(rows)] if fits else np.empty((len(rows),) + self.shape[1:], self.dtype)
        if not len(rows):
            return got
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [len(rows)]])):
            self.read_rows(int(rows[a]), int(rows[b - 1]) + 1, got[a:b])
        return got

    def write(self, value) -> None:
        arr = np.ascontiguousarray(value, self.dtype)
        if arr.shape != self.shape:
            raise ShapeError(f"write: value shape {arr.shape} differs from storage shape "
                             f"{self.shape}")
        self._copy(self._live(), arr.ctypes.data, self.nbytes, _H2D)

    def write_rows(self, start: int, rows) -> None:
        arr = np.ascontiguousarray(rows, self.dtype)
        if arr.shape[1:] != self.shape[1:] or start < 0 or start + len(arr) > self.shape[0]:
            raise ShapeError(f"write_rows: rows of shape {arr.shape} at row {start} do not "
                             f"fit storage of shape {self.shape}")
        self._copy(self._live() + start * self.row_bytes, arr.ctypes.data, arr.nbytes, _H2D)

    def release(self) -> None:
        if self._ptr is None:
            return
        rt = runtime()
        ptr, stream, self._ptr = self._ptr, self._stream, None
        _check(rt, rt.cudaStreamDestroy(stream), "cudaStreamDestroy")
        _check(rt, rt.cudaFree(ptr), "cudaFree")

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3 of the CUDA array interface: readers use the memory in place; `stream`
        is ours, synchronized after every copy, so there is nothing to wait for."""
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._live(), False),
                "version": 3, "strides": None, "stream": None}

    def leading(self, n: int) -> Rows:
        """Its first `n` rows, in place, as an object with `__cuda_array_interface__` (a
        kernel reads a buffer of a paged run, allocated with slack, through it)."""
        if not self.shape or not 0 <= n <= self.shape[0]:
            raise ShapeError(f"leading: {n} rows of storage of shape {self.shape}")
        return Rows(self, (int(n),) + self.shape[1:])


class Rows:
    """Leading rows of a DeviceStorage (DeviceStorage.leading), which it keeps alive."""

    def __init__(self, storage: DeviceStorage, shape: tuple):
        self.storage, self.shape = storage, shape

    @property
    def __cuda_array_interface__(self) -> dict:
        return dict(self.storage.__cuda_array_interface__, shape=self.shape)


__all__ = ["DeviceStorage", "Rows", "available", "runtime", "synchronize"]
