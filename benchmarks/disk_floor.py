"""benchmarks: the disk's sequential bandwidth on a directory, for a paged run's floor (issue 28).

    python benchmarks/disk_floor.py DIR [--mib 2048]

A paged call cannot beat the disk it reads and writes: its floor is max(bytes read / read
bandwidth, bytes written / write bandwidth, the in-memory call). benchmarks/paging.py measures
both bandwidths here, on the store's own directory, in the same run as the paged calls.

  write  one file of `mib` MiB from one page-aligned 8 MiB buffer, O_DIRECT (the page cache
         out of the way, as storage/disk writes results and stores), then fsync: the time
         until the bytes are on the device
  read   the same file back with O_DIRECT into the same buffer: a cold sequential read,
         whatever the page cache holds (queue depth one, 8 MiB requests)

call_io() measures a paged call's own I/O with nothing else, on the store's files and the
result's bytes: reads alone, writes alone, and both at once (one device shares its bandwidth
between them, which max() above does not see).

A file system that refuses O_DIRECT (tmpfs, some overlays) gets buffered I/O instead: written
and fsynced, its pages dropped with posix_fadvise(DONTNEED) before the read (clean pages are
dropped, so the read is cold as far as the kernel allows); the result says so and why. Every
block carries its index, and the blocks read back are checked against it (untimed beyond one
comparison per block), so a path that lost data gives no figure.
"""
from __future__ import annotations

import argparse
import errno
import json
import mmap
import os
import sys
import time

import numpy as np

BLOCK = 8 << 20
REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


def _open(path: str, flags: int, direct: bool) -> int:
    return os.open(path, flags | (os.O_DIRECT if direct else 0), 0o600)


def _write(path: str, buf: mmap.mmap, blocks: int, direct: bool) -> float:
    """Seconds to write `blocks` blocks of `buf` (each stamped with its index) and fsync."""
    stamp = np.frombuffer(buf, np.int64, count=1)
    fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct)
    try:
        t = time.perf_counter()
        for k in range(blocks):
            stamp[0] = k
            done = 0
            while done < BLOCK:
                done += os.pwrite(fd, memoryview(buf)[done:], k * BLOCK + done)
        os.fsync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def _read(path: str, buf: mmap.mmap, blocks: int, direct: bool) -> float:
    """Seconds to read the file back block by block into `buf`; checks each block's stamp."""
    fd = _open(path, os.O_RDONLY, direct)
    stamp = np.frombuffer(buf, np.int64, count=1)
    try:
        if not direct:        # written and fsynced: its clean pages can be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        elapsed = 0.0
        for k in range(blocks):
            t = time.perf_counter()
            done = 0
            while done < BLOCK:
                n = os.preadv(fd, [memoryview(buf)[done:]], k * BLOCK + done)
                if n <= 0:
                    raise OSError(errno.EIO, f"{path}: short read at block {k}")
                done += n
            elapsed += time.perf_counter() - t
            if int(stamp[0]) != k:
                raise AssertionError(f"{path}: block {k} read back as block {int(stamp[0])}")
        return elapsed
    finally:
        os.close(fd)


