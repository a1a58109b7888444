"""core: process-wide options, read from the environment and overridable at run time."""
from __future__ import annotations

import os
import warnings

# Kernel worker threads beyond this many per core only add switching and memory; a larger
# TIGA_NUM_THREADS is capped (with a warning) instead of starting hundreds of threads.
THREADS_PER_CORE = 4
_WARNED_THREADS: set = set()


def cpu_count() -> int:
    """The machine's CPU count, read once: os.cpu_count() reads /sys on every call (~15 us,
    measured), and a warm call asks for the thread count several times."""
    if not _CPU_COUNT:
        _CPU_COUNT.append(max(1, os.cpu_count() or 1))
    return _CPU_COUNT[0]


_CPU_COUNT: list = []    # the one CPU count of this process (constant, not per-call state)


def thread_cap() -> int:
    """The most kernel worker threads Tiga starts: THREADS_PER_CORE x the CPU count."""
    return THREADS_PER_CORE * cpu_count()


def env_num_threads(error: type[Exception]) -> int:
    """Kernel worker threads: TIGA_NUM_THREADS (default: the CPU count), capped at
    thread_cap() with a warning naming the variable. Anything but a positive decimal
    integer raises `error` naming the variable and the value found."""
    raw = os.environ.get("TIGA_NUM_THREADS", "").strip()
    if not raw:
        return cpu_count()
    digits = raw.isascii() and raw.isdigit()
    # a huge digit string is never converted (int() refuses more than 4300 digits): it is
    # over the cap anyway
    n = int(raw) if digits and len(raw) <= 18 else None
    if not digits or n == 0:
        raise error(f"TIGA_NUM_THREADS must be a positive integer, found {raw!r}")
    cap = thread_cap()
    if n is not None and n <= cap:
        return n
    if raw not in _WARNED_THREADS:
        _WARNED_THREADS.add(raw)
        shown = raw if len(raw) <= 20 else f"{raw[:12]}...({len(raw)} digits)"
        warnings.warn(f"TIGA_NUM_THREADS={shown} exceeds {THREADS_PER_CORE} x os.cpu_count() "
                      f"= {cap}; using {cap} threads", stacklevel=3)
    return cap


def env(name: str) -> str | None:
    """`os.environ.get(name)` at the cost of a dict lookup: a warm call reads TIGA_BACKEND and
    TIGA_NUM_THREADS, and os.environ.get encodes the name and decodes the value each time
    (~0.5 us apiece, measured). os.environ keeps its values in `_data` (encoded name ->
    encoded value); every change through os.environ (monkeypatch.setenv, patch.dict) updates
    it, so a value read here is always the current one. Anything but the os._Environ seen at
    import (os.environ replaced by a plain mapping) reads through `.get`."""
    if os.environ is not _ENVIRON or _DATA is None:
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENVIRON.encodekey(name)
    raw = _DATA.get(key)
    if raw is None:
        return None
    seen = _SEEN.get(name)
    if seen is None or seen[0] is not raw:     # (a new value object: decoded once)
        seen = _SEEN[name] = (raw, _ENVIRON.decodevalue(raw))
    return seen[1]


_ENVIRON = os.environ
_DATA = (_ENVIRON._data if type(getattr(_ENVIRON, "_data", None)) is dict and
    hasattr(_ENVIRON, "encodekey") and hasattr(_ENVIRON, "decodevalue") else None)
_KEYS: dict = {}   # name -> its encoded form (a memo of the encoding, never of a value)
_SEEN: dict = {}   # name -> (the encoded value last read, decoded): replaced as one tuple


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Config:
    """`tg.config.strict = True` (or TIGA_STRICT=1) turns any reference fallback into
    tg.UnsupportedError; `check` (TIGA_CHECK=1) runs check_program after every pass;
    `backend` (TIGA_BACKEND) picks where propagates run: "auto" (cpu-llvm for host inputs),
    "cpu-llvm", "triton" or "triton-interpreter" (lower/backends.py lists them)."""

    def __init__(self):
        self.strict = _flag("TIGA_STRICT")
        self.check = _flag("TIGA_CHECK")
        self._backend = None    # None: follow TIGA_BACKEND (read per call, like a test sets it)
        # tqdm bars for long store ingests and paged runs (TIGA_PROGRESS=0 silences them)
        self.progress = os.environ.get("TIGA_PROGRESS", "1").strip().lower() not in (
            "0", "false", "no", "off")

    @property
    def backend(self) -> str:
        if self._backend is not None:
            return self._backend
        raw = env("TIGA_BACKEND")
        return raw.strip() or "auto" if raw else "auto"

    @backend.setter
    def backend(self, name) -> None:
        self._backend = None if name is None else str(name)

    @property
    def backend_set(self) -> bool:
        return self._backend is not None

    def __repr__(self) -> str:
        return f"tg.config(strict={self.strict}, check={self.check}, backend={self.backend!r})"


config = Config()
