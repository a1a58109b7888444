"""Command line (`tiga info`, `tiga --version`): top-level facade layer; stdlib only, no torch."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import sys
from collections.abc import Sequence
from importlib import metadata

from .core.config import THREADS_PER_CORE, thread_cap

# Distribution names; versions come from package metadata so nothing optional is imported.
CORE_PACKAGES = ("numpy", "llvmlite", "zarr", "ml_dtypes")
OPTIONAL_PACKAGES = ("torch", "triton", "cuda-python", "mpi4py")


def dist_version(name: str) -> str | None:
    """Installed version of distribution `name`, or None; does not import it."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def tiga_version() -> str:
    """Version of the tiga package; tolerant of a partially built package."""
    try:
        from tiga import __version__  # lazy: tiga/__init__ may be heavy or broken

        return str(__version__)
    except Exception:
        pass
    return dist_version("tiga") or "unknown (not installed)"


def _lower_flag(name: str) -> bool:
    """True only if `tiga.lower` imports and sets `name = True` (the route exists)."""
    try:
        lower = importlib.import_module("tiga.lower")
    except Exception:
        return False
    return getattr(lower, name, False) is True


def cuda_device_hint() -> str | None:
    """How a CUDA device was detected (without torch), or None."""
    if shutil.which("nvidia-smi"):
        return "nvidia-smi found"
    if os.path.exists("/dev/nvidia0"):
        return "/dev/nvidia0 present"
    return None


def backend_status() -> list[tuple[str, str]]:
    """(backend, honest status line) for every route Tiga knows about."""
    llvmlite = dist_version("llvmlite")
    triton = dist_version("triton")
    device = cuda_device_hint()
    rows = [("reference", "available (numpy reference interpreter)")]

    if _lower_flag("CPU_LLVM_AVAILABLE") and llvmlite:
        rows.append(("cpu-llvm", f"available (llvmlite {llvmlite})"))
    elif llvmlite:
        rows.append(("cpu-llvm", f"not yet available: llvmlite {llvmlite} found, "
                                 "compiled route not built yet"))
    else:
        rows.append(("cpu-llvm", "unavailable: llvmlite not installed"))

    missing = []
    if not triton:
        missing.append("triton not installed (pip install -e '.[gpu]')")
    if not device:
        missing.append("no CUDA device (no nvidia-smi, no /dev/nvidia0)")
    if missing:
        rows.append(("triton-gpu", "unavailable: " + "; ".join(missing)))
    elif _lower_flag("TRITON_GPU_AVAILABLE"):
        rows.append(("triton-gpu", f"available (triton {triton}, {device})"))
    else:
        rows.append(("triton-gpu", f"not yet available: triton {triton} and a CUDA device "
                                   f"found ({device}), compiled route not built yet"))

    if not triton:
        rows.append(("triton-interpreter", "unavailable: triton not installed"))
    elif _lower_flag("TRITON_INTERPRETER_AVAILABLE"):
        rows.append(("triton-interpreter", f"available (triton {triton}, TRITON_INTERPRET=1)"))
    else:
        rows.append(("triton-interpreter", f"not yet available: triton {triton} found, "
                                           "compiled route not built yet"))
    return rows


def num_threads() -> tuple[int, str]:
    """Worker threads for compiled kernels and where the number came from."""
    raw = os.environ.get("TIGA_NUM_THREADS")
    default = os.cpu_count() or 1
    if raw is None:
        return default, "os.cpu_count()"
    try:
        value = int(raw)
    except ValueError:
        return default, f"os.cpu_count(); ignoring invalid TIGA_NUM_THREADS={raw!r}"
    if value < 1:
        return default, f"os.cpu_count(); ignoring TIGA_NUM_THREADS={raw!r} (must be >= 1)"
    if value > thread_cap():   # the runtime caps it too (core/config.py)
        return (thread_cap(), f"TIGA_NUM_THREADS={raw} capped at {THREADS_PER_CORE} x "
            "os.cpu_count()")
    return value, "TIGA_NUM_THREADS"


def cache_dir() -> tuple[str, str]:
    """Disk cache directory for compiled code and where it came from."""
    raw = os.environ.get("TIGA_CACHE_DIR")
    if raw:
        return os.path.expanduser(raw), "TIGA_CACHE_DIR"
    return os.path.join(os.path.expanduser("~"), ".cache", "tiga"), "default"


def info_lines() -> list[str]:
    """The report printed by `tiga info`."""
    lines = [f"tiga {tiga_version()}",
             f"python {platform.python_version()} ({platform.python_implementation()}) "
             f"{sys.executable}",
             "packages:"]
    for name in CORE_PACKAGES:
        lines.append(f"  {name:<20}{dist_version(name) or 'NOT INSTALLED (required)'}")
    for name in OPTIONAL_PACKAGES:
        lines.append(f"  {name:<20}{dist_version(name) or 'not installed'} (optional)")
    lines.append("backends:")
    for name, status in backend_status():
        lines.append(f"  {name:<20}{status}")
    threads, source = num_threads()
    lines.append(f"threads: {threads} ({source})")
    path, source = cache_dir()
    lines.append(f"cache dir: {path} ({source})")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiga", description="Tiga: a JIT compiler for graph message passing.")
    parser.add_argument("--version", action="version", version=f"tiga {tiga_version()}")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="versions, backends, threads and cache directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tiga` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        print("\n".join(info_lines()))
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
