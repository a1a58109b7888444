"""runtime: compile LLVM IR text to native code (llvmlite MCJIT) and call it through ctypes.

One target machine per process (host CPU name and features) and one MCJIT engine that
collects every object file, so a symbol is loaded once whether it came from a fresh
compile or from the disk cache. LLVM is not thread-safe for compilation: every call into it
holds `_LOCK`. Calls into compiled kernels go through ctypes, which releases the GIL.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from ..core.errors import CompilationError

_LOCK = threading.RLock()
_STATE: dict = {}

KERNEL_CTYPE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
# <kernel>_drive(bounds, n_chunks, next_chunk, argv): the chunk loop (lower/llvm/kernel.py)
DRIVE_CTYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_void_p)
DRIVER_SUFFIX = "_drive"
OPT_LEVEL = 3
# LLVM's tuning for this CPU family prefers 256-bit vectors; a 32-float row is then 4
# loads and 4 adds per edge instead of 2. Turned off (512-bit) when the host has AVX-512.
PREFER_512_BIT = True


def _llvm():
    import llvmlite.binding as llvm

    return llvm


def _init() -> dict:
    """Target machine + engine, created once (under the lock)."""
    if _STATE:
        return _STATE
    llvm = _llvm()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    features = llvm.get_host_cpu_features().flatten()
    if PREFER_512_BIT and "+avx512f" in features.split(","):
        features += ",-prefer-256-bit"
    tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features,
                                      opt=OPT_LEVEL, reloc="default", codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    _STATE.update(tm=tm, engine=engine, triple=llvm.get_process_triple(),
                  cpu=llvm.get_host_cpu_name(), features=features, loaded={})
    return _STATE


def host_description() -> str:
    """CPU name and features: part of every cache key (object code is host-specific)."""
    with _LOCK:
        st = _init()
        return f"{st['triple']}|{st['cpu']}|{st['features']}|O{OPT_LEVEL}"


def _optimized_module(text: str):
    """Parse, verify and optimise (new pass manager at O3, vectorisers on); lock held."""
    llvm = _llvm()
    st = _init()
    try:
        mod = llvm.parse_assembly(text)
        mod.triple = st["triple"]
        mod.data_layout = str(st["tm"].target_data)
        mod.verify()
    except RuntimeError as exc:
        raise CompilationError(f"LLVM rejected the generated IR: {exc}") from exc
    pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(st["tm"], pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_ir(text: str) -> bytes:
    """Optimise LLVM IR text and emit object code for this host."""
    with _LOCK:
        mod = _optimized_module(text)
        return bytes(_STATE["tm"].emit_object(mod))


def optimized_ir(text: str) -> str:
    """The optimised module as text (for inspection and tests of vectorisation)."""
    with _LOCK:
        return str(_optimized_module(text))


@dataclass
class NativeFunction:
    """A loaded kernel: `fn(row_begin, row_end, argv)` via ctypes (GIL released); `drive`
    is its chunk loop when the object code has one (threads.run_jobs uses it)."""

    symbol: str
    address: int
    fn: object
    drive: object = None

    def __call__(self, begin: int, end: int, argv) -> None:
        self.fn(begin, end, argv)


def load_object(obj: bytes, symbol: str) -> NativeFunction:
    """Add object code to the process engine and return the named kernel."""
    llvm = _llvm()
    with _LOCK:
        st = _init()
        loaded = st["loaded"]
        if symbol not in loaded:
            st["engine"].add_object_file(llvm.ObjectFileRef.from_data(obj))
            st["engine"].finalize_object()
            address = st["engine"].get_function_address(symbol)
            if not address:
                raise CompilationError(f"object code does not define the kernel {symbol!r}")
            drive = st["engine"].get_function_address(symbol + DRIVER_SUFFIX)
            loaded[symbol] = NativeFunction(symbol, address, KERNEL_CTYPE(address),
                                            DRIVE_CTYPE(drive) if drive else None)
        return loaded[symbol]


def llvmlite_version() -> str:
    import llvmlite

    return llvmlite.__version__
