"""Triton tests run in Triton's interpreter on CPU; without triton or torch every module of the
directory is a reported skip naming the import error (so the suite passes where the gpu extra
is not installed, and says so: `make test` itself fails when the extra it installed does not
import)."""
import os

import pytest

# Triton decides at its import whether tl.sum & co. are interpreted: set it before importing
os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError as exc:
    _WHY = f"needs the gpu extra (triton) and torch: {exc}"

    class _SkippedModule(pytest.Module):
        def collect(self):
            pytest.skip(_WHY)

    def pytest_pycollect_makemodule(module_path, parent):
        return _SkippedModule.from_parent(parent, path=module_path)

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
