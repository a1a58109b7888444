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
  format for every kind: the line `# tiga-artifact 3 <HMAC> <JSON header>` (key, kind,
  payload size and SHA-256, the kind's metadata such as the kernel signature), then the
  payload. The first line is a Python comment, so a Triton entry is the very source file
  Triton reads back. Writes are atomic (temporary file, fsync, rename). An entry that is not
  a regular file (FIFO, socket, device, directory, symbolic link), has another format (an
  older Tiga's), another key or kind, a size or checksum that does not match, or an HMAC
  this user's key did not make is discarded, counted and rebuilt, never handed to a loader;
  reading never blocks.
- trust: a loaded entry is code this process runs (a Triton module is exec'd, a library
  dlopen'd), so only this user's Tiga may have written it. The cache directory and its
  shard directories are made 0700; before an entry is read or written, lstat checks that
  they are real directories (no symbolic links) owned by this user and writable by nobody
  else, and the entry (fstat of the open file) that it is a regular file owned by this user
  and not group- or world-writable. A directory that fails is refused with a
  `CacheTrustWarning` naming it and the fix, and the process runs without the disk cache
  (as pip, ssh and numba do). Every entry's header carries an HMAC-SHA256 under a per-user
  secret key (32 random bytes in `cache_key_path()`, a 0600 file in a 0700 directory,
  checked the same way), so an entry another user or program planted is never loaded even
  where the checks above cannot see it (a copied or restored cache).
- statistics that count what really happened (`CacheStats`).
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import stat
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..memory.tiers.files import mode_problem, private_problem, read_fd, replace_file

FORMAT = b"# tiga-artifact 3 "
KEY_BYTES = 32              # the per-user HMAC key
_HMAC_HEX = 64
SUFFIX = ".tga"
# no kernel artifact comes near this; a larger "entry" is not ours and is never read in
MAX_ENTRY_BYTES = 1 << 30
MAX_HEADER_BYTES = 1 << 20


@functools.cache     # the sources are constant for the process: hashed once
def tiga_key() -> str:
    """Hash of every source file under tiga/lower (the renderers included): a compiler
    change invalidates every entry."""
    # (os.walk and plain strings, not Path.rglob: pathlib's per-path parsing was 15-20 ms
    # of a cold first call; the digest is the same, sorted as rglob's paths sort)
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lower")
    files = []
    for top, _dirs, names in os.walk(root):
        rel = os.path.relpath(top, root).replace(os.sep, "/")
        files += [((name,) if rel == "." else (*rel.split("/"), name), os.path.join(top, name))
                  for name in names if name.endswith(".py")]
    h = hashlib.sha256()
    for parts, path in sorted(files):
        h.update("/".join(parts).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def cache_dir() -> Path:
    """Read per call, so TIGA_CACHE_DIR can change within a process (tests do)."""
    return Path(os.environ.get("TIGA_CACHE_DIR") or Path.home() / ".cache" / "tiga")


class CacheTrustWarning(UserWarning):
    """The disk cache or its key failed a trust check: the process runs without the disk
    cache (compiled kernels are kept in memory only)."""


def cache_key_path() -> Path:
    """The per-user HMAC key of the disk cache: $XDG_CONFIG_HOME/tiga/cache-key (default
    ~/.config/tiga/cache-key), outside the cache, so a cache copied or restored from
    elsewhere brings no key its entries would pass."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "tiga" / "cache-key"


_KEYS: dict = {}         # key file path -> its key, read once it passed the checks
_KEY_LOCK = threading.Lock()


def _warn(path, problem: str, fix: str) -> None:
    msg = (f"tiga: running without the disk cache: {path} {problem}; a cache entry is code "
           f"Tiga runs, so only you may be able to write it. {fix}")
    _warn_once(msg)


@functools.cache    # each warning once per process (keyed by its text)
def _warn_once(msg: str) -> None:
    warnings.warn(msg, CacheTrustWarning, stacklevel=6)


def _dir_fix(path) -> str:
    return (f"Fix: make it a directory of your own that nobody else can write (chmod 700 "
            f"{path}; Tiga creates it so), or set TIGA_CACHE_DIR to one")


def trusted_dir(path, fix: str | None = None) -> bool:
    """Whether the cache directory `path` may be used: a real directory (lstat, no symbolic
    link) owned by this user that nobody else can write. A missing one is False quietly;
    any other failure warns once (naming it and the fix) and is False."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        _warn(path, f"cannot be examined ({exc.strerror})", fix or _dir_fix(path))
        return False
    problem = mode_problem(st, directory=True)
    if problem is not None:
        _warn(path, problem, fix or _dir_fix(path))
    return problem is None


def _make_private_dir(path: Path, fix: str | None = None) -> bool:
    """Create the directory `path` 0700 when missing (its parents as usual); then
    trusted_dir(path). False (quietly) where it cannot be created."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    return trusted_dir(path, fix)


def cache_secret(create: bool = False) -> bytes | None:
    """This user's HMAC key (cache_key_path()), made on first need with `create` (32
    random bytes, a 0600 file in a 0700 directory, linked in whole so two processes agree
    on one). None where there is none yet (without `create`) or it fails a check (a
    warning names the file and the fix): the process then runs without the disk cache."""
    path = cache_key_path()
    found = _KEYS.get(str(path))
    if found is not None:
        return found
    with _KEY_LOCK:
        found = _KEYS.get(str(path))
        if found is None:
            found = _read_secret(path, create)
            if found is not None:
                _KEYS[str(path)] = found
        return found


def _read_secret(path: Path, create: bool) -> bytes | None:
    fix = (f"Fix: remove {path} (Tiga makes a new key; entries made under the old one are "
           "rebuilt), or make it a 0600 file of your own in a 0700 directory")
    d = path.parent
    dir_fix = (f"Fix: chmod 700 {d} if it is yours, or set XDG_CONFIG_HOME to a directory of "
               "your own (the key lives in $XDG_CONFIG_HOME/tiga)")
    if create and not _make_private_dir(d, dir_fix):
        if os.path.lexists(d):
            return None                     # (trusted_dir warned)
        _warn(d, "cannot be created", "Fix: set XDG_CONFIG_HOME (or HOME) to a writable "
              "directory of your own")
        return None
    if not create and not trusted_dir(d, dir_fix):
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if not create or not _new_secret(path):
            return None
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            _warn(path, f"cannot be opened ({exc.strerror})", fix)
            return None
    except OSError as exc:
        _warn(path, "is a symbolic link, not a regular file" if os.path.islink(path) else
              f"cannot be opened ({exc.strerror})", fix)
        return None
    try:
        st = os.fstat(fd)
        problem = mode_problem(st, directory=False)
        if problem is None and hasattr(os, "geteuid") and st.st_mode & 0o077:
            problem = (f"can be read by its group or others (mode "
                       f"{stat.S_IMODE(st.st_mode):04o}, expected 0600)")
        if problem is None and st.st_size != KEY_BYTES:
            problem = f"holds {st.st_size} bytes, not a {KEY_BYTES}-byte key"
        if problem is not None:
            _warn(path, problem, fix)
            return None
        secret = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != KEY_BYTES:
        _warn(path, f"holds {len(secret)} bytes, not a {KEY_BYTES}-byte key", fix)
        return None
    return secret


def _new_secret(path: Path) -> bool:
    """Write a fresh key to a private temporary file and link it in at `path` (a
    concurrent process's key, linked first, wins: both then read that one)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.")
    except OSError as exc:
        _warn(path.parent, f"cannot hold the cache key ({exc.strerror})",
              "Fix: make it a writable directory of your own")
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:               # (a file system without hard links)
            try:
                os.rename(tmp, path)
            except OSError:
                return False
        return True
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


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
        """'memory', 'disk' or 'miss', without loading or building anything ('disk' only
        where the directories pass the trust checks: an entry there may be read)."""
        if key in self._mem:
            return "memory"
        path = entry_path(key)
        private = all(private_problem(d) is None for d in (path.parent.parent, path.parent))
        return "disk" if private and path.exists() else "miss"

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
            self._count("writes" if _store(key, built) else "disk_write_errors")
        return built.value

    def _from_disk(self, key: str, kind):
        path = entry_path(key)
        # (trust first: nothing under a directory someone else can write is even looked at)
        if not (trusted_dir(path.parent.parent) and trusted_dir(path.parent)):
            return None
        if not os.path.lexists(path):
            return None
        secret = cache_secret()
        if secret is None:
            return None          # no key yet: no entry of this user's Tiga to find
        entry = read_entry(path, key, kind.kinds, secret)
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


def _store(key: str, built: Built) -> bool:
    """Write `built`'s entry, in private directories under this user's key; False (the
    entry not written) where the directories cannot be made or fail their checks (a
    warning names them) or there is no key."""
    path = entry_path(key)
    if not _make_private_dir(path.parent.parent) or not _make_private_dir(path.parent):
        return False
    secret = cache_secret(create=True)
    if secret is None:
        return False
    return write_atomic(path, encode_entry(key, built.kind, built.payload, built.meta, secret))


def _mac(secret: bytes, header: bytes) -> bytes:
    return hmac.new(secret, FORMAT + header, hashlib.sha256).hexdigest().encode()


def encode_entry(key: str, kind: str, payload: bytes, meta: dict,
                 secret: bytes | None = None) -> bytes:
    """An entry's bytes: the header line (format, HMAC under `secret`, default this user's
    key, of the JSON header, which holds the payload's SHA-256), then the payload."""
    secret = secret if secret is not None else cache_secret(create=True)
    if secret is None:
        raise OSError(f"no usable cache key at {cache_key_path()}")
    header = json.dumps({"key": key, "kind": kind, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest(), "meta": meta},
                        sort_keys=True).encode()
    return FORMAT + _mac(secret, header) + b" " + header + b"\n" + payload


def read_entry(path: Path, key: str, kinds: tuple, secret: bytes | None = None):
    """(kind, payload, meta) of the entry at `path`, or None when anything about it is off:
    not a regular file of this user's that nobody else can write, another format, an HMAC
    that `secret` (default this user's key) did not make, another key or kind, a size or
    checksum mismatch."""
    secret = secret if secret is not None else cache_secret()
    if secret is None:
        return None
    try:
        data = read_regular(path, private=True)
        if data is None or not data.startswith(FORMAT):
            return None
        at = len(FORMAT) + _HMAC_HEX
        mac = data[len(FORMAT):at]
        end = data.index(b"\n", at, at + MAX_HEADER_BYTES)
        header_bytes = data[at + 1:end]
        if data[at:at + 1] != b" " or not hmac.compare_digest(mac, _mac(secret, header_bytes)):
            return None
        header = json.loads(header_bytes.decode())
        payload = data[end + 1:]
        if header.get("key") != key or header.get("kind") not in kinds:
            return None
        if header.get("size") != len(payload):
            return None
        if header.get("sha256") != hashlib.sha256(payload).hexdigest():
            return None
        meta = header.get("meta")
        return (header["kind"], payload, meta) if isinstance(meta, dict) else None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None


def read_regular(path: Path, private: bool = False) -> bytes | None:
    """The bytes of a regular file at `path`; None for anything else in its place.

    Opened non-blocking and without following a symbolic link, and checked with fstat
    before reading: a FIFO, socket, device, directory or link in the cache must not block
    or crash the process that finds it (a FIFO with no writer would block a plain open()
    forever). With `private`, a file another user owns or others can write is refused too
    (a warning names it).
    """
    flags = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) |
             getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        problem = mode_problem(st, directory=False) if private else None
        if problem is not None:
            _warn(path, f"{problem} (the entry is discarded)",
                  f"Fix: check who else can write {path.parent}")
            return None
        return read_fd(fd, st.st_size)
    finally:
        os.close(fd)


def write_atomic(path: Path, payload: bytes) -> bool:
    """Atomic write (a private temporary file, fsynced, renamed): a crash leaves either no
    entry or a complete one. False on failure."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(path, payload)
        return True
    except OSError:
        return False


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass       # (a directory in its place: the rebuilt entry cannot be written either)


__all__ = ["ArtifactCache", "Built", "CacheStats", "CacheTrustWarning", "CorruptEntry",
           "artifact_key", "cache_dir", "cache_key_path", "cache_secret", "entry_path",
           "encode_entry", "read_entry", "tiga_key", "trusted_dir", "write_atomic"]
