"""runtime: the cpu-llvm route of one `propagate` equation: plan, compile (cached), run.

`generic_plan` decides the route of an equation for a concrete relation: a compiled
Executable, or a Fallback carrying the reason the reference interpreter runs it instead. The
kernel is the Kernel op handed down (the call's Task module's); where none fits the walk
bound here, the plan is an Unbound, a Fallback: nothing in the runtime lowers.
`run_propagate` binds the relation's CSR (or its cached transpose for reduce_by='src'), the
field arrays and fresh outputs to the kernel's pointer slots and runs row chunks on the
thread pool.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np

from ....core.dtypes import as_dtype
from ....core.errors import CompilationError, ShapeError, TigaError, UnsupportedError
from ....core.types import GraphType
from ....lower import CPU_LLVM_AVAILABLE
from ....lower.ir.text import print_op
from ...caches.equations import kept
from ...caches.executables import CACHE, Executable, llvm_key
from ...caches.relations import kept as relation_cache
from ...calls.threads import num_threads
from .. import Fallback, KernelArgs, Unbound, launch, unbound
from ..relation_arrays import launch_chunks, walk_arrays, walked_csr
from .native.pool import parallel_copy

if CPU_LLVM_AVAILABLE:
    from ....lower.abi import relation_descriptor
    from ....lower.backends import BACKENDS
    from ....lower.llvm import CodegenUnsupported
    from ....lower.llvm.render import CallData, size_generic


NOT_LOWERED = ("the IR stages do not express this propagate (lowering it to a "
                "gf_kernel.launch failed), so there is no launch to render")


def _walk(params) -> str:
    return "src" if params["reduce_by"] == "src" else "dst"


class _TypeOnly:
    """A relation known only by its type (explain() without arguments): no edge permutation
    is assumed, which only changes the cache key, never whether the propagate compiles."""

    edge_perm = None

    def __init__(self, gtype):
        self.index_dtype = gtype.index_dtype


def equation_text(eqn) -> str:
    """The printed one-equation program of `eqn` (its edge, reducer and update programs
    included): names its dumped IR, and keys a kernel the Kernel IR does not express."""
    from ....core.program import Eqn, GraphProgram, Var

    binders = [Var(a.type) for a in eqn.inputs]
    outs = [Var(v.type) for v in eqn.outputs]
    return str(GraphProgram(binders, [Eqn(eqn.primitive, tuple(binders), eqn.params,
                                          tuple(outs))], outs))


def kernel_text(op, eqn) -> str:
    """What a compiled kernel is keyed by: its printed `gf_kernel.launch` op (edge and reducer
    regions, types and schedule), or the printed equation when the IR does not express it.
    The pool size is printed as 0: it decides the runtime's row chunks, never the code, so
    one kernel serves every thread count; a row walk's relation counts print as symbols
    (render.size_generic): the kernel reads them at run time, so one kernel serves every
    batch of graphs, whatever its node and edge counts."""
    if op is None:
        return equation_text(eqn)
    return print_op(size_generic(replace(op, schedule=replace(op.schedule, threads=0))))


def _kernel_of(eqn, graph, held=None):
    """(cache key, launch op) of the generic kernel over this relation's walk, memoised per
    equation (hashing costs far more than a warm call), or an Unbound; `held`: the Kernel op
    handed down for the equation (see _launch_op)."""
    walk = _walk(eqn.params)
    relation = relation_descriptor(graph, walk, target="cpu-llvm")
    has_perm = graph.edge_perm is not None if walk == "dst" else True
    variant = (graph.index_dtype.name, has_perm, relation, num_threads())
    per_eqn = kept(eqn, "kernels")     # {variant: (cache key, launch op)}
    found = per_eqn.get(variant)
    if found is None:
        op = _launch_op(eqn, relation, held)
        if isinstance(op, Unbound):
            return op
        # the walk's binding (relation layout constants, edge permutation) is the part of
        # the render's input the op does not print
        key = llvm_key(kernel_text(op, eqn), ("propagate", relation, has_perm,
                                              graph.index_dtype.name))
        found = per_eqn[variant] = (key, op)
    return found


def generic_plan(eqn, graph, *, compile: bool = True, held=None):
    """The generic fused kernel: Executable (compile=True) or key (compile=False), else a
    Fallback (an Unbound: `held` does not fit the walk). Specialised routes are tried before
    it (pages by routes.plan, the function callers use; attention and generated walks by
    CpuLLVM.plan). `held`: the Kernel op handed down for the equation (the call's Task
    module's)."""
    if not CPU_LLVM_AVAILABLE:
        return Fallback("llvmlite is not installed, so the cpu-llvm backend is unavailable")
    if graph is None:
        if compile:
            return Fallback("the relation is not known until the call")
        graph = _TypeOnly(eqn.inputs[0].type)  # explain before a call: decide from types
    found = _kernel_of(eqn, graph, held)
    if isinstance(found, Unbound):
        return found
    key, op = found
    # {kernel key: why it does not compile}, in the equation's weak cache (what its
    # kernels are is derived from the equation and the relation type alone)
    unsupported = kept(eqn, "unsupported")
    reason = unsupported.get(key) or (None if op is not None else NOT_LOWERED)
    if reason is not None:
        return Fallback(reason)
    def build(symbol):
        # (the launch's thread count and row partition are the runtime's; the renderer reads
        # the edge loop's attributes, which no thread count changes)
        call = CallData(relation=relation_descriptor(graph, _walk(eqn.params),
                                                     target="cpu-llvm"),
                        has_edge_perm=graph.edge_perm is not None,
                        index_dtype=graph.index_dtype.name)
        source = BACKENDS["cpu-llvm"].render(op, symbol, call)
        return source.text, source.signature

    try:
        if not compile:
            if CACHE.status(key) == "miss":
                build("probe")  # raises when unsupported; compiling waits for the call
            return key
        exe = CACHE.get(key, build)
        if exe.kernel is None:      # (ops of one key render alike: any of them names it)
            exe.kernel = op
        return exe
    except CodegenUnsupported as exc:
        unsupported[key] = str(exc)
        return Fallback(str(exc))
    except CompilationError as exc:
        return Fallback(f"LLVM compilation failed ({exc}); this is a Tiga bug, please report")
    except TigaError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, IndexError) as exc:
        # a codegen defect must not take the program down: the reference still runs it,
        # explain() shows why and strict mode refuses it
        return Fallback(f"cpu-llvm code generation failed ({type(exc).__name__}: {exc}); "
                        "this is a Tiga bug, please report")


