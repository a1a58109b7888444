"""runtime: the executable cache: one memory cache per process, object code on disk.

Key = program structure hash + input types + static params + backend + frozen options +
`tiga_key()` (hash of Tiga's lowering sources) + llvmlite version + host CPU. Disk entries
live in TIGA_CACHE_DIR (default ~/.cache/tiga) as `<key>.tgo`: a magic line, a JSON header
(key, object size and sha256, kernel signature) and the object code. Writes are atomic
(temporary file, fsync, rename). An entry whose header, size or checksum does not match is
deleted and rebuilt, never handed to LLVM. Statistics count what really happened.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..lower.llvm import KernelSignature
from . import llvm_jit

MAGIC = b"TIGAOBJ1\n"
BACKEND = "cpu-llvm"
_TIGA_KEY: list = []


def tiga_key() -> str:
    """Hash of every source file under tiga/lower: a compiler change invalidates entries."""
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


def full_key(parts: tuple) -> str:
    """The cache key of one executable from its structural parts."""
    frozen = (BACKEND, f"O{llvm_jit.OPT_LEVEL}", tiga_key(), llvm_jit.llvmlite_version(),
              llvm_jit.host_description())
    return hashlib.sha256(repr((parts, frozen)).encode()).hexdigest()


@dataclass
class Executable:
    """A compiled kernel: signature + native entry point; `origin` is compile/disk."""

    key: str
    signature: KernelSignature
    native: llvm_jit.NativeFunction
    origin: str
    ir_text: str | None = None


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0            # compiled from scratch (LLVM ran)
    corrupt_discarded: int = 0
    disk_write_errors: int = 0
    unsupported: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"memory_hits": self.memory_hits, "disk_hits": self.disk_hits,
                "misses": self.misses, "corrupt_discarded": self.corrupt_discarded,
                "disk_write_errors": self.disk_write_errors}


class ExecutableCache:
    """Memory dict in front of the disk directory; builds under a lock (no double compile)."""

    def __init__(self):
        self._mem: dict[str, Executable] = {}
        self._lock = threading.RLock()
        self.stats = CacheStats()

    def status(self, key: str) -> str:
        """'memory', 'disk' or 'miss', without loading or compiling anything."""
        if key in self._mem:
            return "memory"
        return "disk" if _entry_path(key).exists() else "miss"

    def get(self, key: str, build) -> Executable:
        """The executable for `key`; `build(symbol) -> (ir_text, signature)` on a miss."""
        exe = self._mem.get(key)
        if exe is not None:
            with self._lock:
                self.stats.memory_hits += 1
            return exe
        with self._lock:
            exe = self._mem.get(key)
            if exe is not None:
                self.stats.memory_hits += 1
                return exe
            exe = self._from_disk(key)
            if exe is None:
                exe = self._compile(key, build)
            self._mem[key] = exe
            return exe

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = CacheStats()

    def _compile(self, key: str, build) -> Executable:
        symbol = symbol_for(key)
        text, sig = build(symbol)
        obj = llvm_jit.compile_ir(text)
        native = llvm_jit.load_object(obj, symbol)
        self.stats.misses += 1
        if not _write_entry(key, obj, sig):
            self.stats.disk_write_errors += 1
        return Executable(key, sig, native, "compile", text)

    def _from_disk(self, key: str) -> Executable | None:
        path = _entry_path(key)
        if not path.exists():
            return None
        entry = _read_entry(path, key)
        if entry is None:
            self.stats.corrupt_discarded += 1
            try:
                path.unlink()
            except OSError:
                pass
            return None
        obj, sig = entry
        native = llvm_jit.load_object(obj, sig.symbol)
        self.stats.disk_hits += 1
        return Executable(key, sig, native, "disk")


def symbol_for(key: str) -> str:
    return f"tiga_propagate_{key[:32]}"


def _entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.tgo"


def _read_entry(path: Path, key: str):
    """(object bytes, signature), or None when anything about the entry is off."""
    try:
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            return None
        header_end = data.index(b"\n", len(MAGIC))
        header = json.loads(data[len(MAGIC):header_end].decode())
        obj = data[header_end + 1:]
        if header.get("key") != key or header.get("size") != len(obj):
            return None
        if header.get("sha256") != hashlib.sha256(obj).hexdigest():
            return None
        sig = KernelSignature.from_json(header["signature"])
        if sig.symbol != symbol_for(key):
            return None
        return obj, sig
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _write_entry(key: str, obj: bytes, sig: KernelSignature) -> bool:
    """Atomic write: a crash leaves either no entry or a complete one."""
    path = _entry_path(key)
    header = json.dumps({"key": key, "size": len(obj), "sha256": hashlib.sha256(obj).hexdigest(),
                         "signature": sig.to_json()}).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tgo")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + header + b"\n" + obj)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return True
    except OSError:
        return False


CACHE = ExecutableCache()
