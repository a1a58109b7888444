"""runtime: tg.scope, nested storage options (budgets, spill dir, page rows, eviction).

Scopes live on a context-variable stack (threads and asyncio tasks see their own); each
option resolves to the innermost scope that sets it. The stack's root holds the process-wide
accounting of allocations made outside any scope and sets no option.

Spill files hold tensor data, so where they go is checked: with no spill_dir set they go to
a fresh private directory from tempfile.mkdtemp (mode 0700, an unpredictable name, removed
when the process exits); a named spill_dir must be a real directory (not a symbolic link)
owned by this user and writable by nobody else, or a shared sticky directory such as /tmp,
in which a private mkdtemp directory is made for the spills. Anything else is a
StorageError naming the directory, what was found and the fix.
"""
from __future__ import annotations

import atexit
import contextvars
import os
import re
import shutil
import stat
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from ...core.errors import StorageError
from .tiers.files import mode_problem

TIERS = ("host", "device", "disk")
EVICTIONS = ("none", "lru")
DEFAULT_PAGE_ROWS = 65536
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value, what: str) -> int:
    """A byte count from an int or a string such as '4GiB', '512MiB', '1.5GB', '4096'."""
    if isinstance(value, bool):
        raise StorageError(f"{what}: is {value!r}, expected a byte count such as '4GiB'")
    if isinstance(value, int):
        n = value
    elif (isinstance(value, str) and (m := _SIZE.match(value)) and
            m.group(2).lower() in _UNITS):
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise StorageError(f"{what}: is {value!r}, expected a byte count: an int or a "
                           "string such as '4GiB', '512MiB', '100MB'")
    if n < 0:
        raise StorageError(f"{what}: is {value!r}, expected a byte count >= 0")
    return n


class Scope:
    """One level of tg.scope: its own options (None = inherit) and its accounting."""

    def __init__(self, budgets=None, spill_dir=None, page_rows=None, eviction=None):
        self.budgets = _read_budgets(budgets)
        self.spill_dir = None if spill_dir is None else _read_spill_dir(spill_dir)
        if page_rows is not None and (isinstance(page_rows, bool) or
                                      not isinstance(page_rows, int) or page_rows < 1):
            raise StorageError(f"page_rows: is {page_rows!r}, expected an int >= 1")
        self.page_rows = page_rows
        if eviction is not None and eviction not in EVICTIONS:
            raise StorageError(f"eviction: is {eviction!r}, expected one of "
                               f"{', '.join(map(repr, EVICTIONS))} or None")
        self.eviction = eviction
        self.used = dict.fromkeys(TIERS, 0)     # bytes charged to this scope, live
        self.peak = dict.fromkeys(TIERS, 0)
        self.lru: OrderedDict = OrderedDict()   # id(tensor) -> weakref, least recent first
        self._token = None

    def __enter__(self) -> Scope:
        if self._token is not None:
            raise StorageError("tg.scope: this scope is already active; make a new one")
        if self.spill_dir is not None:
            _private_dir(self.spill_dir)
        self._token = _STACK.set(_STACK.get() + (self,))
        return self

    def __exit__(self, *exc) -> None:
        _STACK.reset(self._token)
        self._token = None

    def report(self) -> dict:
        return report_of(self)

    def __repr__(self) -> str:
        opts = {k: v for k, v in (("budgets", self.budgets), ("spill_dir", self.spill_dir),
                                  ("page_rows", self.page_rows),
                                  ("eviction", self.eviction)) if v}
        return f"tg.scope({', '.join(f'{k}={v!r}' for k, v in opts.items())})"


def _read_spill_dir(value) -> Path:
    if not isinstance(value, (str, bytes, os.PathLike)) or not os.fspath(value):
        raise StorageError(f"spill_dir: is {value!r}, expected a directory path (a str or "
                           "os.PathLike)")
    path = Path(os.fsdecode(os.fspath(value)))
    if path.exists() and not path.is_dir():
        raise StorageError(f"spill_dir: {path} is a file, not a directory; spill files "
                           "need a directory")
    return path