def _launch_op(eqn, relation: tuple, held=None):
    """The launch for the walk the runtime binds (a relation resolved to its CSR walks as a
    CSR): `held`, the Kernel op handed down for this equation (the call's Task module's,
    lowered with the whole program at this pool size), when the relation is bound as it was
    lowered; else an Unbound."""
    gtype = eqn.inputs[0].type
    bound = "csr" if relation == ("csr",) and gtype.kind != "csr" else gtype.kind
    if held is not None and held.comp.relation.type.kind == bound:
        return held
    return unbound(bound)


def launch_op(eqn, graph, held=None):
    """The scheduled launch the compiled kernel of this equation renders and its calls run:
    `held` where it fits the walk, else None. `graph` None: decided from the relation's type,
    as explain() before a call."""
    graph = _TypeOnly(eqn.inputs[0].type) if graph is None else graph
    found = _kernel_of(eqn, graph, held)
    return None if isinstance(found, Unbound) else found[1]


def run_schedule(op):
    """The schedule a call of the kernel rendered from `op` chunks its rows by: the Kernel
    op's own (the one the call's Task module holds), at the pool size now (ops differing in
    their thread count render alike: kernel_text)."""
    if op is None:
        raise CompilationError("a compiled propagate has no Kernel op to schedule its calls "
                               "by; this is a Tiga bug, please report")
    threads = num_threads()
    return op.schedule if op.schedule.threads == threads else replace(op.schedule,
                                                                      threads=threads)


def chunk_row_ptr(graph, reduce_by: str) -> np.ndarray:
    """The row_ptr a compiled propagate balances its chunks with (explain() reports them)."""
    walk = _walk({"reduce_by": reduce_by})
    rel = relation_descriptor(graph, walk, target="cpu-llvm")
    if rel == ("csr",):
        return walked_csr(graph, walk)[0]
    return walk_arrays(graph, _RelationOnly(rel, walk))[1]


@dataclass(frozen=True)
class _RelationOnly:
    relation: tuple
    walk: str


