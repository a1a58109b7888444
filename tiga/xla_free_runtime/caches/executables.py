"""runtime: the cpu-llvm artifact kind, and `CACHE`, the process's one artifact cache.

The cache itself (key, memory layer, disk format, atomic writes, statistics) is
artifacts.py, shared by every backend; `CACHE` is its instance, which the Triton backends
use too. This module says what a cpu-llvm artifact is:

- key: `llvm_key(op_text, extra)` = artifact_key over the printed `gf_kernel.launch` op
  (propagate.kernel_text: edge and reducer regions, types, schedule), target cpu-llvm, the
  toolchain (optimisation level, llvmlite version, host CPU) and the walk's layout constants
  the print does not carry (`extra`);
- build: LLVM IR text -> object code -> a linked shared library (stored as kind "so"), or,
  with no C toolchain, object code for the MCJIT engine (kind "obj"); the header's metadata
  holds the kernel signature;
- load: dlopen the library through ctypes (a warm start never loads LLVM), or MCJIT the
  object code. A library that is whole but not loadable here (a noexec directory) is built
  again the MCJIT way.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import CompilationError
from ...lower.abi import KernelSignature
from ..backends.cpu.native import jit
from .artifacts import (
    ArtifactCache,
    Built,
    CacheStats,
    CorruptEntry,
    artifact_key,
    cache_dir,
    entry_path,
    tiga_key,
)

BACKEND = "cpu-llvm"
KINDS = ("so", "obj")


def toolchain() -> tuple:
    """What builds a cpu-llvm artifact: object code is host-specific."""
    return (f"O{jit.OPT_LEVEL}", jit.llvmlite_version(), jit.host_description())


def llvm_key(op_text: str, extra: tuple = ()) -> str:
    """The key of a cpu-llvm kernel: its printed Kernel op (or a fixed kernel's name) and
    what the renderer reads beside it."""
    return artifact_key(op_text, BACKEND, toolchain(), extra)


def full_key(parts: tuple) -> str:
    """llvm_key of a kernel named by a tuple (its name first, then what else its render
    reads): the form fixed kernels use."""
    return llvm_key(str(parts[0]), tuple(parts[1:]))


@dataclass
class Executable:
    """A compiled kernel: signature + native entry point; `origin` is compile/disk."""

    key: str
    signature: KernelSignature
    native: jit.NativeFunction
    origin: str
    ir_text: str | None = None
    # the Kernel op it was rendered from (a gf_kernel.launch or a backends.FixedKernel), set
    # by the plan that asked for it: what backends.launch dispatches on and names
    kernel: object = None


class LLVMArtifact:
    """The cpu-llvm artifact kind: `render(symbol) -> (LLVM IR text, signature)`."""

    kinds = KINDS

    def __init__(self, render):
        self.render = render

    def build(self, key: str) -> Built:
        symbol = symbol_for(key)
        text, sig = self.render(symbol)
        lib = None
        if jit.linker() is not None:
            try:
                lib = jit.link_shared(jit.compile_ir(text, pic=True))
            except CompilationError:
                lib = None        # a broken toolchain: the MCJIT way
        native = None
        if lib is not None:
            try:
                native = jit.load_shared(lib, symbol, _workdir())
            except OSError:
                native = None     # e.g. no directory allows executable mappings: MCJIT
        obj = None
        if native is None:
            obj = jit.compile_ir(text)
            native = jit.load_object(obj, symbol)
        exe = Executable(key, sig, native, "compile", text)
        meta = {"signature": sig.to_json()}
        # (the library is stored even where it could not be mapped: another host may)
        return Built(exe, "so", lib, meta) if lib is not None else Built(exe, "obj", obj, meta)

    def load(self, key: str, kind: str, code: bytes, meta: dict, path) -> Executable | None:
        sig = KernelSignature.from_json(meta["signature"])
        if sig.symbol != symbol_for(key):
            raise CorruptEntry(f"{path}: a signature of another kernel")
        if kind == "so":
            try:
                native = jit.load_shared(code, sig.symbol, _workdir())
            except OSError:
                return None       # whole but not loadable here: compile (the MCJIT way)
        else:
            native = jit.load_object(code, sig.symbol)
        return Executable(key, sig, native, "disk")


class ExecutableCache(ArtifactCache):
    """The artifact cache, with cpu-llvm's `get(key, render)` (`render(symbol) -> (ir_text,
    signature)`) beside the generic `get(key, kind)`."""

    def get(self, key: str, build):
        kind = build if hasattr(build, "kinds") else LLVMArtifact(build)
        return super().get(key, kind)


def symbol_for(key: str) -> str:
    return f"tiga_propagate_{key[:32]}"


def _workdir():
    """Where load_shared writes the library it dlopens (the cache directory when it exists,
    since temporary directories are sometimes mounted noexec)."""
    d = cache_dir()
    return d if d.is_dir() else None


CACHE = ExecutableCache()

__all__ = ["CACHE", "CacheStats", "Executable", "ExecutableCache", "LLVMArtifact", "full_key",
           "llvm_key", "symbol_for", "tiga_key", "entry_path", "toolchain"]