def _make_dir(path: Path, what: str) -> None:
    """Create the directory `path` (its parents as usual, itself 0700), or a StorageError
    naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not path.is_dir():
                raise
    except (FileExistsError, NotADirectoryError) as exc:
        raise StorageError(f"{what}: {path} is (or lies under) a file, not a directory; "
                           "spill files need a directory") from exc
    except OSError as exc:
        raise StorageError(f"{what}: cannot create the directory {path} ({exc})") from exc


def _read_budgets(budgets) -> dict:
    if budgets is None:
        return {}
    if not isinstance(budgets, dict):
        raise StorageError(f"budgets: is {type(budgets).__name__}, expected a dict "
                           "{tier: bytes} with tiers host, device, disk")
    out = {}
    for tier, value in budgets.items():
        if tier not in TIERS:
            raise StorageError(f"budgets: tier {tier!r} is unknown, expected one of "
                               f"{', '.join(TIERS)}")
        out[tier] = parse_bytes(value, f"budgets[{tier!r}]")
    return out


ROOT = Scope()
_STACK: contextvars.ContextVar = contextvars.ContextVar("tiga_scope_stack", default=(ROOT,))


def scope(budgets: dict | None = None, spill_dir=None, page_rows: int | None = None,
          eviction: str | None = None) -> Scope:
    """`with tg.scope(budgets={"host": "4GiB"}, spill_dir=..., page_rows=65536,
    eviction="lru"):` storage options for the block; scopes nest, the innermost value of
    each option wins."""
    return Scope(budgets, spill_dir, page_rows, eviction)


def chain() -> tuple:
    """The active scopes, outermost (the root) first."""
    return _STACK.get()


def current() -> Scope:
    return _STACK.get()[-1]


def budget_scope(tier: str):
    """The innermost scope that sets a budget for `tier` (None: unlimited)."""
    for s in reversed(_STACK.get()):
        if tier in s.budgets:
            return s
    return None


def page_rows() -> int:
    for s in reversed(_STACK.get()):
        if s.page_rows is not None:
            return s.page_rows
    return DEFAULT_PAGE_ROWS


def eviction() -> str:
    for s in reversed(_STACK.get()):
        if s.eviction is not None:
            return s.eviction
    return "none"


def spill_dir() -> Path:
    """Where spill files go: the innermost spill_dir (checked by _private_dir: the
    directory itself, or a private one made inside a shared sticky one), else this
    process's private temporary directory."""
    for s in reversed(_STACK.get()):
        if s.spill_dir is not None:
            return _private_dir(s.spill_dir)
    return _default_dir()


_MADE: dict = {}     # (pid, path) -> a private directory made for it (defaults, sticky dirs)
_MADE_LOCK = threading.Lock()


def _default_dir() -> Path:
    """This process's spill directory under the system temp dir: tempfile.mkdtemp's (mode
    0700, a name nobody can predict), made on first use, removed at exit. (Never a fixed
    name: one a neighbour can guess is one they can plant a symbolic link at first.)"""
    try:
        return _made((os.getpid(), None), None)
    except OSError as exc:
        raise StorageError(f"spill_dir (the default): cannot create a private directory "
                           f"under {tempfile.gettempdir()} ({exc}); set one with "
                           "tg.scope(spill_dir=...)") from exc


def _made(key: tuple, parent) -> Path:
    """The private directory made for `key` (made now, in `parent`, when there is none)."""
    found = _MADE.get(key)
    if found is not None and found.is_dir():
        return found
    with _MADE_LOCK:
        found = _MADE.get(key)
        if found is None or not found.is_dir():
            found = _MADE[key] = Path(tempfile.mkdtemp(prefix="tiga-spill-", dir=parent))
        return found


def _private_dir(path: Path) -> Path:
    """The directory spill files go to for a named spill_dir `path` (created 0700 when
    missing): `path` itself when this user owns it, it is no symbolic link and nobody else
    can write it; a private directory made inside it when it is a sticky directory that
    others may write (/tmp: the sticky bit keeps them from renaming or removing what is
    not theirs); otherwise a StorageError naming it, what was found and the fix."""
    _make_dir(path, "spill_dir")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StorageError(f"spill_dir: cannot examine {path} ({exc})") from exc
    problem = mode_problem(st, directory=True)
    if problem is None:
        return path
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid in (0, uid):
        try:
            return _made((os.getpid(), str(path)), path)
        except OSError as exc:
            raise StorageError(f"spill_dir: cannot create a private directory in {path} "
                               f"({exc})") from exc
    raise StorageError(
        f"spill_dir: {path} {problem}; spill files hold tensor data, which another user "
        "could then read, replace or redirect. Use a directory of your own (mkdir -m 700, "
        f"or chmod go-w {path}), a sticky shared one such as /tmp, or leave spill_dir unset "
        "(a private temporary directory)")


@atexit.register
def _remove_made() -> None:
    """The private directories this process made (not a forked child's parent's)."""
    for (pid, _), made in list(_MADE.items()):
        if pid == os.getpid():
            shutil.rmtree(made, ignore_errors=True)


def spill_path(stem: str) -> Path:
    """A fresh path for a spill file (removed when its tensor dies)."""
    return spill_dir() / f"{stem}-{os.getpid()}-{os.urandom(6).hex()}.zarr"
def report_of(s) -> dict:
    """Per tier {"bytes", "peak", "budget"} of scope `s` (its budget: the innermost one
    set at or above it)."""
    stack = chain()
    upto = stack[:stack.index(s) + 1] if s in stack else (s,)

    def budget(tier):
        for x in reversed(upto):
            if tier in x.budgets:
                return x.budgets[tier]
        return None

    return {tier: {"bytes": s.used[tier], "peak": s.peak[tier], "budget": budget(tier)}
            for tier in TIERS}


