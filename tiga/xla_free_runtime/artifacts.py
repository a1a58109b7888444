"""runtime: the one artifact cache: every backend's compiled kernels, in memory and on disk.

A backend supplies an *artifact kind*: how to build the payload of a key (cpu-llvm: LLVM
to a linked shared library or MCJIT object code, cache.py; triton: the rendered module
source, backends/triton/compile.py) and how to load a stored payload (dlopen, MCJIT, import).
Everything else is here, once:

- the key, `artifact_key(kernel_op_text, target, toolchain, extra)`: SHA-256 over the printed
  bound Kernel op, the target (backend name), the toolchain versions (llvmlite and the host
  CPU; triton), Tiga's source hash (`tiga_key()`) and what the renderer reads beside the op
  (the walk's layout constants, an edge permutation): nothing is bumped by hand;
- the memory layer: one dict per cache, filled under a per-key lock, so a kernel requested by
  many threads at once is built once and no thread sees a half-built entry, while different
  kernels build in parallel;
- the disk layer, `$TIGA_CACHE_DIR/<key[:2]>/<key>.tga` (default ~/.cache/tiga), one entry
  format for every kind: the line `# tiga-artifact 2 <JSON header>` (key, kind, payload size
  and SHA-256, the kind's metadata such as the kernel signature), then the payload. The first
  line is a Python comment, so a Triton entry is the very source file Triton reads back.
  Writes are atomic (temporary file, fsync, rename). An entry that is not a regular file
  (FIFO, socket, device, directory), has another format (an older Tiga's), another key or
  kind, or a size or checksum that does not match is discarded, counted and rebuilt, never
  handed to a loader; reading never blocks.
- statistics that count what really happened (`CacheStats`).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .memory.tiers.files import replace_file

FORMAT = b"# tiga-artifact 2 "
SUFFIX = ".tga"
# no kernel artifact comes near this; a larger "entry" is not ours and is never read in
MAX_ENTRY_BYTES = 1 << 30
MAX_HEADER_BYTES = 1 << 20
_TIGA_KEY: list = []     # the source hash, computed once (constant for the process)


def tiga_key() -> str:
    """Hash of every source file under tiga/lower (the renderers included): a compiler
    change invalidates every entry."""
    if not _TIGA_KEY:
        root = Path(__file__).resolve().parents[1] / "lower"
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
        _TIGA_KEY.append(h.hexdigest())
    return _TIGA_KEY[0]


def cache_dir() -> Path:
    """Read per call, so TIGA_CACHE_DIR can change within a process (tests do)."""
    return Path(os.environ.get("TIGA_CACHE_DIR") or Path.home() / ".cache" / "tiga")


def artifact_key(kernel_op_text: str, target: str, toolchain: tuple, extra: tuple = ()) -> str:
    """The key of one artifact: the printed bound Kernel op (or, for a fixed kernel with no
    op, its name), the backend it is built for, the toolchain that builds it, Tiga's source
    hash and whatever the renderer reads beside the op."""
    parts = (FORMAT.decode(), kernel_op_text, target, tuple(toolchain), tiga_key(),
             tuple(extra))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}{SUFFIX}"


@dataclass
class Built:
    """What an artifact kind's build returns: the loaded value, and the payload to store
    (`kind` None: nothing is stored)."""

    value: object
    kind: str | None = None
    payload: bytes = b""
    meta: dict = field(default_factory=dict)


class CorruptEntry(ValueError):
    """Raised by a kind's load when a whole entry's metadata does not describe its key."""


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0            # built from scratch (the toolchain or renderer ran)
    writes: int = 0            # entries written to disk
    corrupt_discarded: int = 0
    disk_write_errors: int = 0

    def as_dict(self) -> dict:
        return {"memory_hits": self.memory_hits, "disk_hits": self.disk_hits,
                "misses": self.misses, "writes": self.writes,
                "corrupt_discarded": self.corrupt_discarded,
                "disk_write_errors": self.disk_write_errors}


class ArtifactCache:
    """Memory dict in front of the disk store. `get(key, kind)` with `kind` an artifact kind:
    `kinds` (the entry kinds it stores), `build(key) -> Built` and `load(key, kind, payload,
    meta, path) -> value | None` (None: a whole entry this host cannot load: built again)."""

    def __init__(self):
        self._mem: dict[str, object] = {}
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self.stats = CacheStats()

    def status(self, key: str) -> str:
        """'memory', 'disk' or 'miss', without loading or building anything."""
        if key in self._mem:
            return "memory"
        return "disk" if entry_path(key).exists() else "miss"

    def get(self, key: str, kind):
        """The artifact of `key`: from memory, else the disk, else built (and stored)."""
        value = self._mem.get(key)
        if value is not None:
            with self._lock:      # (a warm call's path: no getattr/setattr of _count)
                self.stats.memory_hits += 1
            return value
        with self._lock:
            gate = self._building.setdefault(key, threading.Lock())
        try:
            with gate:     # one builder per key; others wait for it, then hit memory
                value = self._mem.get(key)
                if value is not None:
                    self._count("memory_hits")
                    return value
                value = self._from_disk(key, kind)
                if value is None:
                    value = self._build(key, kind)
                with self._lock:
                    self._mem[key] = value
                return value
        finally:
            with self._lock:
                self._building.pop(key, None)

    def current(self, value) -> bool:
        """Whether `value` is still the entry of its key (`value.key`), so a caller's memo of
        it holds (a memory hit, counted as `get` counts one)."""
        if self._mem.get(value.key) is not value:
            return False
        with self._lock:
            self.stats.memory_hits += 1
        return True

    def values(self) -> list:
        with self._lock:
            return list(self._mem.values())

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = CacheStats()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def _build(self, key: str, kind):
        built = kind.build(key)
        self._count("misses")
        if built.kind is not None:
            data = encode_entry(key, built.kind, built.payload, built.meta)
            self._count("writes" if write_atomic(entry_path(key), data) else
                        "disk_write_errors")
        return built.value

    def _from_disk(self, key: str, kind):
        path = entry_path(key)
        if not path.exists():
            return None
        entry = read_entry(path, key, kind.kinds)
        value = None
        if entry is not None:
            try:
                value = kind.load(key, *entry, path)
            except (ValueError, KeyError, TypeError):    # CorruptEntry included
                entry = None
            else:
                if value is None:
                    return None      # whole but not loadable here: built again
        if entry is None:
            self._count("corrupt_discarded")
            _discard(path)
            return None
        self._count("disk_hits")
        return value


def encode_entry(key: str, kind: str, payload: bytes, meta: dict) -> bytes:
    header = json.dumps({"key": key, "kind": kind, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta},
                        sort_keys=True).encode()
    return FORMAT + header + b"\n" + payload


def read_entry(path: Path, key: str, kinds: tuple):
    """(kind, payload, meta) of the entry at `path`, or None when anything about it is off:
    not a regular file, another format, key or kind, a size or checksum mismatch."""
    try:
        data = read_regular(path)
        if data is None or not data.startswith(FORMAT):
            return None
        end = data.index(b"\n", len(FORMAT), len(FORMAT) + MAX_HEADER_BYTES)
        header = json.loads(data[len(FORMAT):end].decode())
        payload = data[end + 1:]
        if header.get("key") != key or header.get("kind") not in kinds:
            return None
        if header.get("size") != len(payload) or \
                header.get("sha256") != hashlib.sha256(payload).hexdigest():
            return None
        meta = header.get("meta")
        return (header["kind"], payload, meta) if isinstance(meta, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file at `path`; None for anything else in its place.

    Opened non-blocking and checked with fstat before reading: a FIFO, socket, device or
    directory in the cache must not block or crash the process that finds it (a FIFO with
    no writer would block a plain open() forever).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic(path: Path, payload: bytes) -> bool:
    """Atomic write: a crash leaves either no entry or a complete one. False on failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, payload)
        return True
    except OSError:
        return False


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass       # (a directory in its place: the rebuilt entry cannot be written either)


__all__ = ["ArtifactCache", "Built", "CacheStats", "CorruptEntry", "artifact_key",
           "cache_dir", "entry_path", "encode_entry", "read_entry", "tiga_key",
           "write_atomic"]
