"""runtime: file primitives of the disk tier: a chunk file written past the page cache,
a small file replaced atomically, block-aligned buffers, fsync of a tree (what makes a
rename durable)."""
from __future__ import annotations

import builtins
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

from ....core.errors import StorageError

BLOCK = 4096                   # O_DIRECT transfers: address, offset and length in blocks
_STAGING = threading.local()     # per writing thread: a block-aligned copy of a chunk


def write_file(path: Path, body: np.ndarray, trailer: bytes) -> None:
    """`body` then `trailer` into a new file. The block-aligned part of the body bypasses
    the page cache (O_DIRECT, where the file system has it): a result or a store written
    page by page is larger than memory by assumption, and filling the cache with it costs
    the kernel a fresh page per 4 KiB (~1.2 GB/s here), more than the disk takes it. The
    rest and the trailer are ordinary writes."""
    n = len(body) // BLOCK * BLOCK
    direct = getattr(os, "O_DIRECT", 0)
    if n and direct:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
        except OSError:           # (tmpfs and some others refuse O_DIRECT)
            fd = None
        if fd is not None:
            try:
                src = body[:n]
                if src.ctypes.data % BLOCK:
                    buf = getattr(_STAGING, "buf", None)
                    if buf is None or len(buf) < n:
                        buf = _STAGING.buf = aligned_empty((n,), np.uint8, BLOCK)
                    buf[:n] = src
                    src = buf[:n]
                done = 0
                while done < n:
                    done += os.write(fd, memoryview(src[done:]))
            finally:
                os.close(fd)
            with builtins.open(path, "ab", buffering=0) as fh:
                fh.write(memoryview(body[n:]))
                fh.write(trailer)
            return
    with builtins.open(path, "wb", buffering=0) as fh:
        fh.write(memoryview(body))
        fh.write(trailer)


def replace_file(target: Path, payload: bytes) -> None:
    """`payload` into `target` through a fsynced temporary file beside it, renamed over it: a
    crash leaves the old file or the new one, never a part. The temporary (".<name>.*.tmp",
    unique per writer) is removed on failure; an OSError is the caller's to word."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def aligned_empty(shape: tuple, dtype, align: int = 64) -> np.ndarray:
    """np.empty on an `align`-byte boundary (64: kernels read these rows in place, an
    unaligned gathered field would be staged into an aligned copy first)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(n + align, np.uint8)
    off = -buf.ctypes.data % align
    return buf[off:off + n].view(dtype).reshape(shape)


def fsync_tree(path) -> None:
    """fsync every file under `path`, then the directories (so renames of them are durable)."""
    path = Path(path)
    dirs = [path]

    def fail(exc):
        raise StorageError(f"{path}: fsync failed ({exc})") from exc
    for root, subdirs, files in os.walk(path, onerror=fail):
        for name in files:
            _fsync(os.path.join(root, name))
        dirs.extend(Path(root) / d for d in subdirs)
    for d in dirs + [path.parent]:
        fsync_dir(d)


def fsync_dir(path) -> None:
    _fsync(str(path))


def _fsync(name: str) -> None:
    try:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"{name}: fsync failed ({exc})") from exc
