"""core: process-wide options, read from the environment and overridable at run time."""
from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Config:
    """`tg.config.strict = True` (or TIGA_STRICT=1) turns any reference fallback into
    tg.UnsupportedError; `check` (TIGA_CHECK=1) runs check_program after every pass."""

    def __init__(self):
        self.strict = _flag("TIGA_STRICT")
        self.check = _flag("TIGA_CHECK")

    def __repr__(self) -> str:
        return f"tg.config(strict={self.strict}, check={self.check})"


config = Config()
