"""lower/llvm: the emitter: loop nests, stack buffers, constants and sub-program evaluation.

Every row-level primitive lowers to a loop nest over its static row shape (rules/). Stack
buffers are allocated once in the entry block, so LLVM's SROA/mem2reg can promote them and a
kernel never grows its stack per edge. A kernel's stack buffers stay within STACK_BUDGET
bytes: row buffers past it (a long edge function over wide rows) are carved from one heap
block the kernel mallocs on entry and frees on return, so no input overflows a thread's stack.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...core.program import ClosedProgram, Lit
from ...core.types import TensorType
from ..registry import lowering_rules
from .values import (
    F32,
    I8,
    I64,
    PTR,
    CodegenUnsupported,
    Val,
    const,
    i64,
    numel,
    storage_type,
    supported,
)

BACKEND = "cpu-llvm"
MAX_ROW_ELEMENTS = 1 << 16   # stack buffers per value; larger rows belong to a tiled kernel
MAX_CONST_BYTES = 1 << 20    # literal arrays embedded as module constants
# Stack bytes one kernel call may take: pool and Python threads have 8 MiB stacks (glibc's
# default), some hosts less; a kernel runs nested a few frames deep in any of them.
STACK_BUDGET = 256 << 10
HEAP_ALIGN = 64


# Let LLVM fuse a*b+c into one FMA (float32/float64 only). Off: the max/min VJPs find the
# selected edge by recomputing messages and comparing them with the forward's result, which
# needs every kernel to round messages identically (contraction depends on each kernel's
# surrounding code), and it measured no faster here (the edge loop is load-bound).
CONTRACT = False


def _contract(ty, flags):
    elem = getattr(ty, "element", ty)
    if CONTRACT and isinstance(elem, (ir.FloatType, ir.DoubleType)) and "contract" not in flags:
        return tuple(flags) + ("contract",)
    return flags


class ContractingBuilder(ir.IRBuilder):
    """IRBuilder whose float add/sub/mul carry `contract`: a message `x * w` folded into a
    sum becomes one fused multiply-add per element (half the floating-point work, and one
    rounding instead of two)."""

    def fadd(self, lhs, rhs, name="", flags=()):
        return super().fadd(lhs, rhs, name, _contract(lhs.type, flags))

    def fsub(self, lhs, rhs, name="", flags=()):
        return super().fsub(lhs, rhs, name, _contract(lhs.type, flags))

    def fmul(self, lhs, rhs, name="", flags=()):
        return super().fmul(lhs, rhs, name, _contract(lhs.type, flags))


class Emitter:
    """Builds one LLVM function: `b` emits at the current point; the `entry` block holds only
    the allocas and branches to `start` (added by finish()), so inserting an alloca never
    moves the instructions `b` is emitting."""

    def __init__(self, module: ir.Module, fn: ir.Function):
        self.module = module
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        self.start = fn.append_basic_block("start")
        self.b = ContractingBuilder(self.start)
        self._globals = 0
        self._decls: dict = {}
        # open_hoist() makes a block that runs once per call before the loops; values whose
        # pointers are in `invariant` (parameters) may be re-laid out there (transposed
        # weights: see rules/linalg.py)
        self._hoist_tail = None
        self._hoist_cont = None
        self.invariant: set = set()
        self._hoisted: dict = {}
        self.stack_bytes = 0        # bytes of the entry block's allocas
        self.heap_bytes = 0         # bytes of row buffers spilled to the heap block
        self._heap = None           # (heap pointer, its size global) once a buffer spills

    # ---- once-per-call code ------------------------------------------------------------

    def open_hoist(self) -> None:
        """Split the current point: code emitted through hoisted() runs here, once, before
        whatever `b` emits next. Call close_hoist() before finish()."""
        hoist = self.fn.append_basic_block("hoist")
        cont = self.fn.append_basic_block("hoist.cont")
        self.b.branch(hoist)
        self._hoist_tail, self._hoist_cont = hoist, cont
        self.b.position_at_end(cont)

    def close_hoist(self) -> None:
        if self._hoist_tail is not None:
            ir.IRBuilder(self._hoist_tail).branch(self._hoist_cont)
            self._hoist_tail = None

    def hoisted(self, key, make):
        """make() emitted once in the hoist block (cached by key); None without one."""
        if self._hoist_tail is None:
            return None
        if key not in self._hoisted:
            saved = self.b.block
            self.b.position_at_end(self._hoist_tail)
            self._hoisted[key] = make()
            self._hoist_tail = self.b.block
            self.b.position_at_end(saved)
        return self._hoisted[key]

    # ---- memory ------------------------------------------------------------------------

    def alloca(self, elem: ir.Type, n: int) -> ir.Value:
        """A stack array in the entry block (never inside a loop)."""
        self.stack_bytes += max(n, 1) * _type_bytes(elem)
        return ir.IRBuilder(self.entry).alloca(elem, size=i64(max(n, 1)))

    def finish(self) -> None:
        """Close the alloca block; call once when the function body is complete."""
        ir.IRBuilder(self.entry).branch(self.start)
        if self._heap is not None:
            heap, size = self._heap
            size.initializer = ir.Constant(I64, max(self.heap_bytes, 1))
            free = self._libc("free", ir.VoidType(), [PTR])
            for block in self.fn.blocks:
                for instr in list(block.instructions):
                    if isinstance(instr, ir.Ret):
                        b = ir.IRBuilder(block)
                        b.position_before(instr)
                        b.call(free, [heap])

    def new_buf(self, shape: tuple, dtype) -> Val:
        check_row(TensorType(tuple(shape), dtype), "a stack buffer")
        elem, n = storage_type(dtype), numel(shape)
        nbytes = max(n, 1) * _type_bytes(elem)
        if self.stack_bytes + nbytes <= STACK_BUDGET:
            return Val(shape, dtype, ptr=self.alloca(elem, n))
        return Val(shape, dtype, ptr=self._heap_slot(nbytes))

    def _heap_slot(self, nbytes: int) -> ir.Value:
        """`nbytes` of the kernel's heap block (malloc'd in the entry block, sized by finish())."""
        eb = ir.IRBuilder(self.entry)
        if self._heap is None:
            size = ir.GlobalVariable(self.module, I64, name=f"{self.fn.name}.heap_bytes")
            size.global_constant = True
            size.linkage = "internal"
            malloc = self._libc("malloc", PTR, [I64])
            self._heap = (eb.call(malloc, [eb.load(size, typ=I64)]), size)
        offset = -(-self.heap_bytes // HEAP_ALIGN) * HEAP_ALIGN
        self.heap_bytes = offset + nbytes
        return eb.gep(self._heap[0], [i64(offset)], source_etype=I8)

    def _libc(self, name: str, ret: ir.Type, args: list) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
            if name == "malloc":
                fn.return_value.attributes.add("noalias")
        return fn

    def lit(self, lit: Lit) -> Val:
        t = lit.type
        check_row(t, "a literal")
        value = np.asarray(lit.value)
        if value.ndim == 0 or value.size == 1 or np.all(value == value.flat[0]):
            first = value.reshape(-1)[0] if value.size else 0
            return Val(tuple(t.shape), t.dtype, scalar=const(t.dtype, first))
        return self.const_array(value, t)

    def const_array(self, value: np.ndarray, t: TensorType) -> Val:
        if value.nbytes > MAX_CONST_BYTES:
            raise CodegenUnsupported(f"a {value.nbytes}-byte constant inside a compiled region",
                                     hint="pass large arrays as parameters")
        elem = storage_type(t.dtype)
        flat = np.ascontiguousarray(value, dtype=t.dtype.np).reshape(-1)
        items = [const_storage(elem, t.dtype, v) for v in flat.tolist()]
        arr_t = ir.ArrayType(elem, len(items))
        g = ir.GlobalVariable(self.module, arr_t, name=f"tiga_const{self._globals}")
        self._globals += 1
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(arr_t, items)
        return Val(tuple(t.shape), t.dtype, ptr=g)

    # ---- control flow ------------------------------------------------------------------

    def loop(self, start, stop, body, name: str = "i", step: int = 1) -> None:
        """`for i in range(start, stop, step): body(i)` with i64 bounds (values or ints);
        with step > 1 the caller guarantees that stop - start is a multiple of step."""
        start = i64(start) if isinstance(start, int) else start
        stop = i64(stop) if isinstance(stop, int) else stop
        b = self.b
        pre = b.block
        body_bb = self.fn.append_basic_block(f"{name}.body")
        exit_bb = self.fn.append_basic_block(f"{name}.exit")
        b.cbranch(b.icmp_signed("<", start, stop), body_bb, exit_bb)
        b.position_at_end(body_bb)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        body(i)
        nxt = b.add(i, i64(step), flags=["nsw"])
        i.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, stop), body_bb, exit_bb)
        b.position_at_end(exit_bb)

    def loop_nest(self, shape: tuple, body, prefix=()) -> None:
        """Nested static loops over `shape`, calling body(idx) with one i64 per axis."""
        if not shape:
            body(list(prefix))
            return
        n = int(shape[0])
        if n == 0:
            return
        if n == 1:
            self.loop_nest(shape[1:], body, (*prefix, i64(0)))
            return
        self.loop(0, n, lambda i: self.loop_nest(shape[1:], body, (*prefix, i)),
                  name=f"ax{len(prefix)}")

    # ---- values ------------------------------------------------------------------------

    def fill(self, buf: Val, value: ir.Value) -> None:
        self.loop_nest(buf.shape, lambda idx: buf.store(self.b, idx, value))

    def copy_into(self, dst: Val, src: Val) -> None:
        """dst[...] = src[...] (src broadcasts when rank 0); dtypes must already agree."""
        self.loop_nest(dst.shape, lambda idx: dst.store(self.b, idx, src.load(self.b, idx)))

    def materialize(self, val: Val) -> Val:
        if val.is_contiguous():
            return val
        out = self.new_buf(val.shape, val.dtype)
        self.copy_into(out, val)
        return out

    def scalar_of(self, val: Val) -> Val:
        """A rank-0 value in a register (one load), so loops can reuse it freely."""
        if val.shape or val.is_scalar:
            return val
        return Val((), val.dtype, scalar=val.load(self.b, []))

    # ---- external functions ------------------------------------------------------------

    def intrinsic(self, name: str, ty: ir.Type) -> ir.Function:
        key = (name, str(ty))
        if key not in self._decls:
            self._decls[key] = self.module.declare_intrinsic(name, [ty])
        return self._decls[key]

    def prefetch_fn(self) -> ir.Function:
        if "prefetch" not in self._decls:
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [PTR, i32, i32, i32])
            self._decls["prefetch"] = ir.Function(self.module, fnty, name="llvm.prefetch.p0")
        return self._decls["prefetch"]

    def libm(self, name: str, ty: ir.Type) -> ir.Function:
        """A C math function (`tanh` / `tanhf`), resolved from the process at load time."""
        sym = name + ("f" if ty == F32 else "")
        if sym not in self._decls:
            fnty = ir.FunctionType(ty, [ty])
            self._decls[sym] = ir.Function(self.module, fnty, name=sym)
        return self._decls[sym]

    # ---- sub-programs ------------------------------------------------------------------

    def eval_program(self, closed: ClosedProgram, args: list) -> list:
        """Emit the equations of a row-level sub-program; returns its output values."""
        program = closed.program
        env: dict[int, Val] = {}
        for v, c in zip(program.in_binders, closed.consts):
            env[id(v)] = self.lit(Lit(c, v.type))
        for v, a in zip(program.in_binders[len(closed.consts):], args):
            env[id(v)] = a

        def read(a):
            return self.lit(a) if isinstance(a, Lit) else env[id(a)]

        rules = lowering_rules[BACKEND]
        for eqn in program.eqns:
            rule = rules.get(eqn.primitive)
            if rule is None:
                raise CodegenUnsupported(f"{eqn.primitive.name} has no cpu-llvm lowering "
                                         "inside an edge/update/reducer function")
            out_types = [v.type for v in eqn.outputs]
            for t in out_types:
                check_row(t, eqn.primitive.name)
            outs = rule(self, [a.type for a in eqn.inputs], out_types,
                        *[read(a) for a in eqn.inputs], **eqn.params)
            for v, o in zip(eqn.outputs, outs):
                env[id(v)] = self.scalar_of(o)
        return [read(a) for a in program.outs]


def _type_bytes(t: ir.Type) -> int:
    """Bytes of one value of `t` in memory (what an alloca of it takes)."""
    if isinstance(t, ir.IntType):
        return max(1, (t.width + 7) // 8)
    if isinstance(t, (ir.ArrayType, ir.VectorType)):
        return t.count * _type_bytes(t.element)
    return {ir.HalfType: 2, ir.FloatType: 4, ir.DoubleType: 8}.get(type(t), 8)


def row_value_bytes(program: ClosedProgram) -> int:
    """An upper bound of the row buffers `program` (an edge function) takes: every
    non-scalar value it computes, each in its own buffer (what explain() reports)."""
    total = 0
    for eqn in program.program.eqns:
        for v in eqn.outputs:
            t = v.type
            if isinstance(t, TensorType) and t.shape and all(
                    isinstance(d, (int, np.integer)) for d in t.shape):
                total += numel(t.shape) * max(1, t.dtype.itemsize)
    return total


def const_storage(elem: ir.Type, dtype, v) -> ir.Constant:
    if dtype.is_float:
        return ir.Constant(elem, float(v))
    return ir.Constant(elem, int(v))


def check_row(t, what: str) -> None:
    """Row-level values need static shapes and a compiled dtype."""
    if not isinstance(t, TensorType):
        raise CodegenUnsupported(f"{what}: a relation inside a row-level function")
    if any(not isinstance(d, (int, np.integer)) for d in t.shape):
        raise CodegenUnsupported(f"{what}: symbolic row shape {t} (rows need static shapes)")
    if not supported(t.dtype):
        storage_type(t.dtype)  # raises the dtype's reason
    if numel(t.shape) > MAX_ROW_ELEMENTS:
        raise CodegenUnsupported(f"{what}: a row of {numel(t.shape)} elements ({t}) exceeds "
                                 f"the {MAX_ROW_ELEMENTS}-element stack budget")


__all__ = ["Emitter", "BACKEND", "PTR", "STACK_BUDGET", "check_row", "row_value_bytes"]
