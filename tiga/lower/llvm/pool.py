"""lower/llvm: a native worker pool protocol emitted next to every chunk driver.

Waking Python pool threads through futures costs tens of microseconds per parallel call,
as much as a whole small propagate. Instead, worker threads (created once by the runtime
with pthread_create on `<kernel>_pool_worker`) wait in native code: they spin briefly, then
sleep on a futex; `<kernel>_pool_run` publishes a job (a `_drive` chunk loop and its
arguments), wakes sleepers, runs the chunk loop on the caller's thread too, and waits only
for the workers that joined. A worker that arrives after the caller closed the job does not
join, so a thread the OS preempted never delays a call (the caller takes its chunks).

Every module carries the same protocol over one shared state block (int64 words, laid out
below), so the threads started from one kernel's worker serve the drivers of all kernels.

    state[ENTRY]    generation << 32 | CLOSED | joined workers (low 16 bits); the low
                    32 bits are the futex the caller sleeps on while workers finish
    state[SEQ]      32-bit futex the idle workers sleep on; bumped once per job
    state[SLEEPERS] workers inside (or about to enter) futex_wait on SEQ
    state[SPIN]     pause iterations a worker spins before sleeping (runtime-tunable)
    state[JOB..]    drive, bounds, number of chunks, argv, most helpers to admit
    state[NEXT]     the chunk counter the drivers claim from
"""
from __future__ import annotations

import platform
import sys

from llvmlite import ir

from .values import I64, PTR, i64

I32 = ir.IntType(32)
POOL_RUN_SUFFIX = "_pool_run"
POOL_WORKER_SUFFIX = "_pool_worker"
POOL_COPY_SUFFIX = "_pool_copy"
ENTRY, SEQ, SLEEPERS, SPIN = 0, 8, 9, 10
JOB_DRIVE, JOB_BOUNDS, JOB_N, JOB_ARGV, JOB_MAX = 16, 17, 18, 19, 20
NEXT = 24
STATE_WORDS = 32
CLOSED = 1 << 16
COUNT_MASK = 0xFFFF
CALLER_SPIN = 4000       # pause iterations before the caller sleeps on a worker's last chunk
SYS_FUTEX = 202          # x86_64 Linux
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


