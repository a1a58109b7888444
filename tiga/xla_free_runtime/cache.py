"""runtime: the executable cache: one memory cache per process, native code on disk.

Key = the kernel's printed `gf_kernel.launch` op (propagate.kernel_text: edge and
reducer regions, types, schedule; the walk's layout constants beside it) + backend + frozen
options + `tiga_key()` (hash of Tiga's lowering sources) + llvmlite version + host CPU, so
nothing is bumped by hand. Disk entries
live in TIGA_CACHE_DIR (default ~/.cache/tiga) as `<key>.tgo`, in one of two layouts:

- a linked shared library (the usual case): the library bytes, then a JSON header (key,
  library size and sha256, kernel signature), its 8-byte length and `TIGASO01`. A warm
  start checks the entry and dlopens it through ctypes: LLVM is never loaded.
- object code for the MCJIT engine (no C toolchain on the host): `TIGAOBJ1\n`, the JSON
  header, a newline, the object bytes.

Writes are atomic (temporary file, fsync, rename). An entry whose layout, key, size or
checksum does not match, or that is not a regular file (a FIFO, socket, device or
directory), is discarded and rebuilt, never handed to the loader; reading never blocks.
Statistics count what really happened.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import CompilationError
from ..lower.abi import KernelSignature
from .backends.cpu.native import jit

MAGIC = b"TIGAOBJ1\n"
SO_MAGIC = b"TIGASO01"
BACKEND = "cpu-llvm"
# no kernel library comes near this; a larger "entry" is not ours and is never read into memory
MAX_ENTRY_BYTES = 1 << 30
_TIGA_KEY: list = []     # the source hash, computed once (constant for the process)


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
    """The cache key of one executable: its printed kernel (and any layout constants the
    print does not carry) with the backend, tool versions and Tiga's source hash."""
    frozen = (BACKEND, f"O{jit.OPT_LEVEL}", tiga_key(), jit.llvmlite_version(),
              jit.host_description())
    return hashlib.sha256(repr((parts, frozen)).encode()).hexdigest()


@dataclass
class Executable:
    """A compiled kernel: signature + native entry point; `origin` is compile/disk."""

    key: str
    signature: KernelSignature
    native: jit.NativeFunction
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

    def current(self, exe: Executable) -> bool:
        """Whether `exe` is still the entry of its key, so a caller's memo of it holds (a
        memory hit, counted as `get` counts one)."""
        if self._mem.get(exe.key) is not exe:
            return False
        with self._lock:
            self.stats.memory_hits += 1
        return True

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = CacheStats()

    def _compile(self, key: str, build) -> Executable:
        symbol = symbol_for(key)
        text, sig = build(symbol)
        native = None
        linked = jit.linker() is not None
        if linked:
            try:
                lib = jit.link_shared(jit.compile_ir(text, pic=True))
            except CompilationError:
                lib, linked = None, False     # a broken toolchain: the MCJIT way
        if linked and lib is not None:
            if not _write_atomic(_entry_path(key), _so_entry(key, lib, sig)):
                self.stats.disk_write_errors += 1
            try:
                native = jit.load_shared(lib, symbol, _workdir())
            except OSError:
                native = None     # e.g. no directory allows executable mappings: MCJIT
        if native is None:
            obj = jit.compile_ir(text)
            native = jit.load_object(obj, symbol)
            if not linked and not _write_atomic(_entry_path(key), _obj_entry(key, obj, sig)):
                self.stats.disk_write_errors += 1
        self.stats.misses += 1
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
        layout, code, sig = entry
        if layout == "so":
            try:
                native = jit.load_shared(code, sig.symbol, _workdir())
            except OSError:
                return None       # whole but not loadable here: compile (the MCJIT way)
        else:
            native = jit.load_object(code, sig.symbol)
        self.stats.disk_hits += 1
        return Executable(key, sig, native, "disk")


def symbol_for(key: str) -> str:
    return f"tiga_propagate_{key[:32]}"


def _entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.tgo"


def _workdir():
    """Where load_shared writes the library it dlopens (the cache directory when it exists,
    since temporary directories are sometimes mounted noexec)."""
    d = cache_dir()
    return d if d.is_dir() else None


def _header(key: str, code: bytes, sig: KernelSignature, layout: str) -> bytes:
    return json.dumps({"key": key, "layout": layout, "size": len(code),
                       "sha256": hashlib.sha256(code).hexdigest(),
                       "signature": sig.to_json()}).encode()


def _so_entry(key: str, lib: bytes, sig: KernelSignature) -> bytes:
    header = _header(key, lib, sig, "so")
    return lib + header + struct.pack("<Q", len(header)) + SO_MAGIC


def _obj_entry(key: str, obj: bytes, sig: KernelSignature) -> bytes:
    return MAGIC + _header(key, obj, sig, "obj") + b"\n" + obj


def _read_entry(path: Path, key: str):
    """(layout, code bytes, signature), or None when anything about the entry is off."""
    try:
        data = _read_regular(path)
        if data is None:
            return None
        if data.endswith(SO_MAGIC) and len(data) >= 16:
            (n,) = struct.unpack("<Q", data[-16:-8])
            if n > len(data) - 16:
                return None
            header_bytes, code, layout = data[-16 - n:-16], data[:-16 - n], "so"
        elif data.startswith(MAGIC):
            header_end = data.index(b"\n", len(MAGIC))
            header_bytes, code, layout = data[len(MAGIC):header_end], data[header_end + 1:], \
                "obj"
        else:
            return None
        header = json.loads(header_bytes.decode())
        if header.get("key") != key or header.get("layout") != layout:
            return None
        if header.get("size") != len(code):
            return None
        if header.get("sha256") != hashlib.sha256(code).hexdigest():
            return None
        sig = KernelSignature.from_json(header["signature"])
        if sig.symbol != symbol_for(key):
            return None
        return layout, code, sig
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, struct.error):
        return None


def _read_regular(path: Path) -> bytes | None:
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


def _write_atomic(path: Path, payload: bytes) -> bool:
    """Atomic write: a crash leaves either no entry or a complete one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tgo")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
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
