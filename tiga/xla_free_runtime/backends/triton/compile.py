"""runtime/backends/triton: turn Triton source into launchable modules (the Triton artifact
kind of the one artifact cache, artifacts.py: build = the rendered module source, load = the
stored source checked and imported), and what every Triton kernel family (propagate,
attention, kNN selection) shares at launch: the interpreter switch (TRITON_INTERPRET, read by
Triton when it decorates and launches), the torch tensors the facade hands over (this layer
never imports torch) and a result as the executor holds it.
"""
from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
import types
from contextlib import contextmanager

from ....core.errors import UnsupportedError
from ....lower.abi import KernelSignature, KernelSource
from ....lower.backends import BACKENDS
from ...caches.artifacts import Built, CorruptEntry, artifact_key, entry_path
from ...caches.executables import CACHE
from .. import FixedKernel, KernelArgs, launch


def triton_version() -> str:
    try:
        from importlib import metadata
        return metadata.version("triton")
    except Exception:   # noqa: BLE001 - not installed: rendering still works
        return "none"


KIND = "triton-source"      # the artifact kind of a rendered Triton module


def symbol_for(key: str) -> str:
    return f"tiga_{key[:24]}"


def module_key(text: str, backend: str, extra: tuple = ()) -> str:
    """The artifact key of a Triton module: its printed Kernel op (or a fixed source's
    text), the backend (interpreted or not: decided when the module is imported), triton's
    version and what the renderer reads beside the op."""
    return artifact_key(text, backend, (triton_version(),), extra)


class TritonModule:
    """A Triton artifact: the rendered source and, from its first use, the imported module
    (importing runs @triton.jit, which reads TRITON_INTERPRET: once, on first launch)."""

    def __init__(self, key: str, source: KernelSource, backend: str, name: str):
        self.key, self.source, self.backend, self.name = key, source, backend, name
        self._module = None
        self._lock = threading.Lock()

    @property
    def imported(self) -> bool:
        return self._module is not None

    def module(self):
        if self._module is None:
            with self._lock:
                if self._module is None:
                    self._module = _exec_module(self.name, self.source.text,
                                                str(entry_path(self.key)), self.backend)
        return self._module


class TritonArtifact:
    """The Triton artifact kind: `render(symbol) -> KernelSource` builds the module source
    (its signature None for a fixed source); a stored one is loaded once it compiles as
    Python. `name(key)`: the module's name in sys.modules."""

    kinds = (KIND,)

    def __init__(self, backend: str, render, name=None):
        self.backend, self.render = backend, render
        self.name = name or (lambda key: f"tiga_triton_{key[:32]}")

    def build(self, key: str) -> Built:
        source = self.render(symbol_for(key))
        sig = source.signature
        return Built(TritonModule(key, source, self.backend, self.name(key)), KIND,
                     source.text.encode(), {"signature": sig.to_json() if sig else None})

    def load(self, key: str, kind: str, payload: bytes, meta: dict, path) -> TritonModule:
        text = payload.decode()
        try:
            compile(text, str(path), "exec")    # the body must be Python Triton can read
        except SyntaxError as exc:
            raise CorruptEntry(f"{path}: {exc}") from None
        sig = meta["signature"]
        source = KernelSource(text, KernelSignature.from_json(sig) if sig else None)
        if sig and source.signature.symbol != symbol_for(key):
            raise CorruptEntry(f"{path}: a signature of another kernel")
        return TritonModule(key, source, self.backend, self.name(key))


def _exec_module(name: str, text: str, path: str, backend: str):
    """Import a verified module source as `name`. Triton reads a kernel's source through
    linecache (at decoration, and the interpreter again at launch), so the lines it finds
    under `path` are primed with exactly the text run here (line 1 stands for the entry's
    header line, so they also match the file), and `get_source` serves them where the file
    is absent (an unwritable cache directory)."""
    source = "#\n" + text
    module = types.ModuleType(name)
    module.__file__ = path
    module.__loader__ = _Source(source)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    sys.modules[name] = module
    try:
        with interpret(backend):
            exec(compile(source, path, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class _Source:
    def __init__(self, text: str):
        self.text = text

    def get_source(self, name: str) -> str:
        return self.text


def _fixed_artifact(text: str, tag: str, backend: str) -> TritonModule:
    """The module artifact of a fixed Triton source (attention, kNN selection, tile
    matmul): in the one cache under its key, imported once per backend."""
    if BACKENDS[backend].interpreter:
        ensure_interpreter()
    key, kind = _fixed(text, tag, backend)
    return CACHE.get(key, kind)     # (a memory hit once imported; cleared: again)


def launch_fixed(text: str, tag: str, backend: str, kernel: str, grid: tuple, argv: tuple,
                 meta: dict) -> None:
    """Queue `kernel` of a fixed Triton source (attention, kNN selection, tile matmul) on
    `grid` through the backend table, as every Triton launch is: the module artifact is the
    executable, a FixedKernel named `triton_<tag>.<kernel>` the op (no propagate lowers to
    it)."""
    exe = _fixed_artifact(text, tag, backend)
    launch(exe, FixedKernel(f"triton_{tag}.{kernel}", "triton"),
           KernelArgs(jobs=[(getattr(exe.module(), kernel), grid, argv, meta)]))


# a launch asks for its fixed module every call, and hashing the source for the key each
# time costs more than the cache lookup: the key and artifact kind are a memo of the value
@functools.lru_cache(maxsize=64)
def _fixed(text: str, tag: str, backend: str) -> tuple:
    """(artifact key, artifact kind) of a fixed source for `backend`."""
    return module_key(text, backend, (tag,)), TritonArtifact(
        backend, lambda symbol: KernelSource(text, None),
        lambda key: f"tiga_triton_{tag}_{key[:16]}")


def fixed_held(text: str, tag: str, backend: str) -> bool:
    """Whether the one cache holds this fixed module in memory (explain's cache line)."""
    return CACHE.status(_fixed(text, tag, backend)[0]) == "memory"


# true once triton's library was seen interpreted (fixed at import); a failure raises, which
# functools.cache does not keep, so the next call asks again
@functools.cache
def ensure_interpreter() -> None:
    """Triton decides at its own import whether its library functions (tl.sum, tl.zeros...)
    are interpreted: TRITON_INTERPRET=1 must be set before triton is first imported. It is
    set here when triton is not imported yet; a triton imported without it cannot run the
    interpreter, which is an error naming the variable. (Checked once: a warm call asks.)"""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl

    if type(tl.standard.sum).__name__ != "InterpretedFunction":
        raise UnsupportedError(
            "triton-interpreter: triton was imported without TRITON_INTERPRET=1, so its "
            "library functions are compiled-only and cannot run in the interpreter",
            hint="set TRITON_INTERPRET=1 in the environment (or select the backend before "
                 "anything imports triton)")


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


__all__ = ["TritonArtifact", "TritonModule", "module_key", "symbol_for", "launch_fixed",
           "ensure_interpreter", "interpret", "tensors", "launch_result", "triton_version",
           "fixed_held", "HOOKS"]
