"""core: process-wide options, read from the environment and overridable at run time."""
from __future__ import annotations

import os
import warnings

from .errors import TigaError

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


class ConfigError(TigaError, ValueError, TypeError):
    """A setting has a value outside its documented set: a tg.config field given a value of
    the wrong type, or a TIGA_* environment variable with an unknown value. The message
    names the setting, the accepted values and what was found.

    What to do: set the value to one the message lists (see the environment page).
    """


TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
# the IR stages TIGA_DUMP names (lower/pipeline.py's STAGES; a test keeps them equal)
DUMP_STAGES = ("domain", "iter", "kernel", "task")


def env_flag(name: str, default: bool = False) -> bool:
    """A yes/no environment variable: 1/true/yes/on or 0/false/no/off (any case, spaces
    ignored); unset or empty: `default`. Anything else raises ConfigError naming the
    variable, the accepted values and the value found."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE or value in FALSE:
        return value in TRUE
    raise ConfigError(f"{name}={_shown(raw)} is not a yes/no value; accepted: "
                      f"{', '.join(TRUE)} (enable), {', '.join(FALSE)} (disable), or unset "
                      f"(default: {'enabled' if default else 'disabled'})")


def env_dump_stages(name: str = "TIGA_DUMP") -> set:
    """The IR stages TIGA_DUMP names: a comma-separated list of DUMP_STAGES, or `all`;
    unset or empty: none. An unknown stage raises ConfigError naming the variable."""
    raw = os.environ.get(name, "")
    stages = {s.strip() for s in raw.split(",") if s.strip()}
    if "all" in stages:
        return set(DUMP_STAGES)
    unknown = stages - set(DUMP_STAGES)
    if unknown:
        raise ConfigError(f"{name}={_shown(raw)} names unknown stage(s) "
                          f"{', '.join(map(repr, sorted(unknown)))}; expected a "
                          f"comma-separated list of {', '.join(DUMP_STAGES)}, or all")
    return stages


def _shown(raw: str) -> str:
    return repr(raw) if len(raw) <= 40 else repr(raw[:32] + "...")


def _bool_setting(name: str, value) -> bool:
    if type(value) is not bool:
        raise ConfigError(f"tg.config.{name} must be a bool (True or False), got "
                          f"{type(value).__name__} {_shown(repr(value))[1:-1]}")
    return value


class Config:
    """`tg.config.strict = True` (or TIGA_STRICT=1) turns any reference fallback into
    tg.UnsupportedError; `check` (TIGA_CHECK=1) runs check_program after every pass;
    `backend` (TIGA_BACKEND) picks where propagates run: "auto" (cpu-llvm for host inputs),
    "cpu-llvm", "triton" or "triton-interpreter" (lower/backends.py lists them); `progress`
    (TIGA_PROGRESS, default on) shows tqdm bars for long store ingests and paged runs.

    Every field is validated: `strict`, `check` and `progress` take a bool only (the string
    "false" is truthy, so it is refused, never stored), `backend` a str or None. The
    environment is read when Tiga is imported: a TIGA_STRICT, TIGA_CHECK, TIGA_PROGRESS,
    TIGA_TF32, TIGA_PIN_MALLOC or TIGA_DUMP value outside its documented set raises
    ConfigError naming the variable (TIGA_NUM_THREADS and TIGA_DIST_TIMEOUT are checked
    where they are read, TIGA_BACKEND on every call)."""

    __slots__ = ("strict", "check", "progress", "_backend")
    # (plain slots, read as they are: a warm call reads strict and check several times, and
    # a property's call costs 0.1 us each; writes are validated by __setattr__)
    _BOOLS = frozenset(("strict", "check", "progress"))

    def __init__(self):
        self.strict = env_flag("TIGA_STRICT")
        self.check = env_flag("TIGA_CHECK")
        self.progress = env_flag("TIGA_PROGRESS", True)
        # checked now, read again where they act: lowering as it dumps, a Triton launch
        # (TIGA_TF32), the first call (TIGA_PIN_MALLOC)
        env_dump_stages()
        env_flag("TIGA_TF32")
        env_flag("TIGA_PIN_MALLOC", True)
        self._backend = None    # None: follow TIGA_BACKEND (read per call, like a test sets it)

    def __setattr__(self, name: str, value) -> None:
        if name in Config._BOOLS:
            value = _bool_setting(name, value)
        elif name == "backend":
            Config.backend.__set__(self, value)
            return
        object.__setattr__(self, name, value)

    @property
    def backend(self) -> str:
        if self._backend is not None:
            return self._backend
        raw = env("TIGA_BACKEND")
        return raw.strip() or "auto" if raw else "auto"

    @backend.setter
    def backend(self, name) -> None:
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"tg.config.backend must be a backend name (a str such as "
                              f"'auto', 'cpu-llvm', 'triton', 'triton-interpreter') or None "
                              f"(follow TIGA_BACKEND), got {type(name).__name__}")
        self._backend = name

    @property
    def backend_set(self) -> bool:
        return self._backend is not None

    def __repr__(self) -> str:
        return f"tg.config(strict={self.strict}, check={self.check}, backend={self.backend!r})"


config = Config()
