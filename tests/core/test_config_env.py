"""core.config.env reads a variable from os.environ's own dict (a warm call reads
TIGA_BACKEND and TIGA_NUM_THREADS that way): after every kind of change made through
os.environ it answers what os.environ.get answers. Oracle: os.environ.get."""
from __future__ import annotations

import os
from unittest import mock

from tiga.core.config import config, env

NAME = "TIGA_TEST_ENV_READ"


def _same():
    assert env(NAME) == os.environ.get(NAME)


def test_env_follows_every_change_through_os_environ(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    _same()
    for value in ("1", " spaced ", "", "ünïcode", "x" * 300, "1"):   # ("1" again: a new
        monkeypatch.setenv(NAME, value)                                # object, same text)
        _same()
    os.environ[NAME] = "direct"
    _same()
    with mock.patch.dict(os.environ, {NAME: "patched"}):
        _same()
    _same()
    with mock.patch.dict(os.environ, clear=True):
        _same()
    _same()
    del os.environ[NAME]
    _same()
    os.environ.update({NAME: "updated"})
    _same()
    os.environ.pop(NAME)
    _same()


def test_a_replaced_os_environ_is_read_through_get(monkeypatch):
    monkeypatch.setattr(os, "environ", {NAME: "plain mapping"})
    assert env(NAME) == "plain mapping"


def test_backend_setting_follows_the_variable(monkeypatch):
    monkeypatch.setattr(config, "_backend", None)
    monkeypatch.delenv("TIGA_BACKEND", raising=False)
    assert config.backend == "auto"
    monkeypatch.setenv("TIGA_BACKEND", "  cpu-llvm ")
    assert config.backend == "cpu-llvm"
    monkeypatch.setenv("TIGA_BACKEND", "   ")
    assert config.backend == "auto"
    config.backend = "triton"
    assert config.backend == "triton"
