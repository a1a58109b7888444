"""Triton tests run in Triton's interpreter on CPU; the directory is skipped without triton or
torch (so the suite passes where the gpu extra is not installed)."""
import os

import pytest

# Triton decides at its import whether tl.sum & co. are interpreted: set it before importing
os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

import tiga as tg  # noqa: E402


@pytest.fixture
def interpreter():
    """Route every propagate to triton-interpreter, strictly (no silent reference runs)."""
    old_backend, old_strict = tg.config._backend, tg.config.strict
    tg.config.backend, tg.config.strict = "triton-interpreter", True
    try:
        yield
    finally:
        tg.config.backend, tg.config.strict = old_backend, old_strict
