"""tests/gpu: every test runs in strict mode on the Triton route (gpu_env.py says where)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def strict_triton():
    """Strict: a propagate that cannot run on Triton is an error, not a reference run. On
    the GPU the CUDA inputs pick the triton backend; on CPU the interpreter is selected."""
    from gpu_env import ON_CPU

    import tiga as tg
    old = tg.config._backend, tg.config.strict
    tg.config.strict = True
    if ON_CPU:
        tg.config.backend = "triton-interpreter"
    try:
        yield
    finally:
        tg.config.backend, tg.config.strict = old
