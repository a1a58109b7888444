"""core: abstract values of programs: TensorType (maybe symbolic shape) and GraphType."""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType, as_dtype, int64
from .errors import ShapeError


@dataclass(frozen=True)
class Dim:
    """A symbolic axis length (N destinations, S sources, E edges) fixed per call."""

    name: str

    def __repr__(self) -> str:
        return self.name


Size = int | Dim


def fmt_dim(d: Size) -> str:
    return str(d)


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of an array value. `weak` marks Python-scalar origin (promotion only)."""

    shape: tuple
    dtype: DType
    weak: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_symbolic(self) -> bool:
        return any(isinstance(d, Dim) for d in self.shape)

    def update(self, shape=None, dtype=None, weak=None) -> TensorType:
        return TensorType(self.shape if shape is None else shape,
                          self.dtype if dtype is None else dtype,
                          self.weak if weak is None else weak)

    def strong(self) -> TensorType:
        return self.update(weak=False) if self.weak else self

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(fmt_dim(d) for d in self.shape)}]"


@dataclass(frozen=True)
class GraphType:
    """Type of a relation operand: its kind, cardinalities, index dtype, coordinate dims."""

    kind: str
    num_src: Size
    num_dst: Size
    num_edges: Size | None
    index_dtype: DType = int64
    coord_dims: int | None = None

    def __str__(self) -> str:
        e = "?" if self.num_edges is None else fmt_dim(self.num_edges)
        extra = "" if self.index_dtype == int64 else f",{self.index_dtype.short}"
        extra += "" if self.coord_dims is None else f",d{self.coord_dims}"
        return f"{self.kind}[{fmt_dim(self.num_src)},{fmt_dim(self.num_dst)};{e}{extra}]"


Type = TensorType | GraphType


def dims_equal(a: Size, b: Size) -> bool:
    return a == b


def broadcast_shapes(*shapes: tuple, what: str = "operands") -> tuple:
    """numpy broadcasting that also accepts symbolic dims (equal symbols or 1 broadcast)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = [s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0]
        chosen: Size = 1
        for d in sizes:
            if d == 1 or d == chosen:
                continue
            if chosen == 1:
                chosen = d
            else:
                raise ShapeError(f"{what}: shapes {' and '.join(map(_fmt_shape, shapes))} "
                                 f"do not broadcast (axis {axis - ndim}: {chosen} vs {d})")
        out.append(chosen)
    return tuple(out)


def _fmt_shape(s: tuple) -> str:
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def fmt_shape(s: tuple) -> str:
    return _fmt_shape(s)


def size_of(shape: tuple) -> int | None:
    """Element count, or None when a dim is symbolic."""
    n = 1
    for d in shape:
        if isinstance(d, Dim):
            return None
        n *= int(d)
    return n


def normalize_axes(axis, ndim: int, what: str = "axis") -> tuple:
    """Turn an int, sequence or None into a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int) or not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{what}: axis {a} is out of range for an array of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {axes}")
    return tuple(sorted(out))
