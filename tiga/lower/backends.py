"""lower: the backend table: a backend is a renderer of `gf_kernel.launch` ops plus a launcher.

`BACKENDS[name]` holds the renderer (LaunchOp -> source text), whether the backend is usable
in this process (and why not), and the launcher the runtime registers for it
(`register_launcher`, called by xla_free_runtime; this layer never imports the runtime).
`selected_backend()` reads `tg.config.backend` / TIGA_BACKEND.

- cpu-llvm: lower/render.py (LLVM text), launched by xla_free_runtime/llvm_propagate.py;
- triton: lower/triton (Triton source), compiled for the CUDA device by Triton;
- triton-interpreter: the same source run by Triton's interpreter on CPU (TRITON_INTERPRET=1
  while the generated module is imported), so every Triton kernel is tested without a GPU.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.config import config
from ..core.errors import UnsupportedError
from .ir import KernelModule, LaunchOp

AUTO = "auto"
TRITON_BACKENDS = ("triton", "triton-interpreter")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cuda_device_present() -> bool:
    """A CUDA device is visible (checked without importing torch or triton)."""
    return bool(shutil.which("nvidia-smi")) or os.path.exists("/dev/nvidia0")


def _llvm_available() -> tuple[bool, str]:
    from . import CPU_LLVM_AVAILABLE
    return CPU_LLVM_AVAILABLE, "" if CPU_LLVM_AVAILABLE else "llvmlite is not installed"


def _interpreter_available() -> tuple[bool, str]:
    missing = [m for m in ("triton", "torch") if not _has(m)]
    if missing:
        return False, (f"{' and '.join(missing)} not installed (the Triton interpreter takes "
                       "torch tensors; pip install -e '.[gpu,torch]')")
    return True, ""


def _gpu_available() -> tuple[bool, str]:
    ok, why = _interpreter_available()
    if not ok:
        return ok, why
    if not cuda_device_present():
        return False, "no CUDA device (no nvidia-smi, no /dev/nvidia0)"
    return True, ""


def _render_llvm(op: LaunchOp, symbol: str) -> str:
    from .render import render_launch
    return render_launch(op, symbol=symbol)


def _render_triton(op: LaunchOp, symbol: str) -> str:
    from .triton import render_launch
    return render_launch(op, symbol=symbol).text


@dataclass
class Backend:
    name: str
    render: Callable[[LaunchOp, str], str]
    availability: Callable[[], tuple[bool, str]]
    interpreter: bool = False
    launcher: object = field(default=None, repr=False)   # set by the runtime

    def available(self) -> tuple[bool, str]:
        return self.availability()


BACKENDS: dict[str, Backend] = {
    "cpu-llvm": Backend("cpu-llvm", _render_llvm, _llvm_available),
    "triton": Backend("triton", _render_triton, _gpu_available),
    "triton-interpreter": Backend("triton-interpreter", _render_triton,
                                  _interpreter_available, interpreter=True),
}
# the IR stage each backend's text is printed under (program.ir("triton", ...))
RENDER_STAGES = {"llvm": "cpu-llvm", "triton": "triton"}


def register_launcher(name: str, launcher) -> None:
    if name not in BACKENDS:
        raise UnsupportedError(f"register_launcher: no backend {name!r}",
                               hint=f"backends: {', '.join(BACKENDS)}")
    BACKENDS[name].launcher = launcher


def check_backend_name(name: str, where: str = "tg.config.backend") -> str:
    if name != AUTO and name not in BACKENDS:
        raise UnsupportedError(f"{where}: unknown backend {name!r}",
                               hint=f"use one of {AUTO}, {', '.join(BACKENDS)}")
    return name


def selected_backend() -> str:
    """The backend propagates run on: tg.config.backend, else TIGA_BACKEND, else "auto"
    (cpu-llvm for host inputs)."""
    name = config.backend
    where = "tg.config.backend" if config.backend_set else "TIGA_BACKEND"
    return check_backend_name(name, where)


def render_module(module: KernelModule, stage: str) -> str:
    """The text of every launch of a scheduled kernel-level module for one backend."""
    from .pipeline import _walk_ops

    backend = BACKENDS[RENDER_STAGES[stage]]
    launches = [op for op in _walk_ops(module.body) if isinstance(op, LaunchOp)]
    if not launches:
        return f"# {module.name}: no gf_kernel.launch to render\n"
    return "\n".join(backend.render(op, f"{module.name}_{i}") for i, op in enumerate(launches))