@functools.cache           # dtype name -> numpy dtype (a memo of a pure function)
def _np_dtype(name: str) -> np.dtype:
    return as_dtype(name).np


def _check_field(x, i: int, sig, lead, name: str) -> np.ndarray:
    dtype = _np_dtype(sig.field_dtypes[i])
    arr = np.asarray(x, dtype=dtype)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        arr = np.ascontiguousarray(arr)
    want = tuple(sig.field_shapes[i]) if lead is None else (lead,) + tuple(sig.field_shapes[i])
    if arr.shape != want:
        raise ShapeError(f"{sig.roles[i]}.{name}: expected shape {want} for the compiled "
                         f"propagate, found {arr.shape}")
    return arr


def run_propagate(exe: Executable, eqn, graph, values: list, outs: list | None = None,
                  threads: int | None = None) -> list:
    """Run a compiled propagate on concrete field values; returns the output arrays.

    `outs` (optional): C-contiguous arrays of the outputs' shapes and dtypes to write into,
    e.g. row ranges of a larger result (the distributed runtime's interior chunks); a
    specialised plan, or arrays that do not match, get fresh outputs instead. `threads`
    (optional) caps the launch's pool threads (a paged run computes one page on one thread
    while its loaders use the other cores)."""
    if not isinstance(exe, Executable):       # a specialised plan runs itself
        return exe.run(eqn, graph, values)
    bound = _bound(exe, graph, eqn)
    if outs is not None and not all(
            o.shape == tuple(shape) and o.dtype == dtype and o.flags.c_contiguous
            for o, (shape, dtype) in zip(outs, bound.outs)):
        outs = None
    sig = exe.signature
    names = eqn.params["names"]
    fields = [_check_field(x, i, sig, bound.sizes[i], names[i]) for i, x in enumerate(values)]
    staged = [i for i in bound.gathered if _address(fields[i]) % CACHE_LINE and
              (fields[i].nbytes > STAGE_SHARED_MAX_BYTES or num_threads() == 1)]
    for i in bound.gathered:
        if i not in staged and fields[i].nbytes >= HUGE_MIN_BYTES:
            _huge_pages(fields[i])
    if staged and _STAGE_LOCK.acquire(blocking=False):
        try:   # (the copies are reused by the next call: hold them until the kernel is done)
            for i in staged:
                fields[i] = _aligned_copy(fields[i], i, exe.native)
            return _launch(exe, bound, graph, fields, eqn, outs, threads)
        finally:
            _STAGE_LOCK.release()
    return _launch(exe, bound, graph, fields, eqn, outs, threads)


def _launch(exe, bound, graph, fields: list, eqn, outs: list | None = None,
            cap: int | None = None) -> list:
    sig = exe.signature
    if outs is None:
        outs = [np.empty(shape, dtype) for shape, dtype in bound.outs]
    addrs = list(bound.template)
    for at, f in zip(bound.field_at, fields):
        addrs[at] = _address(f)
    for at, o in zip(bound.out_at, outs):
        addrs[at] = _address(o)
    argv = bound.argv_t(*addrs)
    if sig.parallel == "single":
        launch(exe, bound.op, KernelArgs(argv, rows=(0, bound.rows)))
        return outs
    schedule = run_schedule(bound.op)
    if cap is not None and cap < schedule.threads:
        schedule = replace(schedule, threads=max(1, cap))
    threads = schedule.threads
    chunks = launch_chunks(graph, (sig.walk, tuple(sig.relation)), bound.row_ptr, schedule)
    if sig.parallel == "partial_sums":
        arrays = dict(bound.arrays)
        for i, f in enumerate(fields):
            arrays[f"field:{i}"] = f
        return _partial_sums(exe, bound.op, sig, arrays, outs, chunks, threads, bound.rows)
    launch(exe, bound.op, KernelArgs(argv, chunks, threads))
    return outs


@dataclass(frozen=True)
class _Bound:
    """A kernel bound to one relation: the walk's arrays, the argv slots they fill, the
    sizes fields are checked against and the outputs' shapes (built once per pair)."""

    arrays: dict
    row_ptr: np.ndarray
    rows: int
    sizes: tuple
    outs: tuple
    template: tuple        # argv addresses; field and output slots are filled per call
    field_at: tuple
    out_at: tuple
    argv_t: type
    gathered: tuple        # fields read at random rows, worth an aligned copy (see below)
    op: object             # the Kernel op launched (_call_op)


