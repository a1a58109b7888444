"""A stand-in for cuda.bindings.runtime whose "device memory" is host memory: allocations are
numpy buffers, copies are memmoves. The device tier's logic (row ranges, gathers, budgets,
streams, release, errors) and the paged Triton route's device copies are checked with it on
any machine; tests install it with monkeypatch over `memory.tiers.device.runtime`."""
from __future__ import annotations

import ctypes
import enum

import numpy as np


class Err(enum.Enum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2


class StandInRuntime:
    """The runtime calls the device tier makes. `copies`: (kind, bytes) of every copy
    (kind 1 host -> device, 2 device -> host); `fail_alloc`: the next cudaMalloc fails;
    `streams` / `nonblocking`: streams made, and how many with cudaStreamNonBlocking."""

    cudaError_t = Err
    cudaStreamNonBlocking = 1

    class cudaMemcpyKind:
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    def __init__(self):
        self.buffers, self.copies, self.fail_alloc = {}, [], False
        self.streams = self.nonblocking = 0

    def count(self, kind: int) -> int:
        """Copies made in direction `kind`."""
        return sum(1 for k, _ in self.copies if k == kind)

    def cudaGetDeviceCount(self):
        return Err.cudaSuccess, 1

    def cudaMalloc(self, n):
        if self.fail_alloc:
            return Err.cudaErrorMemoryAllocation, None
        buf = np.full(n, 0xAB, np.uint8)       # (uninitialised memory, visibly)
        self.buffers[buf.ctypes.data] = buf
        return Err.cudaSuccess, buf.ctypes.data

    def cudaFree(self, ptr):
        del self.buffers[ptr]
        return (Err.cudaSuccess,)

    def cudaStreamCreate(self):
        self.streams += 1
        return Err.cudaSuccess, self.streams

    def cudaStreamCreateWithFlags(self, flags):
        assert flags == self.cudaStreamNonBlocking
        self.nonblocking += 1
        return self.cudaStreamCreate()

    def cudaStreamDestroy(self, stream):
        return (Err.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        assert 0 < stream <= self.streams          # (a stream this runtime made)
        self.copies.append((kind, n))
        ctypes.memmove(dst, src, n)
        return (Err.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        return (Err.cudaSuccess,)

    def cudaDeviceSynchronize(self):
        return (Err.cudaSuccess,)
