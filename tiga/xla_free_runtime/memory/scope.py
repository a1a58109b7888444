"""runtime: tg.scope, nested storage options (budgets, spill dir, page rows, eviction).

Scopes live on a context-variable stack (threads and asyncio tasks see their own); each
option resolves to the innermost scope that sets it. The stack's root holds the process-wide
accounting of allocations made outside any scope and sets no option.
"""
from __future__ import annotations

import contextvars
import os
import re
import tempfile
from collections import OrderedDict
from pathlib import Path

from ...core.errors import StorageError

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
    elif isinstance(value, str) and (m := _SIZE.match(value)) and \
            m.group(2).lower() in _UNITS:
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
            _make_dir(self.spill_dir, "spill_dir")
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
    """Create the directory `path` (and its parents), or a StorageError naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
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
    """The innermost spill_dir, else a per-process directory under the system temp dir."""
    for s in reversed(_STACK.get()):
        if s.spill_dir is not None:
            return s.spill_dir
    path = Path(tempfile.gettempdir()) / f"tiga-spill-{os.getpid()}"
    _make_dir(path, "spill_dir (the default, under the system temp dir)")
    return path


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


