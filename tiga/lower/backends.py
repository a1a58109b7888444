"""lower: the renderer table: each backend name's renderer of `gf_kernel.launch` ops.

`BACKENDS[name]` holds the renderer (LaunchOp -> abi.KernelSource), the kernel-ABI target it
renders for (the Kernel op's schedule target; abi.relation_descriptor's `target`) and whether
the backend is usable in this process (and why not). The runtime's backend table
(xla_free_runtime/backends: one object per target that plans, compiles and launches) renders
through it; this layer never imports the runtime.
`selected_backend()` reads `tg.config.backend` / TIGA_BACKEND.

- cpu-llvm: lower/llvm/render.py (LLVM text and signature, from the launch op and the
  call data its text cannot carry);
- triton: lower/triton (Triton source), compiled for the CUDA device by Triton;
- triton-interpreter: the same source run by Triton's interpreter on CPU (TRITON_INTERPRET=1
  while the generated module is imported), so every Triton kernel is tested without a GPU.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.config import config
from ..core.errors import UnsupportedError
from .ir import KernelModule, LaunchOp, walk_ops

try:  # the cpu-llvm backend needs llvmlite
    import llvmlite  # noqa: F401
except ImportError:  # pragma: no cover - llvmlite is a core dependency
    CPU_LLVM_AVAILABLE = False
else:
    CPU_LLVM_AVAILABLE = True

AUTO = "auto"


def _has(module: str) -> bool:
    # (imported: installed; a warm triton call asks every time)
    if sys.modules.get(module) is not None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cuda_device_present() -> bool:
    """A CUDA device is visible (checked without importing torch or triton). Once seen it is
    remembered: a warm triton call asks every time, and a PATH search costs stat calls."""
    if _CUDA_SEEN:
        return True
    found = bool(shutil.which("nvidia-smi")) or os.path.exists("/dev/nvidia0")
    if found:
        _CUDA_SEEN.append(True)
    return found


_CUDA_SEEN: list = []    # [True] once a CUDA device was seen (a device does not go away)


def _llvm_available() -> tuple[bool, str]:
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


def _render_llvm(op: LaunchOp, symbol: str, call=None):
    from .llvm.render import render
    return render(op, symbol=symbol, call=call)


def _render_triton(op: LaunchOp, symbol: str, call=None):
    from .triton import render_launch
    return render_launch(op, symbol=symbol)


@dataclass
class Backend:
    name: str
    target: str              # abi.TARGETS: the kernel ABI its renderer produces
    # (op, symbol, call data or None) -> abi.KernelSource (text and signature)
    render: Callable[..., object]
    availability: Callable[[], tuple[bool, str]]
    interpreter: bool = False

    def available(self) -> tuple[bool, str]:
        return self.availability()


BACKENDS: dict[str, Backend] = {
    "cpu-llvm": Backend("cpu-llvm", "cpu-llvm", _render_llvm, _llvm_available),
    "triton": Backend("triton", "triton", _render_triton, _gpu_available),
    "triton-interpreter": Backend("triton-interpreter", "triton", _render_triton,
                                  _interpreter_available, interpreter=True),
}
# the IR stage each backend's text is printed under (program.ir("triton", ...))
RENDER_STAGES = {"llvm": "cpu-llvm", "triton": "triton"}


def targets_triton(name: str) -> bool:
    """The backend `name` renders Triton kernels (its Kernel ops' target is "triton"): the
    CUDA backend and its interpreter alike."""
    found = BACKENDS.get(name)
    return found is not None and found.target == "triton"


def check_backend_name(name: str, where: str = "tg.config.backend") -> str:
    if name != AUTO and name not in BACKENDS:
        raise UnsupportedError(f"{where}: unknown backend {name!r}",
                               hint=f"use one of {AUTO}, {', '.join(BACKENDS)}")
    return name


class _Chosen(threading.local):
    # (a class default: getattr(local, name, None) on a missing attribute costs an internal
    # AttributeError, ~0.7 us, on every warm call's selected_backend())
    name: str | None = None


_CALL = _Chosen()   # the backend one call's inputs chose (using_backend)


@contextmanager
def using_backend(name: str | None) -> Iterator[None]:
    """Run the enclosed execution on backend `name` (the backend a call's CUDA inputs chose;
    None: no change). Thread-local, so concurrent calls on other threads are not affected."""
    old = _CALL.name
    _CALL.name = name if name is not None else old
    try:
        yield
    finally:
        _CALL.name = old


def route_for_devices(devices: Mapping[str, str], selected: str, *, strict: bool,
                      gpu: tuple[bool, str]) -> str | None:
    """The backend a call whose inputs live on `devices` ({field label: 'cpu' | 'cuda:N' |
    other accelerator}) runs on, given the selected backend, strict mode and whether the
    triton GPU backend is usable (`gpu`: (ok, why not)). None: every input is on the host
    (the selected backend decides as usual). Never a silent copy of CUDA data to the host:
    CUDA inputs run on `triton`, or this raises UnsupportedError naming the field."""
    off_host = [(label, dev) for label, dev in devices.items() if dev != "cpu"]
    if not off_host:
        return None
    label, dev = off_host[0]
    if not dev.startswith("cuda"):
        raise UnsupportedError(f"{label}: lives on {dev}; Tiga runs on the host (cpu-llvm) "
                               "and on CUDA devices (triton), not on this device",
                               hint="copy it to the host (.cpu()) or to a CUDA device")
    if selected in (AUTO, "triton"):
        ok, why = gpu
        if not ok:
            raise UnsupportedError(f"{label}: lives on {dev}, so the call runs on the triton "
                                   f"backend, which is unavailable: {why}",
                                   hint="install the gpu extra (pip install -e '.[gpu]') on a "
                                        "machine with a CUDA device, or pass host data "
                                        "(.cpu()) to run on the CPU")
        return "triton"
    if strict:
        raise UnsupportedError(f"{label}: lives on {dev}, but the selected backend "
                               f"{selected!r} runs on the CPU; strict mode refuses a CPU "
                               "fallback for CUDA inputs",
                               hint="select backend 'triton' or 'auto', or pass host data "
                                    "(.cpu())")
    return selected   # an explicit CPU backend for CUDA data: the caller asked for it


def selected_backend() -> str:
    """The backend propagates run on: the one a call's CUDA inputs chose (using_backend),
    else tg.config.backend, else TIGA_BACKEND, else "auto" (cpu-llvm for host inputs)."""
    chosen = _CALL.name
    if chosen is not None:
        return chosen
    name = config.backend
    if name == AUTO or name in BACKENDS:   # (a warm call: no error text to choose)
        return name
    where = "tg.config.backend" if config.backend_set else "TIGA_BACKEND"
    return check_backend_name(name, where)


def render_module(module: KernelModule, stage: str) -> str:
    """The text of every launch of a scheduled kernel-level module for one backend."""
    backend = BACKENDS[RENDER_STAGES[stage]]
    launches = [op for op in walk_ops(module.body) if isinstance(op, LaunchOp)]
    if not launches:
        return f"# {module.name}: no gf_kernel.launch to render\n"
    return "\n".join(backend.render(op, f"{module.name}_{i}").text
                     for i, op in enumerate(launches))
