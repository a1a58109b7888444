"""runtime: file primitives of the disk tier: chunk files written past the page cache, and
read past it when a run asks (a chunk the cache does not hold, cachestat(2) tells); a small
file replaced atomically; block-aligned buffers; fsync of a tree (what makes a rename
durable).

Every file a reader opens goes through `open_regular`: non-blocking (a FIFO in place of a
chunk or a manifest must not hang the process), without following a symbolic link in the
last component, and refused with a StorageError naming it when it is not a regular file.
`private_problem` says why a directory or file is not private to this user (the artifact
cache, a spill directory and the cache's key are checked with it)."""
from __future__ import annotations

import builtins
import ctypes
import errno
import functools
import mmap
import os
import platform
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np

from ....core.errors import StorageError
from ...calls.threads import work_arrays

BLOCK = 4096                   # O_DIRECT transfers: address, offset and length in blocks
DIRECT_ALIGN = 512             # O_DIRECT reads: the buffer's address, in sectors
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) |
               getattr(os, "O_CLOEXEC", 0))
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# (a chunk file is written where a symbolic link planted in its place is never followed)
_WRITE_FLAGS = (os.O_WRONLY | os.O_CREAT | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) |
                getattr(os, "O_CLOEXEC", 0))


def open_regular(path, flags: int = 0, what: str = "file") -> int:
    """A descriptor of the regular file at `path`, opened read-only (plus `flags`), never
    blocking and never through a symbolic link in its last component. Anything else there
    (a FIFO, socket, device, directory, symbolic link) is a StorageError naming it; a
    missing file is FileNotFoundError, other failures OSError (the caller words them)."""
    try:
        fd = os.open(path, _READ_FLAGS | NOFOLLOW | flags)
    except OSError as exc:
        # (O_NOFOLLOW on a link: ELOOP on Linux and macOS, EMLINK on the BSDs)
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise StorageError(f"{path}: {what} check failed: is a symbolic link (to "
                               f"{_link(path)!r}); Tiga reads only regular files "
                               "here") from None
        if exc.errno == errno.ENXIO:     # (a socket)
            raise StorageError(f"{path}: {what} check failed: is a socket, not a regular "
                               "file") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StorageError(f"{path}: {what} check failed: is {_kind(st.st_mode)}, not a "
                           "regular file")
    return fd