def supported() -> bool:
    """The protocol uses the x86-64 Linux futex system call and the `pause` instruction."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


class _Pool:
    def __init__(self, module: ir.Module):
        self.module = module
        self.syscall = _declare(module, "syscall", ir.FunctionType(I64, [I64], var_arg=True))
        self.drive_t = ir.FunctionType(ir.VoidType(), [PTR, I64, PTR, PTR])
        # (an intrinsic: inline asm would need an asm parser the JIT does not initialise)
        self.pause_fn = _declare(module, "llvm.x86.sse2.pause",
                                 ir.FunctionType(ir.VoidType(), []))

    def word(self, b, state, k, ty=I64):
        return (b.gep(state, [i64(k)], source_etype=I64) if ty is I64 else
            b.gep(state, [i64(2 * k)], source_etype=I32))

    def pause(self, b):
        b.call(self.pause_fn, [])

    def futex(self, b, addr, op, val):
        b.call(self.syscall, [i64(SYS_FUTEX), addr, i64(op), val, ir.Constant(PTR, None),
                              ir.Constant(PTR, None), i64(0)])

    def call_ptr(self, b, fnptr, args):
        """An indirect call (llvmlite reads the callee's type from the callee value)."""
        b.call(_Callee(fnptr, self.drive_t), args)

    def load(self, b, ptr, ty=I64):
        return b.load_atomic(ptr, "seq_cst", align=ty.width // 8, typ=ty)

    def relaxed(self, b, ptr):
        """A job field: written before the job is published, read after joining it (the
        seq_cst entry word orders them); atomic only because late readers may race."""
        return b.load_atomic(ptr, "monotonic", align=8, typ=I64)

    def store(self, b, val, ptr, ordering="seq_cst"):
        # (IRBuilder.store_atomic checks a pointee type, which opaque pointers lack)
        b._insert(ir.instructions.StoreAtomicInstr(b.block, val, ptr, ordering,
                                                   val.type.width // 8))


class _Callee:
    """A function pointer value with its function type (llvmlite reads the callee's type
    from the pointee of a typed pointer, which opaque pointers do not have)."""

    def __init__(self, value, fnty):
        self.value, self.function_type, self.type = value, fnty, value.type

    def get_reference(self):
        return self.value.get_reference()


def _declare(module, name, fnty):
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, fnty, name=name)


def emit_pool(module: ir.Module, prefix: str) -> None:
    """`void <prefix>_pool_run(i64* state, ptr drive, i64* bounds, i64 n, ptr argv,
    i64 helpers)` and `ptr <prefix>_pool_worker(ptr state)` (a pthread start routine)."""
    p = _Pool(module)
    _emit_run(p, prefix + POOL_RUN_SUFFIX)
    _emit_worker(p, prefix + POOL_WORKER_SUFFIX)
    _emit_copy(p, prefix + POOL_COPY_SUFFIX)


def _emit_copy(p: _Pool, name: str) -> None:
    """A chunk driver (the `_drive` signature) copying bytes: argv = (dst, src), chunk i is
    bytes [bounds[2i], bounds[2i+1]). The runtime stages large arrays with it on every
    thread."""
    fn = ir.Function(p.module, p.drive_t, name=name)
    bounds, n, nxt, argv = fn.args
    blocks = {k: fn.append_basic_block(k) for k in ("entry", "head", "body", "done")}
    b = ir.IRBuilder(blocks["entry"])
    dst = b.load(argv, typ=PTR)
    src = b.load(b.gep(argv, [i64(1)], source_etype=PTR), typ=PTR)
    b.branch(blocks["head"])
    b.position_at_end(blocks["head"])
    i = b.atomic_rmw("add", nxt, i64(1), "monotonic")
    b.cbranch(b.icmp_signed("<", i, n), blocks["body"], blocks["done"])
    b.position_at_end(blocks["body"])
    lo = b.load(b.gep(bounds, [b.shl(i, i64(1))], source_etype=I64), typ=I64)
    hi = b.load(b.gep(bounds, [b.add(b.shl(i, i64(1)), i64(1))], source_etype=I64), typ=I64)
    memcpy = _declare(p.module, "llvm.memcpy.p0.p0.i64",
                      ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, ir.IntType(1)]))
    b.call(memcpy, [b.gep(dst, [lo], source_etype=ir.IntType(8)),
                    b.gep(src, [lo], source_etype=ir.IntType(8)), b.sub(hi, lo),
                    ir.Constant(ir.IntType(1), 0)])
    b.branch(blocks["head"])
    b.position_at_end(blocks["done"])
    b.ret_void()


def _emit_run(p: _Pool, name: str) -> None:
    fn = ir.Function(p.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, PTR, I64]),
                     name=name)
    state, drive, bounds, n, argv, helpers = fn.args
    blocks = {k: fn.append_basic_block(k) for k in ("entry", "wake", "work", "wait", "spin",
                                                    "done")}
    b = ir.IRBuilder(blocks["entry"])
    for k, v in ((JOB_DRIVE, b.ptrtoint(drive, I64)), (JOB_BOUNDS, b.ptrtoint(bounds, I64)),
                 (JOB_N, n), (JOB_ARGV, b.ptrtoint(argv, I64)), (JOB_MAX, helpers),
                 (NEXT, i64(0))):
        p.store(b, v, p.word(b, state, k), "monotonic")
    entry = p.word(b, state, ENTRY)
    # the previous job is closed and drained: open the next generation with no worker
    gen = b.lshr(p.load(b, entry), i64(32))
    p.store(b, b.shl(b.add(gen, i64(1)), i64(32)), entry)
    seq = p.word(b, state, SEQ, I32)
    b.atomic_rmw("add", seq, ir.Constant(I32, 1), "seq_cst")
    sleepers = p.load(b, p.word(b, state, SLEEPERS))
    b.cbranch(b.icmp_signed(">", sleepers, i64(0)), blocks["wake"], blocks["work"])
    b.position_at_end(blocks["wake"])
    p.futex(b, seq, FUTEX_WAKE_PRIVATE, i64(0x7FFFFFFF))
    b.branch(blocks["work"])
    b.position_at_end(blocks["work"])
    p.call_ptr(b, drive, [bounds, n, p.word(b, state, NEXT), argv])
    b.atomic_rmw("or", entry, i64(CLOSED), "seq_cst")
    b.branch(blocks["wait"])
    # wait for the joined workers' last chunks: spin (a chunk is short), then sleep
    b.position_at_end(blocks["wait"])
    spins = b.phi(I64)
    spins.add_incoming(i64(0), blocks["work"])
    low = b.trunc(p.load(b, entry), I32)
    busy = b.icmp_unsigned("!=", b.and_(low, ir.Constant(I32, COUNT_MASK)),
                           ir.Constant(I32, 0))
    b.cbranch(busy, blocks["spin"], blocks["done"])
    b.position_at_end(blocks["spin"])
    more = b.add(spins, i64(1))
    with b.if_else(b.icmp_signed("<", spins, i64(CALLER_SPIN))) as (then, other):
        with then:
            p.pause(b)
        with other:
            p.futex(b, entry, FUTEX_WAIT_PRIVATE, b.zext(low, I64))
    spins.add_incoming(more, b.block)
    b.branch(blocks["wait"])
    b.position_at_end(blocks["done"])
    b.ret_void()