def measure(directory: str, mib: int = 2048) -> dict:
    """Sequential write then read bandwidth (bytes/s) of `directory`'s disk, O_DIRECT where the
    file system takes it; the scratch file is removed."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".tiga-disk-floor-{os.getpid()}")
    blocks = max(1, (mib << 20) // BLOCK)
    buf = mmap.mmap(-1, BLOCK)               # page aligned, as O_DIRECT needs
    np.frombuffer(buf, np.uint8)[:] = np.random.default_rng(0).integers(
        0, 256, BLOCK, dtype=np.uint8)       # (incompressible, not all zeros)
    direct, why = True, None
    try:
        try:
            write_s = _write(path, buf, blocks, True)
        except OSError as exc:
            if exc.errno not in REFUSED:
                raise
            direct, why = False, f"O_DIRECT refused ({os.strerror(exc.errno)}): buffered " \
                                 "I/O, pages dropped with posix_fadvise before the read"
            write_s = _write(path, buf, blocks, False)
        read_s = _read(path, buf, blocks, direct)
    finally:
        if os.path.exists(path):
            os.remove(path)
        buf.close()
    nbytes = blocks * BLOCK
    return {"directory": os.path.abspath(directory), "bytes": nbytes, "block_bytes": BLOCK,
            "direct": direct, "fallback": why, "write_s": write_s, "read_s": read_s,
            "write_Bps": nbytes / write_s, "read_Bps": nbytes / read_s}


def _drop(files: list) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_files(files: list, buf: mmap.mmap) -> int:
    """Read `files` whole, each in one request into `buf` (O_DIRECT for its block-aligned
    part where the file system takes it, the rest through the page cache); bytes read."""
    total = 0
    for f in files:
        size = os.path.getsize(f)
        body = size // 4096 * 4096 if size <= len(buf) else 0
        if body:
            try:
                fd = _open(f, os.O_RDONLY, True)
            except OSError as exc:
                if exc.errno not in REFUSED:
                    raise
                body = 0
            else:
                try:
                    total += os.preadv(fd, [memoryview(buf)[:body]], 0)
                finally:
                    os.close(fd)
        with open(f, "rb", buffering=0) as fh:
            fh.seek(body)
            while True:
                n = fh.readinto(memoryview(buf)[:min(len(buf), max(size - body, 1))])
                if not n:
                    break
                total += n
    return total


def call_io(files: list, write_bytes: int, directory: str, readers: int = 2) -> dict:
    """A paged call's I/O with nothing else: the seconds to read `files` cold (`readers`
    threads, as the page loaders), to write `write_bytes` (one thread, O_DIRECT, fsynced, as
    the result writer), and to do both at once. On one device reads and writes share its
    bandwidth, so the last can exceed max(read, write): the floor a call that reads and
    writes meets on this machine, measured with the call's own bytes."""
    import threading
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".tiga-call-io-{os.getpid()}")
    bufs = [mmap.mmap(-1, max(BLOCK, max(map(os.path.getsize, files), default=0) + 4096))
            for _ in range(readers)]
    wbuf = mmap.mmap(-1, BLOCK)
    np.frombuffer(wbuf, np.uint8)[:] = 1
    blocks = -(-write_bytes // BLOCK)

    def timed(read: bool, write: bool) -> float:
        _drop(files)
        errors = []

        def job(fn, *args):
            try:
                fn(*args)
            except BaseException as exc:      # (raised below, in the caller's thread)
                errors.append(exc)
        jobs = [threading.Thread(target=job, args=(_read_files, files[i::readers], bufs[i]))
                for i in range(readers if read else 0)]
        if write:
            jobs.append(threading.Thread(target=job, args=(_write, path, wbuf, blocks, True)))
        t = time.perf_counter()
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        if errors:
            raise errors[0]
        return time.perf_counter() - t
    try:
        got = {"read_s": timed(True, False)}
        if blocks:
            got["write_s"] = timed(False, True)
            got["read_write_s"] = timed(True, True)
    finally:
        if os.path.exists(path):
            os.remove(path)
        for b in bufs + [wbuf]:
            b.close()
    return dict(got, files=len(files), read_bytes=sum(map(os.path.getsize, files)),
                write_bytes=blocks * BLOCK, readers=readers)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory")
    ap.add_argument("--mib", type=int, default=2048)
    a = ap.parse_args(argv)
    got = measure(a.directory, a.mib)
    print(json.dumps(got, indent=1))
    print(f"write {got['write_Bps'] / 1e9:.2f} GB/s, read {got['read_Bps'] / 1e9:.2f} GB/s"
          + ("" if got["direct"] else f" ({got['fallback']})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