def read_small(path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at `path` (open_regular's checks), at most `limit`:
    a larger file is a StorageError (a manifest or metadata file is never that big)."""
    fd = open_regular(path, what=what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise StorageError(f"{path}: {what} check failed: {size} bytes, more than the "
                               f"{limit} such a file can hold")
        return read_fd(fd, size)
    finally:
        os.close(fd)


def read_fd(fd: int, size: int) -> bytes:
    """Up to `size` bytes of the open file `fd` from its offset (os.read returns short reads
    on large files: read until `size` or the end)."""
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"a special file (mode {mode:o})"


def _link(path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def private_problem(path, directory: bool = True) -> str | None:
    """Why `path` is not private storage of this user, or None when it is: it must be a
    real directory (`directory`) or regular file, not a symbolic link (lstat), owned by
    the effective user and writable by nobody else (no group or world write bit)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    return mode_problem(st, directory)


def mode_problem(st: os.stat_result, directory: bool) -> str | None:
    """private_problem's rules on a stat result (an lstat, or an fstat of an open file)."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if directory and not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        return f"is {kind}, not a directory"
    if not directory and not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file"
    if not hasattr(os, "geteuid"):
        return None          # (Windows: no POSIX owner or mode bits to check)
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


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
            fd = os.open(path, _WRITE_FLAGS | os.O_TRUNC | direct, 0o644)
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
            with os.fdopen(os.open(path, _WRITE_FLAGS | os.O_APPEND, 0o644), "ab",
                           buffering=0) as fh:
                fh.write(memoryview(body[n:]))
                fh.write(trailer)
            return
    with os.fdopen(os.open(path, _WRITE_FLAGS | os.O_TRUNC, 0o644), "wb", buffering=0) as fh:
        fh.write(memoryview(body))
        fh.write(trailer)


def _staging(use: str, n: int) -> np.ndarray:
    """This thread's block-aligned buffer of at least `n` bytes for `use` (O_DIRECT needs
    aligned memory; a chunk that is not goes through it)."""
    have = work_arrays()
    buf = have.get(("staging", use))
    if buf is None or len(buf) < n:
        buf = have["staging", use] = aligned_empty((n,), np.uint8, BLOCK)
    return buf


def read_chunk_file(path, target: np.ndarray, direct: bool = False) -> tuple:
    """(bytes read, the next bytes up to 5): a chunk file's body into `target` (contiguous
    bytes), then its checksum trailer. A body the page cache does not hold is read past the
    cache with O_DIRECT with `direct`, where `target`'s address and size allow (no kernel
    copy through cache pages a run larger than the cache will not read again), else into
    the cache through a huge-page mapping (_read_mapped). A body the cache holds, even in
    part, is copied from the cache. Raises OSError (FileNotFoundError for a missing file,
    StorageError for anything but a regular file: open_regular)."""
    fd = open_regular(path, what="chunk file")
    try:
        view, n = memoryview(target).cast("B"), target.nbytes
        body = n // BLOCK * BLOCK
        got = 0
        cold = bool(body) and _cold(fd, body)
        if cold and direct:
            if target.ctypes.data % DIRECT_ALIGN == 0:
                got = _read_direct(path, view[:body])
            else:     # (a window's chunk at an odd place in its page: staged, then copied)
                stage = _staging("read", body)
                got = _read_direct(path, memoryview(stage)[:body])
                np.frombuffer(view, np.uint8)[:got] = stage[:got]
        elif cold:
            got = _read_mapped(path, np.frombuffer(view, np.uint8)[:body])
        while got < n:                     # (the cached way; the rest past a direct body)
            k = _pread_into(fd, view[got:], got)
            if k <= 0:
                break
            got += k
        return got, os.pread(fd, 5, got)
    finally:
        os.close(fd)


def _read_mapped(path, dst: np.ndarray) -> int:
    """The first len(dst) bytes of a chunk file into `dst` through a mapping that asks for
    huge pages (map_files), or 0 where it cannot (the caller reads them): the page cache
    then holds the chunk in 2 MiB folios, read in 2 MiB requests (three times read()'s
    speed from a cold cache on this machine's disk), which a later mapped run maps in a
    few steps (paging/mapped.py)."""
    fmap = map_files([path], len(dst)) if len(dst) % mmap.PAGESIZE == 0 else None
    if fmap is None:
        return 0
    try:
        fmap.populate(0, len(dst))
    except OSError:
        return 0                # (the file changed under it: read() says how)
    np.copyto(dst, np.asarray(fmap))
    return len(dst)


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


def cached_bytes(paths: list, nbytes: int) -> int:
    """Bytes of the first `nbytes` of each file of `paths` that the page cache holds
    (0 where it cannot tell or a file cannot be opened)."""
    total = 0
    for p in paths:
        try:
            fd = open_regular(p)
        except OSError:
            continue
        try:
            total += min((_cached_pages(fd, nbytes) or 0) * mmap.PAGESIZE, nbytes)
        finally:
            os.close(fd)
    return total


def _cold(fd: int, nbytes: int, offset: int = 0) -> bool:
    """Whether none of the file's bytes [offset, offset + nbytes) are in the page cache
    (elsewhere than Linux 6.5+ False: the cached way, always correct). A probe by reading
    would not do: a non-blocking read of an uncached page starts the readahead."""
    return _cached_pages(fd, nbytes, offset) == 0


def _cached_pages(fd: int, nbytes: int, offset: int = 0) -> int | None:
    """Memory pages of the file's bytes [offset, offset + nbytes) the page cache holds
    (cachestat(2)), or None where it cannot tell."""
    stat = _cachestat()
    if stat is None:
        return None
    rng, got = (ctypes.c_uint64 * 2)(offset, nbytes), (ctypes.c_uint64 * 5)()
    return int(got[0]) if stat(fd, rng, got) == 0 else None


@functools.lru_cache(maxsize=1)
def _cachestat():
    """cachestat(fd, range, out) through libc's syscall(), or None where there is none."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    nr = 451                       # (the same number on x86_64 and the generic table)
    probe = (ctypes.c_uint64 * 5)()
    if (libc.syscall(nr, -1, (ctypes.c_uint64 * 2)(0, 1), probe, 0) == 0 or
            ctypes.get_errno() == errno.ENOSYS):
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
    fd = open_regular(path, what="chunk file")
    try:
        if direct and _cold(fd, hi - lo, lo):
            stage = _staging("part", hi - lo)
            if (_read_direct(path, memoryview(stage)[:hi - lo], lo, exact=True) >=
                    offset - lo + n):
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
        fd = open_regular(path, direct) if direct else None
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


class FileMap:
    """The bodies of equal-sized files mapped read-only, back to back, into one address
    range: the page cache's own pages, no copy (a paged run reads its chunks this way,
    paging/mapped.py). numpy arrays over it (np.asarray) hold it; the range is unmapped
    when the last one goes. Each body must be whole memory pages and its file at least that
    long when mapped (map_files checks); populate() finds one cut short since."""

    def __init__(self, base: int, nbytes: int, paths: list):
        self.base, self.nbytes, self.paths = base, nbytes, paths
        self.derived: dict = {}     # what callers computed from these bytes, kept with them
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (base, True), "version": 3}

    def populate(self, lo: int, hi: int) -> None:
        """Map bytes [lo, hi) in, reading what the page cache lacks, in one call rather than
        a fault per page (MADV_POPULATE_READ, Linux 5.14+; older kernels fault as read).
        Raises OSError where a file no longer covers its body (what a read would SIGBUS)."""
        a, b = self._inward(lo, hi)
        if b > a and _libc().madvise(ctypes.c_void_p(self.base + a), ctypes.c_size_t(b - a),
                                     _MADV_POPULATE_READ) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOMEM):    # (no such advice: faults will do)
                body = self.nbytes // len(self.paths)
                raise OSError(err, f"{os.strerror(err)} mapping bytes [{a % body}:"
                              f"{a % body + b - a}) of {self.paths[a // body]}")

    def resident(self, parts: int) -> np.ndarray:
        """Whether all of each of `parts` equal parts of the range is mapped in this process
        now (/proc/self/pagemap's present bits; all False where it cannot tell). The kernel
        unmaps a page from every process before it evicts it, so a part present since its
        bytes were checked still holds those bytes unless its file was written."""
        page = mmap.PAGESIZE
        n = self.nbytes // page
        try:
            fd = os.open("/proc/self/pagemap", os.O_RDONLY)
            try:
                got = os.pread(fd, n * 8, self.base // page * 8)
            finally:
                os.close(fd)
        except OSError:
            return np.zeros(parts, bool)
        if len(got) != n * 8:
            return np.zeros(parts, bool)
        present = (np.frombuffer(got, np.uint64) >> np.uint64(63)).astype(bool)
        return present.reshape(parts, -1).all(axis=1)

    @staticmethod
    def _inward(lo: int, hi: int) -> tuple:
        page = mmap.PAGESIZE
        return -(-lo // page) * page, hi // page * page

    def __del__(self):
        try:
            _libc().munmap(ctypes.c_void_p(self.base), ctypes.c_size_t(self.nbytes))
        except Exception:    # noqa: BLE001 (interpreter shutdown: the process unmaps it)
            pass


# Linux's values on every architecture (Python 3.11's mmap module names none of them)
_PROT_NONE, _MAP_FIXED = 0, 0x10
_MADV_HUGEPAGE, _MADV_POPULATE_READ = 14, 22
HUGE = 2 << 20              # a huge page (x86-64 and arm64 with 4 KiB pages)


@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def map_files(paths: list, body: int) -> FileMap | None:
    """The first `body` bytes of each file of `paths`, back to back in one read-only
    mapping, or None where that cannot be done safely: not Linux, a body that is not whole
    memory pages, a file shorter than body + 4 (its checksum trailer: the store's layout),
    a failed mmap. The range asks for huge pages: what the page cache reads for it then
    comes in 2 MiB folios, which a later run maps in a few steps (a chunk read into the
    cache by read() comes in small folios: about 90 us a MiB to map, 1 us with huge ones)."""
    if sys.platform != "linux" or body <= 0 or body % mmap.PAGESIZE or not paths:
        return None
    fds = []
    try:
        for p in paths:
            fds.append(open_regular(p))
            if os.fstat(fds[-1]).st_size < body + 4:
                return None
        libc, total = _libc(), body * len(paths)
        # the range is reserved whole first (no access), then each body mapped over its
        # place; on a 2 MiB boundary, so that huge folios map whole (one entry each: fewer
        # faults and TLB misses than 512 small ones)
        held = libc.mmap(None, total + HUGE, _PROT_NONE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if held is None or held == ctypes.c_void_p(-1).value:
            return None
        base = -(-held // HUGE) * HUGE
        if base > held:                      # (the reservation's unaligned ends go back)
            libc.munmap(ctypes.c_void_p(held), ctypes.c_size_t(base - held))
        if held + HUGE > base:
            libc.munmap(ctypes.c_void_p(base + total), ctypes.c_size_t(held + HUGE - base))
        fmap = FileMap(base, total, list(paths))
        for k, fd in enumerate(fds):
            at = libc.mmap(base + k * body, body, mmap.PROT_READ,
                           mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
            if at != base + k * body:
                return None                  # (fmap unmaps the range as it goes)
        libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(total), _MADV_HUGEPAGE)
        return fmap
    except OSError:
        return None
    finally:
        for fd in fds:
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


MAPPED_MIN = 1 << 20       # aligned_empty(mapped=True): smaller buffers come from malloc


def aligned_empty(shape: tuple, dtype, align: int = 64, mapped: bool = False) -> np.ndarray:
    """np.empty on an `align`-byte boundary (64: kernels read these rows in place, an
    unaligned gathered field would be staged into an aligned copy first). `mapped`: from a
    mapping of its own (page-aligned), given back to the system when it goes, for buffers
    made and dropped by worker threads: malloc serves blocks below its mmap threshold
    (which it raises up to 32 MiB as large blocks are freed) from per-thread arenas that
    keep what is freed, and a paged run's page buffers (a few MiB each, made by its loader
    threads) left 150-250 MiB resident after 100M edges (benchmarks/PAGING_NOTES.md)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if (mapped and n >= MAPPED_MIN and align <= mmap.PAGESIZE and
            hasattr(mmap, "MAP_ANONYMOUS")):
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if n >= HUGE and hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)     # (fewer faults on first touch, as numpy asks)
        return np.frombuffer(m, np.uint8, n).view(dtype).reshape(shape)
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
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"{name}: fsync failed ({exc})") from exc
