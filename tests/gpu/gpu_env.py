"""Where the GPU tests run and why they skip, in one place: on a CUDA device with compiled
Triton kernels, or through Triton's interpreter on CPU: TIGA_GPU_TESTS_ON_CPU=1 always,
"auto" (what `make test` sets) where torch sees no CUDA device, 0 never (they skip, saying
why). Triton reads TRITON_INTERPRET when it is imported, so a test module imports this
before tiga; a process that already imported Triton for its interpreter cannot compile
kernels (`make test` runs tests/gpu in a process of its own)."""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")     # (before triton: it decides the interpreter)

_MODE = os.environ.get("TIGA_GPU_TESTS_ON_CPU", "0")
ON_CPU = _MODE == "1" or (_MODE == "auto" and not torch.cuda.is_available())
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1" if ON_CPU else "0"

pytest.importorskip("triton")


def _why_skipped() -> str | None:
    if ON_CPU:
        return None
    if not torch.cuda.is_available():
        return "no CUDA device"
    import triton.language as tl
    if type(tl.standard.sum).__name__ == "InterpretedFunction":
        return ("triton was imported for its interpreter in this process (TRITON_INTERPRET=1, "
                "as tests/triton does): run tests/gpu in a process of its own")
    return None


WHY = _why_skipped()
DEVICE = "cpu" if ON_CPU else "cuda"
BACKEND = "triton-interpreter" if ON_CPU else "triton"
MARKS = [pytest.mark.gpu, pytest.mark.skipif(WHY is not None, reason=str(WHY))]
