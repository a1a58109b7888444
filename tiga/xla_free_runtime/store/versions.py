"""runtime: store versions: the CURRENT pointer, claiming a version number, pruning.

Several processes may write one store at once (an ingest, the transposed build of a paged
`tg.grad`). A version directory `vNNNNNN` is claimed by creating it under the store lock (an
flock on the store directory) and stays claimed while its owner holds an flock on the
directory itself, until it commits or gives up. Claims, commits and prunes all run under
the store lock, so two owners never share a number, and a prune removes a version nobody
holds only (the kernel drops a killed process's locks, so its leftovers are removable).
Readers take no lock: a reader whose version is pruned finds its files gone, a StorageError.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import weakref
import zlib
from pathlib import Path

from ...core.errors import StorageError
from ..memory.tiers.files import fsync_dir, read_small, replace_file

try:
    import fcntl
except ImportError:        # pragma: no cover (no flock: numbers are still claimed by mkdir)
    fcntl = None

POINTER = "CURRENT"
MANIFEST = "manifest.json"
VERSION = re.compile(r"^v(\d{6})$")
SMALL_BYTES = 64 << 20     # a pointer or manifest larger than this is not the store's


def store_path(path, op: str) -> Path:
    """`path` of tg.store.`op` as a Path: a str or os.PathLike, not empty."""
    if not isinstance(path, (str, bytes, os.PathLike)) or not os.fspath(path):
        raise StorageError(f"tg.store.{op}: path is {path!r}, expected a non-empty str or "
                           "os.PathLike naming the store's directory")
    return Path(os.fsdecode(os.fspath(path)))


def versions(path: Path) -> list:
    """The numbers of the version directories under `path`, ascending."""
    try:
        return sorted(int(m.group(1)) for d in path.iterdir() if (m := VERSION.match(d.name)))
    except OSError as exc:
        raise StorageError(f"{path}: cannot list the store's versions ({exc})") from exc


def current(path: Path) -> str | None:
    """The committed version's directory name, checked to be one of this store's version
    directories (never `../other/v000001` or an absolute path); None when no CURRENT."""
    pointer = path / POINTER
    try:
        raw = read_small(pointer, SMALL_BYTES, "pointer")
    except FileNotFoundError:
        return None
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(f"{pointer}: cannot be read ({exc})") from exc
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise StorageError(f"{pointer}: pointer check failed: not UTF-8 text ({exc}); "
                           "expected one line naming a version directory vNNNNNN") from exc
    if not name:
        return None
    if not VERSION.match(name):
        raise StorageError(f"{pointer}: pointer check failed: names {name[:80]!r}, expected "
                           f"a version directory vNNNNNN inside {path}")
    return name


def version_dir(path: Path, name: str) -> Path:
    """The directory of version `name`, which must be a real directory of the store (a
    symbolic link would let a version live outside it)."""
    vdir = path / name
    if vdir.is_symlink():
        raise StorageError(f"{vdir}: pointer check failed: the version is a symbolic link "
                           f"to {os.readlink(vdir)!r}; a version must lie inside {path}")
    if not vdir.is_dir():
        raise StorageError(f"{vdir}: not found ({path / POINTER} names it); the store is "
                           "incomplete")
    return vdir


def is_store(path: Path) -> bool:
    """Whether `path` is (or is being ingested as) a store: a CURRENT pointer or version
    directories."""
    try:
        return (path / POINTER).exists() or any(
            VERSION.match(d.name) and d.is_dir() for d in path.iterdir())
    except OSError:
        return False


def store_of(path: Path) -> Path | None:
    """The store that `path` lies inside: an ancestor with a CURRENT pointer and version
    directories, or one holding only version directories (an ingest before its first
    commit) of which `path` is (under) one."""
    chain = [path, *path.parents]
    for child, p in zip(chain, chain[1:]):
        try:
            names = (os.listdir(p) if (p / POINTER).is_file() or VERSION.match(child.name)
                else ())
        except OSError:
            continue
        kinds = [VERSION.match(n) is not None for n in names if not n.startswith(".")]
        if any(kinds) and ((p / POINTER).is_file() or
                           (VERSION.match(child.name) and all(kinds))):
            return p
    return None


def previous(path: Path, name: str | None) -> str | None:
    """The committed version just below `name` (kept for readers that still hold it)."""
    if name is None:
        return None
    older = [v for v in versions(path) if f"v{v:06d}" < name and
             (path / f"v{v:06d}" / MANIFEST).exists()]
    return f"v{older[-1]:06d}" if older else None


# ---- locks --------------------------------------------------------------------------------

@contextlib.contextmanager
def locked(path: Path):
    """The store lock: held while claiming, committing or pruning (short sections)."""
    fd = _open_dir(path)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)           # (closing the descriptor drops the flock)


class Claim:
    """A version number held by this process: its directory's flock, dropped by release()
    (or when the owner dies)."""

    def __init__(self, path: Path, number: int):
        self.number, self.vdir = number, path / f"v{number:06d}"
        self._fd = _open_dir(self.vdir)
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._closer = weakref.finalize(self, os.close, self._fd)

    def release(self) -> None:
        self._closer()


def claim(path: Path) -> Claim:
    """A new version number and its (empty) directory, never one another owner holds.
    Leftovers of killed ingests or builds (uncommitted, unheld) are removed first, so their
    numbers are used again."""
    with locked(path):
        for v in versions(path):
            vdir = path / f"v{v:06d}"
            if not (vdir / MANIFEST).exists() and not held(vdir):
                shutil.rmtree(vdir, ignore_errors=True)
        number = max(versions(path), default=0) + 1
        while True:
            try:
                (path / f"v{number:06d}").mkdir()
                break
            except FileExistsError:     # (made meanwhile outside this protocol: skip it)
                number += 1
            except OSError as exc:
                raise StorageError(
                    f"{path}: cannot create version v{number:06d} ({exc})") from exc
        return Claim(path, number)


def held(vdir: Path) -> bool:
    """Whether a live process holds version directory `vdir` (its claim's flock)."""
    if fcntl is None:
        return False
    try:
        fd = _open_dir(vdir)
    except StorageError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def prune(path: Path, keep: set) -> None:
    """Remove every version not in `keep` that no live process holds (call under the store
    lock): older committed versions and leftovers of killed ingests or builds."""
    for v in versions(path):
        name = f"v{v:06d}"
        if name not in keep and not held(path / name):
            shutil.rmtree(path / name, ignore_errors=True)


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise StorageError(f"{path}: cannot open the directory ({exc})") from exc


# ---- commit files -------------------------------------------------------------------------

def with_checksum(manifest: dict) -> str:
    body = json.dumps(manifest, sort_keys=True)
    return json.dumps(dict(manifest, checksum=zlib.crc32(body.encode())), sort_keys=True,
                      indent=1)


def write_atomic(target: Path, text: str) -> None:
    """`text` into `target` by a fsynced temporary file renamed over it."""
    try:
        replace_file(target, text.encode())
        fsync_dir(target.parent)
    except OSError as exc:
        raise StorageError(f"{target}: write failed ({exc})") from exc


def switch(path: Path, name: str) -> None:
    """Make version `name` the store's (call under the store lock), then prune."""
    write_atomic(path / POINTER, f"{name}\n")
    prune(path, {name, previous(path, name)})
