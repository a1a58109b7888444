"""runtime: what tg.save may replace, and paths for tg.save / tg.load.

tg.save swaps a new array in by a rename, and the entry it replaces is deleted. So it
replaces without asking only an array it wrote itself; anything else needs overwrite=True,
and a store, a directory holding other files or the working directory are never replaced
(issue 27: `tg.save(t, os.getcwd())` once deleted the working directory).
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ...core.errors import StorageError
from ..memory.tiers.files import read_small
from .versions import is_store, store_of


def absolute(path, op: str) -> Path:
    """`path` of tg.`op` as an absolute Path (a relative one is resolved against the
    working directory once, so it cannot change under a save). An empty path is refused,
    and for a save one naming no entry of its own ('.', '..', a root): the swap would
    replace the directory that holds it."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise StorageError(f"{op}: path is a {type(path).__name__}, expected a str or "
                           "os.PathLike naming the array")
    text = os.fsdecode(os.fspath(path))
    name = os.path.basename(text.rstrip("/" + os.sep))
    if not text or (op == "save" and name in ("", ".", "..")):
        raise StorageError(f"{op}: path {text!r} names no file-system entry of its own "
                           "(empty, '.', '..' or a root); expected a path such as 'x.zarr'")
    return Path(os.path.abspath(text))


def check(path: Path, overwrite: bool):
    """What `path` holds is replaceable (module docstring of save), or a StorageError
    naming it; returns its identity (device, inode) to recheck at the swap, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError as exc:
        raise StorageError(f"save: {path} lies under {file_parent(path)}, a file, not a "
                           "directory") from exc
    except OSError as exc:
        raise StorageError(f"save: cannot inspect {path} ({exc})") from exc
    inside = store_of(path)
    if inside is not None:
        raise StorageError(f"save: {path} lies inside the store {inside}; tg.save never "
                           "writes into a store (use tg.store.create)")
    if st is None:
        return None
    what, replaceable = _describe(path, st)
    if what == "saved":
        return (st.st_dev, st.st_ino)
    if replaceable is None:
        raise StorageError(f"save: {path} is {what}; tg.save never replaces it, even with "
                           "overwrite=True (choose another path)")
    if not overwrite:
        raise StorageError(f"save: {path} is {what}, not an array tg.save wrote; pass "
                           "overwrite=True to replace it")
    return (st.st_dev, st.st_ino)


def _describe(path: Path, st) -> tuple:
    """(what is at `path`, True when overwrite=True may replace it / None never); what is
    "saved" for an array tg.save wrote."""
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link (to {os.readlink(path)!r}; only the link would go)", True
    if stat.S_ISREG(st.st_mode):
        return f"a regular file of {st.st_size} bytes", True
    if not stat.S_ISDIR(st.st_mode):
        return "a special file (a FIFO, socket or device)", True
    try:
        cwd = Path.cwd()
    except OSError:           # (the working directory was removed)
        cwd = None
    if cwd is not None and (path == cwd or path in cwd.parents):
        return "the working directory (or holds it)", None
    if is_store(path):
        return "a tg.store", None
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise StorageError(f"save: cannot list {path} ({exc})") from exc
    if not names:
        return "an empty directory", True
    if set(names) <= {"zarr.json", "c"} and _chunks_only(path / "c"):
        try:
            attrs = json.loads(read_small(path / "zarr.json", 1 << 20).decode("utf-8"))
        except (OSError, ValueError):
            attrs = None
        if isinstance(attrs, dict) and attrs.get("node_type") == "array":
            saved = "tiga_dtype" in (attrs.get("attributes") or {})
            return ("saved", True) if saved else ("a zarr array tg.save did not write", True)
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"a directory holding other files ({len(names)} entries: {shown})", None


def _chunks_only(c: Path) -> bool:
    """The chunk tree of a zarr array: integer-named entries only (and the temporaries of
    an interrupted chunk write), nothing a user put there."""
    if not c.exists():
        return True
    for _root, dirs, files in os.walk(c):
        for name in dirs + files:
            if not (name.isdigit() or (name.startswith(".") and name.endswith(".tmp"))):
                return False
    return True


def file_parent(path: Path) -> Path:
    """The nearest ancestor of `path` that exists and is not a directory (or the path's
    parent when there is none: the error came from elsewhere)."""
    for p in reversed(path.parents):
        if p.exists() and not p.is_dir():
            return p
    return path.parent