# A gathered row that starts mid cache line touches one more line than it needs (a 128-byte
# float32 row: three lines instead of two), and random gathers are bound by the lines in
# flight: a misaligned source array made the stored-CSR kernel 1.3-1.45x slower. Such
# fields are copied once per call to a 64-byte aligned buffer (a small cost next to reading
# every row `degree` times); the buffers are kept, since fresh pages fault on first touch.
# With several threads, a copy small enough to stay in one core's L2 costs more than it saves
# (measured at 1 MiB: the other core then reads every row from the copying core's cache),
# while above that size the copy pays for itself.
CACHE_LINE = 64
STAGE_SHARED_MAX_BYTES = 2 << 20
PARALLEL_COPY = True
STAGE_MIN_REUSE = 2        # edges per gathered row below which copying does not pay
_STAGE_LOCK = threading.Lock()
_STAGE: dict = {}          # field position -> uint8 scratch (a pool; rewritten every call)


def _gathered(sig, eqn, graph) -> tuple:
    """Fields the kernel reads at random rows whose alignment decides the lines touched."""
    rows_read = graph.num_src if sig.walk == "dst" else graph.num_dst
    if graph.num_edges < STAGE_MIN_REUSE * max(rows_read, 1):
        return ()
    nbr = "src" if sig.walk == "dst" else "dst"
    used = eqn.params["edge_fn"].read_inputs()
    found = []
    for i, role in enumerate(sig.roles):
        nbytes = _row_bytes(sig, i)
        if (role == nbr and i in used and nbytes >= 16 and
                (nbytes % CACHE_LINE == 0 or CACHE_LINE % nbytes == 0)):
            found.append(i)
    return tuple(found)


def staging_candidates(eqn, graph) -> list:
    """[(field name, nbytes)] of the fields a stored-CSR walk may copy to aligned scratch
    (explain() lists them before any call: alignment is only known then)."""
    fields = [a.type for a in eqn.inputs if not isinstance(a.type, GraphType)]
    roles = tuple(eqn.params["roles"])
    sig = SimpleNamespace(
        roles=roles, walk="src" if eqn.params["reduce_by"] == "src" else "dst",
        field_shapes=tuple(tuple(t.shape) if r == "param" else tuple(t.shape[1:])
                           for t, r in zip(fields, roles)),
        field_dtypes=tuple(t.dtype.name for t in fields))
    names = eqn.params["names"]
    rows = graph.num_src if sig.walk == "dst" else graph.num_dst
    return [(f"{roles[i]}.{names[i]}", rows * _row_bytes(sig, i))
            for i in _gathered(sig, eqn, graph)]


def _row_bytes(sig, i: int) -> int:
    return (int(np.prod(sig.field_shapes[i], dtype=np.int64)) *
        _np_dtype(sig.field_dtypes[i]).itemsize)


# Random row gathers over many MiB miss the TLB on 4 KiB pages (a 16 MiB source: 4096 pages,
# 12% slower than on 2 MiB pages, measured). Fresh numpy allocations of this size are
# already advised onto huge pages; memory numpy reused from 4 KiB pages is not. A source
# seen again at the same address is collapsed onto huge pages once (Linux 6.1+
# MADV_COLLAPSE: same contents, the kernel copies; elsewhere the call fails and nothing
# changes). Only the 2 MiB-aligned interior of the array is advised.
HUGE_MIN_BYTES = 8 << 20
HUGE_PAGE = 2 << 20
MADV_COLLAPSE = 25
_HUGE_SEEN: dict = {}      # (address, nbytes) -> collapsed already (a paging hint, no values)


def _huge_pages(arr: np.ndarray) -> None:
    key = (_address(arr), arr.nbytes)
    done = _HUGE_SEEN.get(key)
    if done is None:               # first sighting: a one-off array is not worth the copy
        if len(_HUGE_SEEN) > 256:
            _HUGE_SEEN.clear()
        _HUGE_SEEN[key] = False
        return
    if done or not sys.platform.startswith("linux"):
        return
    _HUGE_SEEN[key] = True
    lo = (key[0] + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    hi = (key[0] + key[1]) & ~(HUGE_PAGE - 1)
    if hi > lo:
        try:
            _libc().madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_COLLAPSE)
        except (OSError, AttributeError):
            pass