def _emit_worker(p: _Pool, name: str) -> None:
    fn = ir.Function(p.module, ir.FunctionType(PTR, [PTR]), name=name)
    state = fn.args[0]
    names = ("entry", "idle", "sleep", "new", "try", "cas", "run")
    blocks = {k: fn.append_basic_block(k) for k in names}
    b = ir.IRBuilder(blocks["entry"])
    seq = p.word(b, state, SEQ, I32)
    entry = p.word(b, state, ENTRY)
    first = p.load(b, seq, I32)
    b.branch(blocks["idle"])

    # idle: wait for SEQ to move past `seen`, spinning up to state[SPIN] pauses, then asleep
    b.position_at_end(blocks["idle"])
    seen = b.phi(I32)
    spins = b.phi(I64)
    seen.add_incoming(first, blocks["entry"])
    spins.add_incoming(i64(0), blocks["entry"])
    now = p.load(b, seq, I32)
    b.cbranch(b.icmp_unsigned("!=", now, seen), blocks["new"], blocks["sleep"])
    b.position_at_end(blocks["sleep"])
    limit = p.relaxed(b, p.word(b, state, SPIN))
    sleeper = p.word(b, state, SLEEPERS)
    with b.if_else(b.icmp_signed("<", spins, limit)) as (then, other):
        with then:
            p.pause(b)
        with other:
            b.atomic_rmw("add", sleeper, i64(1), "seq_cst")
            p.futex(b, seq, FUTEX_WAIT_PRIVATE, b.zext(seen, I64))
            b.atomic_rmw("sub", sleeper, i64(1), "seq_cst")
    seen.add_incoming(seen, b.block)
    spins.add_incoming(b.add(spins, i64(1)), b.block)
    b.branch(blocks["idle"])

    # a new job: join it unless it is closed or has all the helpers it admits
    b.position_at_end(blocks["new"])
    e0 = p.load(b, entry)
    b.branch(blocks["try"])
    b.position_at_end(blocks["try"])
    e = b.phi(I64)
    e.add_incoming(e0, blocks["new"])
    count = b.and_(e, i64(COUNT_MASK))
    most = p.relaxed(b, p.word(b, state, JOB_MAX))
    closed = b.icmp_unsigned("!=", b.and_(e, i64(CLOSED)), i64(0))
    refuse = b.or_(closed, b.icmp_signed(">=", count, most))
    b.cbranch(refuse, blocks["idle"], blocks["cas"])
    seen.add_incoming(now, blocks["try"])
    spins.add_incoming(i64(0), blocks["try"])
    b.position_at_end(blocks["cas"])
    pair = b.cmpxchg(entry, e, b.add(e, i64(1)), "seq_cst", "seq_cst")
    e.add_incoming(b.extract_value(pair, 0), blocks["cas"])
    b.cbranch(b.extract_value(pair, 1), blocks["run"], blocks["try"])

    b.position_at_end(blocks["run"])
    drive = b.inttoptr(p.relaxed(b, p.word(b, state, JOB_DRIVE)), PTR)
    bounds = b.inttoptr(p.relaxed(b, p.word(b, state, JOB_BOUNDS)), PTR)
    n = p.relaxed(b, p.word(b, state, JOB_N))
    argv = b.inttoptr(p.relaxed(b, p.word(b, state, JOB_ARGV)), PTR)
    p.call_ptr(b, drive, [bounds, n, p.word(b, state, NEXT), argv])
    old = b.atomic_rmw("sub", entry, i64(1), "seq_cst")
    last = b.and_(b.icmp_unsigned("==", b.and_(old, i64(COUNT_MASK)), i64(1)),
                  b.icmp_unsigned("!=", b.and_(old, i64(CLOSED)), i64(0)))
    with b.if_then(last):
        p.futex(b, entry, FUTEX_WAKE_PRIVATE, i64(1))
    seen.add_incoming(now, b.block)
    spins.add_incoming(i64(0), b.block)
    b.branch(blocks["idle"])
