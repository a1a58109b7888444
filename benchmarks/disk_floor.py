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
