"""runtime: compile LLVM IR text to native code with llvmlite and call it through ctypes.

Compiled kernels become shared libraries: llvmlite emits position-independent object code
for the host CPU, the system C toolchain (`$CC`, else `cc`) links it with `-shared`, and
ctypes loads the library. The disk cache keeps the library, so a process that only reads
the cache never imports or initialises llvmlite's LLVM (tens of ms). Without a toolchain
the object code goes to one process-wide MCJIT engine instead.

LLVM is not thread-safe for compilation: every call into it holds `_LOCK`. Calls into
compiled kernels go through ctypes, which releases the GIL.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from .....core.errors import CompilationError

_LOCK = threading.RLock()

KERNEL_CTYPE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
# <kernel>_drive(bounds, n_chunks, next_chunk, argv): the chunk loop (lower/llvm/kernel.py)
DRIVE_CTYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_void_p)
DRIVER_SUFFIX = "_drive"
OPT_LEVEL = 3
# LLVM's tuning for this CPU family prefers 256-bit vectors; a 32-float row is then 4
# loads and 4 adds per edge instead of 2. Turned off (512-bit) when the host has AVX-512.
PREFER_512_BIT = True
LINK_TIMEOUT_S = 120


def _llvm():
    import llvmlite.binding as llvm

    return llvm


@functools.cache    # one LLVM set-up per process
def _init() -> dict:
    """Target machines + MCJIT engine, created once (under the lock)."""
    llvm = _llvm()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    features = llvm.get_host_cpu_features().flatten()
    if PREFER_512_BIT and "+avx512f" in features.split(","):
        features += ",-prefer-256-bit"
    cpu = llvm.get_host_cpu_name()
    tm = target.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL,
                                      reloc="default", codemodel="jitdefault")
    pic = target.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL,
                                       reloc="pic", codemodel="default")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    return dict(tm=tm, pic_tm=pic, engine=engine, triple=llvm.get_process_triple(),
                cpu=cpu, features=features, loaded={})


@functools.cache    # the host does not change within a process
def host_description() -> str:
    """The host CPU (model and instruction-set flags) and code options: part of every cache
    key, since object code is host-specific. Read from /proc/cpuinfo where there is one, so
    a warm start computes its cache keys without loading LLVM."""
    return _cpuinfo_description() or _llvm_description()


def _cpuinfo_description() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    info = {}
    for line in text.split("\n\n", 1)[0].splitlines():   # the first processor
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    if "flags" not in info:
        return None
    ident = "|".join(info.get(k, "") for k in ("vendor_id", "cpu family", "model",
                                               "model name", "flags"))
    digest = hashlib.sha256(ident.encode()).hexdigest()[:24]
    return (f"{sys.platform}|{platform.machine()}|cpuinfo:{digest}|O{OPT_LEVEL}"
            f"|zmm{int(PREFER_512_BIT)}")


def _llvm_description() -> str:
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


def compile_ir(text: str, *, pic: bool = False) -> bytes:
    """Optimise LLVM IR text and emit object code for this host (`pic`: for a shared
    library; otherwise for the MCJIT engine)."""
    with _LOCK:
        mod = _optimized_module(text)
        return bytes(_init()["pic_tm" if pic else "tm"].emit_object(mod))


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
    library: object = None      # the ctypes.CDLL it lives in (kept loaded with the kernel)

    def __call__(self, begin: int, end: int, argv) -> None:
        self.fn(begin, end, argv)


def load_object(obj: bytes, symbol: str) -> NativeFunction:
    """Add object code to the process MCJIT engine and return the named kernel."""
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


def linker() -> str | None:
    """The C toolchain driver that links shared libraries, or None (MCJIT is used)."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shutil.which(cc.split()[0]) and cc
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def link_shared(obj: bytes) -> bytes | None:
    """Link PIC object code into a shared library (its bytes), or None without a toolchain.
    Raises CompilationError when the toolchain runs and fails."""
    cc = linker()
    if cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tiga-link-") as tmp:
        o, so = os.path.join(tmp, "kernel.o"), os.path.join(tmp, "kernel.so")
        with open(o, "wb") as f:
            f.write(obj)
        if not _linked_directly(o, so):
            code, err = _run_linker(cc.split() + ["-shared", "-o", so, o, "-lm"], cc)
            if code != 0:
                raise CompilationError(f"linking the kernel with {cc!r} failed: {err[-500:]}")
        with open(so, "rb") as f:
            return f.read()