@functools.cache           # libc, loaded once
def _libc():
    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _aligned_copy(arr: np.ndarray, slot: int, native=None) -> np.ndarray:
    raw = _STAGE.get(slot)
    if raw is None or raw.nbytes < arr.nbytes + CACHE_LINE:
        raw = _STAGE[slot] = np.empty(arr.nbytes + CACHE_LINE, np.uint8)
    off = -_address(raw) % CACHE_LINE
    out = raw[off:off + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    if native is not None and PARALLEL_COPY and out.nbytes > STAGE_SHARED_MAX_BYTES:
        parallel_copy(native, out, arr, num_threads())
    else:
        np.copyto(out, arr)
    if out.nbytes >= HUGE_MIN_BYTES:
        _huge_pages(out)     # the scratch is reused: from its second call on huge pages
    return out


def _bound(exe: Executable, graph, eqn) -> _Bound:
    per_graph = relation_cache(graph, "bound")
    found = per_graph.get(exe.key)
    if found is not None:
        return found
    sig = exe.signature
    arrays, rp = walk_arrays(graph, sig)
    arrays = dict(arrays)
    for slot in sig.slots:
        if not slot.startswith(("out:", "field:")) and arrays.get(slot) is None:
            raise UnsupportedError(f"compiled propagate needs {slot} but the relation has none")
    role_size = {"src": graph.num_src, "dst": graph.num_dst, "edge": graph.num_edges,
                 "param": None}
    lead = {"dst": (graph.num_dst,), "src": (graph.num_src,), "edge": (graph.num_edges,),
            "all": ()}[sig.reduce_by]
    template = tuple(0 if s.startswith(("out:", "field:")) else _address(arrays[s])
                     for s in sig.slots)
    found = _Bound(arrays=arrays, row_ptr=rp, rows=len(rp) - 1,
                   sizes=tuple(role_size[r] for r in sig.roles),
                   outs=tuple((lead + tuple(s), _np_dtype(d))
                              for s, d in zip(sig.out_shapes, sig.out_dtypes)),
                   template=template,
                   field_at=tuple(sig.slots.index(f"field:{i}") for i in range(len(sig.roles))),
                   out_at=tuple(sig.slots.index(f"out:{k}") for k in range(len(sig.out_shapes))),
                   argv_t=ctypes.c_void_p * len(sig.slots),
                   gathered=_gathered(sig, eqn, graph) if sig.relation == ("csr",) else (),
                   op=_call_op(exe, eqn, graph))
    per_graph[exe.key] = found      # (one dict item store: atomic under the GIL)
    return found


def _call_op(exe: Executable, eqn, graph):
    """The Kernel op the calls over this relation launch: the equation's own, with this
    relation's sizes (what the call's Task module prints), where its plan memoised it for
    `exe`; else the op `exe` was compiled from (ops differing only in the relation's counts
    share a kernel: kernel_text)."""
    found = _kernel_of(eqn, graph)
    if isinstance(found, tuple) and found[0] == exe.key and found[1] is not None:
        return found[1]
    return exe.kernel


def _address(a: np.ndarray) -> int:
    try:    # (a writable buffer's address without building the array interface dict)
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):   # read-only, empty or not contiguous
        return a.__array_interface__["data"][0]


def _argv(sig, arrays: dict, outs: list):
    ptrs = [_address(o) for o in outs]
    return (ctypes.c_void_p * len(sig.slots))(*[
        ptrs[int(s[4:])] if s.startswith("out:") else _address(arrays[s])
        for s in sig.slots])


def _partial_sums(exe, op, sig, arrays, outs, chunks, threads, rows) -> list:
    """reduce_by='all' with sum: every chunk folds into its own output row; add them up."""
    if len(chunks) <= 1:
        launch(exe, op, KernelArgs(_argv(sig, arrays, outs), rows=(0, rows)))
        return outs
    parts = [[np.empty_like(o) for o in outs] for _ in chunks]
    jobs = [(a, b, _argv(sig, arrays, p)) for (a, b), p in zip(chunks, parts)]
    launch(exe, op, KernelArgs(threads=threads, jobs=jobs))
    for k, o in enumerate(outs):
        np.sum([p[k] for p in parts], axis=0, out=o)
    return outs
