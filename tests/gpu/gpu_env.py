"""Where the GPU tests run and why they skip, in one place: on a CUDA device with compiled
Triton kernels, or with TIGA_GPU_TESTS_ON_CPU=1 through Triton's interpreter on CPU. Triton
reads TRITON_INTERPRET when it is imported, so a test module imports this before tiga; a
process that already imported Triton for its interpreter cannot compile kernels (`make test`
runs tests/gpu in a process of its own)."""
from __future__ import annotations

import os
import sys

import pytest

ON_CPU = os.environ.get("TIGA_GPU_TESTS_ON_CPU") == "1"
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1" if ON_CPU else "0"

torch = pytest.importorskip("torch")
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