def _run_linker(cmd: list, name: str) -> tuple:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=LINK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompilationError(f"linking the kernel with {name!r} failed: {exc}") from exc
    return proc.returncode, proc.stderr.decode(errors="replace")


def _linked_directly(o: str, so: str) -> bool:
    cmd = _direct_link(o, so)
    try:
        return cmd is not None and _run_linker(cmd, cmd[0])[0] == 0
    except CompilationError:
        return False


def _direct_link(o: str, so: str) -> list | None:
    """The system linker run directly on the kernel object, or None (use the C driver).

    `cc -shared` costs 40-80 ms (the driver, collect2, then ld, and the C runtime's start
    files a kernel does not need); ld itself 5-20 ms, most of a cold first call's link. It
    links against the very libc and libm this process has mapped (a kernel calls memcpy,
    syscall and libm) with --no-undefined: a kernel that needs anything else (a compiler
    runtime helper) fails to link here and goes through `cc` as before. Only where no $CC
    names the toolchain (a user's choice is kept)."""
    if os.environ.get("CC", "").strip():
        return None
    ld = _system_ld()
    libs = _process_libs()
    if ld is None or not libs:
        return None
    return [ld, "-shared", "--no-undefined", "-o", so, o, *libs]


@functools.cache
def _system_ld() -> str | None:
    return shutil.which("ld.gold") or shutil.which("ld")


@functools.cache
def _process_libs() -> tuple:
    """Paths of the libm and libc this process runs on (from /proc/self/maps; () where
    there is none, or either is missing)."""
    found = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                base = os.path.basename(path)
                for lib in ("libm.so", "libc.so"):
                    if base.startswith(lib + ".") and lib not in found:
                        found[lib] = "/" + path
    except OSError:
        return ()
    return (found["libm.so"], found["libc.so"]) if len(found) == 2 else ()


def load_shared(data: bytes, symbol: str, workdir=None) -> NativeFunction:
    """dlopen these shared-library bytes (no LLVM involved) and return the named kernel.

    The bytes (already checked by the caller) go to a fresh file (mkstemp: an unpredictable
    name, mode 0600, created exclusively), which is unlinked once loaded: the loader never
    maps a cache entry that another process may replace or damage later, and never mistakes
    a new library for one it loaded before under the same name. Only a directory nobody else
    can swap that file in is used: `workdir` (the cache directory) when it is this user's
    and nobody else can write it, else the system temp dir when it is private or sticky
    (/tmp: others cannot rename or remove what is not theirs). Raises OSError when no such
    directory can hold the library, or it cannot be loaded or lacks the kernel.
    """
    dirs = [d for d in (workdir, tempfile.gettempdir()) if d is not None and _safe_dir(d)]
    last = None
    for d in dirs:
        try:
            fd, path = tempfile.mkstemp(dir=os.fspath(d), prefix=f".tiga-{symbol[-16:]}-",
                                        suffix=".so")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                return _dlopen(path, symbol)
            finally:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        except OSError as exc:   # unwritable or noexec directory: try the next one
            last = exc
    raise OSError(f"could not load the kernel library: {last or 'no private directory'}")


def _safe_dir(d) -> bool:
    """Whether a library written to `d` stays the one written until it is loaded: `d` is a
    real directory owned by this user (or root, if sticky) that nobody else can write, or
    a sticky one."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not hasattr(os, "geteuid"):
        return stat.S_ISDIR(st.st_mode)     # (Windows: no POSIX owner or mode bits)
    uid = os.geteuid()
    if st.st_mode & stat.S_ISVTX and st.st_uid in (0, uid):
        return True
    return st.st_uid == uid and not st.st_mode & 0o022


def _dlopen(path: str, symbol: str) -> NativeFunction:
    lib = ctypes.CDLL(path)
    try:
        fn = lib[symbol]
    except AttributeError as exc:
        raise OSError(f"{path} does not define the kernel {symbol!r}") from exc
    address = ctypes.cast(fn, ctypes.c_void_p).value
    try:
        drive = ctypes.cast(lib[symbol + DRIVER_SUFFIX], ctypes.c_void_p).value
    except AttributeError:
        drive = None
    return NativeFunction(symbol, address, KERNEL_CTYPE(address),
                          DRIVE_CTYPE(drive) if drive else None, lib)


def llvmlite_version() -> str:
    import llvmlite

    return llvmlite.__version__
