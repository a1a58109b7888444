"""runtime: file primitives of the disk tier: chunk files written past the page cache, and
read past it when a run asks (a chunk the cache does not hold, cachestat(2) tells); a small
file replaced atomically; block-aligned buffers; fsync of a tree (what makes a rename
durable)."""
from __future__ import annotations

import builtins
import ctypes
import errno
import functools
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from ....core.errors import StorageError

BLOCK = 4096                   # O_DIRECT transfers: address, offset and length in blocks
DIRECT_ALIGN = 512             # O_DIRECT reads: the buffer's address, in sectors
_STAGING = threading.local()     # per thread: block-aligned chunk buffers (_staging)


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
                    buf = _staging("write", n)
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


def _staging(use: str, n: int) -> np.ndarray:
    """This thread's block-aligned buffer of at least `n` bytes for `use` (O_DIRECT needs
    aligned memory; a chunk that is not goes through it)."""
    buf = getattr(_STAGING, use, None)
    if buf is None or len(buf) < n:
        buf = aligned_empty((n,), np.uint8, BLOCK)
        setattr(_STAGING, use, buf)
    return buf


def read_chunk_file(path, target: np.ndarray, direct: bool = False) -> tuple:
    """(bytes read, the next bytes up to 5): a chunk file's body into `target` (contiguous
    bytes), then its checksum trailer. With `direct`, a body the page cache does not hold
    is read past the cache with O_DIRECT where `target`'s address and size allow: no kernel
    copy through cache pages a run larger than the cache will not read again. A body the
    cache holds, even in part, is copied from the cache. Raises OSError (FileNotFoundError
    for a missing file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        view, n = memoryview(target).cast("B"), target.nbytes
        body = n // BLOCK * BLOCK
        got = 0
        if direct and body and _cold(fd, body):
            if target.ctypes.data % DIRECT_ALIGN == 0:
                got = _read_direct(path, view[:body])
            else:     # (a window's chunk at an odd place in its page: staged, then copied)
                stage = _staging("read", body)
                got = _read_direct(path, memoryview(stage)[:body])
                np.frombuffer(view, np.uint8)[:got] = stage[:got]
        while got < n:                     # (the cached way; the rest past a direct body)
            k = _pread_into(fd, view[got:], got)
            if k <= 0:
                break
            got += k
        return got, os.pread(fd, 5, got)
    finally:
        os.close(fd)


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    """os.preadv where the platform has it (not macOS), else a seek and a readv."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.readv(fd, [view])


def page_cache_room() -> int | None:
    """Bytes the kernel could give the page cache now (MemAvailable), or None if unknown."""
    try:
        with builtins.open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cold(fd: int, nbytes: int, offset: int = 0) -> bool:
    """Whether none of the file's bytes [offset, offset + nbytes) are in the page cache
    (cachestat(2), Linux 6.5+; elsewhere False: the cached way, always correct). A probe by
    reading would not do: a non-blocking read of an uncached page starts the readahead."""
    stat = _cachestat()
    if stat is None:
        return False
    rng, got = (ctypes.c_uint64 * 2)(offset, nbytes), (ctypes.c_uint64 * 5)()
    return stat(fd, rng, got) == 0 and got[0] == 0


@functools.lru_cache(maxsize=1)
def _cachestat():
    """cachestat(fd, range, out) through libc's syscall(), or None where there is none."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    nr = 451                       # (the same number on x86_64 and the generic table)
    probe = (ctypes.c_uint64 * 5)()
    if libc.syscall(nr, -1, (ctypes.c_uint64 * 2)(0, 1), probe, 0) == 0 or \
            ctypes.get_errno() == errno.ENOSYS:
        return None                # (EBADF expected for fd -1: the call exists)
    return lambda fd, rng, out: libc.syscall(nr, fd, rng, out, 0)


def read_part(path, offset: int, dst: np.ndarray, direct: bool = False) -> int:
    """Bytes [offset, offset + len(dst)) of a file into `dst`; bytes read. With `direct`,
    uncached bytes are read with O_DIRECT (the block-aligned range around them, through a
    staging buffer): a read through the cache would start the kernel's readahead of the
    whole chunk, which the run then reads once more, whole, from the cache."""
    n = dst.nbytes
    view = memoryview(dst).cast("B")
    lo, hi = offset // BLOCK * BLOCK, -(-(offset + n) // BLOCK) * BLOCK
    fd = os.open(path, os.O_RDONLY)
    try:
        if direct and _cold(fd, hi - lo, lo):
            stage = _staging("part", hi - lo)
            if _read_direct(path, memoryview(stage)[:hi - lo], lo, exact=True) >= \
                    offset - lo + n:
                np.frombuffer(view, np.uint8)[:] = stage[offset - lo:offset - lo + n]
                return n
        return _pread_into(fd, view, offset)
    finally:
        os.close(fd)


def _read_direct(path, view: memoryview, offset: int = 0, exact: bool = False) -> int:
    """Bytes of `view` read from `offset` with O_DIRECT (0 where refused): whole blocks,
    or with `exact` every byte up to the file's end."""
    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, os.O_RDONLY | direct) if direct else None
    except OSError:
        return 0
    if fd is None:
        return 0
    try:
        got = 0
        while got < len(view):
            k = _pread_into(fd, view[got:], offset + got)
            if k <= 0:
                break
            got += k
        # (a short read's tail is read again the cached way)
        return got if exact else got - got % BLOCK
    except OSError:
        return 0
    finally:
        os.close(fd)


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
