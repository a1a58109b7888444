"""lower/llvm: row-level values of generated code: static shapes, strided views, scalars.

A `Val` is one row-level value of a sub-program (an edge, update or reducer region). It is
either a broadcast scalar held in a register (`scalar`) or a strided view of memory (`ptr`,
`strides` in elements): an input row in a field array, a parameter, a stack buffer or a
constant. Shape ops (reshape, transpose, slice, broadcast) only build new views, so most of
them cost nothing in the generated code.
"""
from __future__ import annotations

from llvmlite import ir

from ...core.dtypes import DType
from ...core.errors import UnsupportedError

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I64 = ir.IntType(64)
PTR = ir.PointerType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
F16 = ir.HalfType()

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


class CodegenUnsupported(UnsupportedError):
    """This propagate (or one primitive in it) has no cpu-llvm code generation yet.

    The runtime catches it and runs the reference interpreter for that equation, recording
    the message as the reason `explain()` reports.
    """


def supported(dtype: DType) -> bool:
    return dtype.name in ("bool", "float16", "float32", "float64") or dtype.name in _INT_BITS


def storage_type(dtype: DType) -> ir.Type:
    """LLVM type of one element in memory (numpy layout: bool is one byte)."""
    if dtype.name == "float32":
        return F32
    if dtype.name == "float64":
        return F64
    if dtype.name == "float16":
        # LLVM promotes each half operation to float and rounds back, which is exactly
        # numpy's float16 arithmetic
        return F16
    if dtype.name == "bool":
        return I8
    if dtype.name in _INT_BITS:
        return ir.IntType(_INT_BITS[dtype.name])
    raise CodegenUnsupported(f"dtype {dtype.name} is not compiled on cpu-llvm (float16, "
                             "float32, float64, bool and signed integers are)",
                             hint="convert bfloat16 or unsigned fields to float32/int32")


def compute_type(dtype: DType) -> ir.Type:
    """LLVM type of one element in registers (bool is i1)."""
    return I1 if dtype.name == "bool" else storage_type(dtype)


def const(dtype: DType, value) -> ir.Constant:
    if dtype.is_float:
        return ir.Constant(compute_type(dtype), float(value))
    if dtype.name == "bool":
        return ir.Constant(I1, int(bool(value)))
    return ir.Constant(compute_type(dtype), int(value))


def i64(value: int) -> ir.Constant:
    return ir.Constant(I64, int(value))


def contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


def numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class Val:
    """A row-level value: a broadcast register scalar, or a strided view of memory."""

    __slots__ = ("shape", "dtype", "ptr", "strides", "scalar")

    def __init__(self, shape: tuple, dtype: DType, *, ptr=None, strides=None, scalar=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.ptr = ptr
        self.scalar = scalar
        self.strides = tuple(strides) if strides is not None else contiguous_strides(self.shape)

    @property
    def is_scalar(self) -> bool:
        return self.scalar is not None

    def is_contiguous(self) -> bool:
        if self.is_scalar:
            return False
        want = contiguous_strides(self.shape)
        return all(s == w for d, s, w in zip(self.shape, self.strides, want) if d != 1)

    def with_shape(self, shape: tuple, strides: tuple, ptr=None) -> Val:
        if self.is_scalar:
            return Val(shape, self.dtype, scalar=self.scalar)
        return Val(shape, self.dtype, ptr=self.ptr if ptr is None else ptr, strides=strides)

    def address(self, b: ir.IRBuilder, idx) -> ir.Value:
        """Pointer to element `idx` (a list of i64 values, one per axis)."""
        lin = linear_index(b, idx, self.strides)
        return b.gep(self.ptr, [lin], source_etype=storage_type(self.dtype))

    def load(self, b: ir.IRBuilder, idx) -> ir.Value:
        """Element `idx` in its compute type; rank-0 values ignore `idx` (they broadcast)."""
        if self.is_scalar:
            return self.scalar
        x = b.load(self.address(b, idx if self.shape else []), typ=storage_type(self.dtype))
        return b.icmp_unsigned("!=", x, ir.Constant(I8, 0)) if self.dtype.name == "bool" else x

    def store(self, b: ir.IRBuilder, idx, value: ir.Value) -> None:
        if self.dtype.name == "bool":
            value = b.zext(value, I8)
        b.store(value, self.address(b, idx))


def linear_index(b: ir.IRBuilder, idx, strides) -> ir.Value:
    terms = []
    for i, s in zip(idx, strides):
        if s == 0:
            continue
        terms.append(i if s == 1 else b.mul(i, i64(s), flags=["nsw"]))
    if not terms:
        return i64(0)
    out = terms[0]
    for t in terms[1:]:
        out = b.add(out, t, flags=["nsw"])
    return out


def cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """numpy `astype` semantics between the compiled dtypes (bool, signed ints, floats)."""
    if src == dst:
        return x
    to = compute_type(dst)
    if dst.name == "bool":
        if src.is_float:
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
        return b.icmp_signed("!=", x, ir.Constant(x.type, 0))
    if src.name == "bool":
        return b.uitofp(x, to) if dst.is_float else b.zext(x, to)
    if src.is_float and dst.is_float:
        return b.fpext(x, to) if dst.bits > src.bits else b.fptrunc(x, to)
    if src.is_float:
        return b.fptosi(x, to)
    if dst.is_float:
        return b.sitofp(x, to)
    if dst.bits > src.bits:
        return b.sext(x, to)
    return b.trunc(x, to)
