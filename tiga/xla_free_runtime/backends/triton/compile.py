"""runtime/backends/triton: turn Triton source into launchable modules, and what every
Triton kernel family (propagate, attention, kNN selection) shares at launch: the interpreter
switch (TRITON_INTERPRET, read by Triton when it decorates and launches), the torch tensors
the facade hands over (this layer never imports torch) and a result as the executor holds it.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager

from ....core.errors import UnsupportedError
from ....lower.abi import KernelSource
from ....lower.backends import BACKENDS
from . import cache as triton_cache


def triton_version() -> str:
    try:
        from importlib import metadata
        return metadata.version("triton")
    except Exception:   # noqa: BLE001 - not installed: rendering still works
        return "none"


def import_source(key: str, source: KernelSource, backend: str):
    """Import the module stored on disk (Triton reads a kernel's source file, so it must
    exist there: a file removed since is written again); the interpreter flag is read when
    @triton.jit runs."""
    path = triton_cache.path_of(key)
    if not path.exists() or path.read_text() != source.text:
        triton_cache.write(key, source.text)
    name = f"tiga_triton_{key[:32]}_{backend.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with interpret(backend):
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def import_text(text: str, tag: str, backend: str):
    """The module of a fixed Triton source (attention, kNN selection): stored in the disk
    cache under its key and imported once per backend."""
    if BACKENDS[backend].interpreter:
        ensure_interpreter()
    key = triton_cache.module_key(text, (tag,), backend, triton_version())
    name = f"tiga_triton_{tag}_{key[:16]}_{backend.replace('-', '_')}"
    found = sys.modules.get(name)
    if found is not None:
        return found
    if triton_cache.load(key) is None or not triton_cache.path_of(key).exists():
        triton_cache.store(key, text, "{}")
    spec = importlib.util.spec_from_file_location(name, triton_cache.path_of(key))
    module = importlib.util.module_from_spec(spec)
    with interpret(backend):
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def ensure_interpreter() -> None:
    """Triton decides at its own import whether its library functions (tl.sum, tl.zeros...)
    are interpreted: TRITON_INTERPRET=1 must be set before triton is first imported. It is
    set here when triton is not imported yet; a triton imported without it cannot run the
    interpreter, which is an error naming the variable. (Checked once: a warm call asks.)"""
    if _INTERPRETS:
        return
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl

    if type(tl.standard.sum).__name__ != "InterpretedFunction":
        raise UnsupportedError(
            "triton-interpreter: triton was imported without TRITON_INTERPRET=1, so its "
            "library functions are compiled-only and cannot run in the interpreter",
            hint="set TRITON_INTERPRET=1 in the environment (or select the backend before "
                 "anything imports triton)")
    _INTERPRETS.append(True)


_INTERPRETS: list = []   # [True] once triton's library was seen interpreted (fixed at import)


@contextmanager
def interpret(backend: str):
    """TRITON_INTERPRET as the backend needs it while Triton decorates or launches (Triton
    reads it at both times, also in modules it imports lazily on the first launch)."""
    old = os.environ.get("TRITON_INTERPRET")
    want = "1" if BACKENDS[backend].interpreter else "0"
    if old == want or (old is None and want == "0"):   # (unset reads as "0" to Triton)
        # a warm call: the environment already says it (no putenv and restore per launch)
        yield
        return
    os.environ["TRITON_INTERPRET"] = want
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


# The torch side (tiga/torch_bridge/triton_buffers.py), handed over by the facade (tiga/api.py):
# this layer never imports torch.
HOOKS: dict = {}


def tensors():
    loader = HOOKS.get("tensors")
    if loader is None:
        raise UnsupportedError("the Triton backends need the torch bridge (Triton launches on "
                               "torch tensors)", hint="import tiga (its facade registers it)")
    return loader()


def launch_result(buf, x, dtype: str, device: str):
    """A kernel's output as the executor holds it: numpy under the interpreter (CPU), else a
    torch tensor left on the GPU (the next kernel or the torch caller reads it there; the
    executor copies it to the host for anything else)."""
    return buf.to_numpy(x, dtype) if device == "cpu" else buf.from_array(x, dtype, device)


__all__ = ["import_source", "import_text", "ensure_interpreter", "interpret", "tensors",
           "launch_result", "triton_version", "HOOKS"]
