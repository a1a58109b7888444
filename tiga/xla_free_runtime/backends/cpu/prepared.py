"""runtime/backends/cpu: a compiled propagate bound once to its relation, for warm calls.

`prepare(exe, eqn, graph)` fixes everything a call of the generic fused kernel decides from
the kernel and the relation alone: the argv template with the relation's arrays, the slots
of fields and outputs, the exact dtype and shape each field must have, the outputs to
allocate, the schedule and its row chunks. `run(values)` then checks the operands against
those (no conversion) and launches; operands it does not take as they are (another dtype, a
view, a misaligned or huge gathered field, which `run_propagate` converts, copies or advises)
run through `run_propagate` with the same kernel. None: the compile cache no longer holds
the kernel (cleared), and the caller plans afresh.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ...caches.executables import CACHE, Executable
from .. import BACKENDS, KernelArgs
from ..relation_arrays import launch_chunks
from . import propagate as P


@dataclass(frozen=True)
class PreparedLaunch:
    exe: Executable
    eqn: object
    template: tuple
    fields: tuple        # per field: (argv slot, dtype, shape, gathered)
    out_at: tuple
    outs: tuple          # per output: (shape, dtype)
    argv_t: type
    single: int | None   # rows of a single-threaded kernel, else None (chunks below)
    chunks: list
    threads: int
    stage_max: int       # a misaligned gathered field above this many bytes is copied first
    blob: bytes = b""    # the argv of `template` as bytes (filled in by __post_init__)
    op: object = None    # the Kernel op launched (default: exe.kernel), its target, row range
    target: str = ""
    rows: tuple = (0, 0)

    def __post_init__(self):
        object.__setattr__(self, "blob", bytes(self.argv_t(*self.template)))
        if self.op is None:
            object.__setattr__(self, "op", self.exe.kernel)
        object.__setattr__(self, "target", self.op.target)
        if self.single is not None:     # (one call over every row: KernelArgs' chunks None)
            object.__setattr__(self, "rows", (0, self.single))
            object.__setattr__(self, "chunks", None)

    def run(self, values: list) -> list | None:
        """The outputs of one launch on `values` (the relation, then its fields)."""
        if not CACHE.current(self.exe):     # (the cache was cleared: plan afresh)
            return None
        # (the argv copied from the template's bytes and filled slot by slot: half the cost
        # of building it from a list of addresses)
        argv = self.argv_t.from_buffer_copy(self.blob)
        for (at, dtype, shape, gathered), f in zip(self.fields, values[1:]):
            if (type(f) is not np.ndarray or f.dtype != dtype or f.shape != shape or
                    not f.flags.c_contiguous):
                return P.run_propagate(self.exe, self.eqn, values[0], values[1:])
            try:    # (P._address inlined: a warm call's host time is counted in us)
                addr = _addressof(_from_buffer(f))
            except (TypeError, ValueError, BufferError):   # read-only or empty
                addr = P._address(f)
            if gathered and (f.nbytes >= P.HUGE_MIN_BYTES or
                             (addr % P.CACHE_LINE and f.nbytes > self.stage_max)):
                return P.run_propagate(self.exe, self.eqn, values[0], values[1:])
            argv[at] = addr
        outs = []
        for (shape, dtype), at in zip(self.outs, self.out_at):
            o = np.empty(shape, dtype)
            argv[at] = _addressof(_from_buffer(o)) if o.size else P._address(o)
            outs.append(o)
        # (the backend looked up at each launch, so one registered in place of cpu-llvm's sees
        # it; the arguments built as a plain tuple: KernelArgs' own constructor costs 0.3 us)
        BACKENDS[self.target].launch(self.exe, self.op, _args(KernelArgs, (
            argv, self.chunks, self.threads, self.rows, None)))
        return outs


_addressof = ctypes.addressof
_from_buffer = ctypes.c_char.from_buffer
_args = tuple.__new__


def prepare(exe, eqn, graph) -> PreparedLaunch | None:
    """The prepared launch of `exe` (the route planned for `eqn` over `graph`), or None for
    a route that is not a plain generic kernel launch (a specialised plan, partial sums)."""
    if not isinstance(exe, Executable) or exe.signature.parallel == "partial_sums":
        return None
    sig = exe.signature
    bound = P._bound(exe, graph, eqn)
    fields = tuple((at, P._np_dtype(sig.field_dtypes[i]),
                    tuple(sig.field_shapes[i]) if bound.sizes[i] is None else
                    (bound.sizes[i],) + tuple(sig.field_shapes[i]), i in bound.gathered)
                   for i, at in enumerate(bound.field_at))
    # (run_propagate copies a misaligned gathered field when it is large, or always on one
    # thread: those calls take it)
    stage_max = -1 if P.num_threads() == 1 else P.STAGE_SHARED_MAX_BYTES
    if sig.parallel == "single":
        return PreparedLaunch(exe, eqn, bound.template, fields, bound.out_at, bound.outs,
                              bound.argv_t, bound.rows, [], 1, stage_max, op=bound.op)
    launch = P.run_schedule(bound.op)
    chunks = launch_chunks(graph, (sig.walk, tuple(sig.relation)), bound.row_ptr, launch)
    return PreparedLaunch(exe, eqn, bound.template, fields, bound.out_at, bound.outs, bound.argv_t,
                          None, chunks, launch.threads, stage_max, op=bound.op)


__all__ = ["PreparedLaunch", "prepare"]
