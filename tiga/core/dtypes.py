"""core: Tiga's dtypes, their numpy storage types and the promotion lattice."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .errors import DTypeError

# bfloat16 storage comes from ml_dtypes, the package JAX uses for it. Importing it costs
# 0.6-0.8 s (most of `import tiga`), and only bfloat16 needs it: it is imported the first
# time a bfloat16 numpy dtype is asked for.
_BF16_CACHE: list = []


def _bf16_np():
    """ml_dtypes' bfloat16 numpy dtype (importing ml_dtypes on first use), or None."""
    if not _BF16_CACHE:
        try:
            import ml_dtypes as _ml_dtypes

            _BF16_CACHE.append(np.dtype(_ml_dtypes.bfloat16))
        except ImportError:  # pragma: no cover - ml_dtypes is a core dependency
            _BF16_CACHE.append(None)
    return _BF16_CACHE[0]


@dataclass(frozen=True)
class DType:
    """A scalar type. `kind` is 'bool', 'int', 'uint' or 'float'."""

    name: str
    short: str
    kind: str
    bits: int

    @property
    def np(self) -> np.dtype:
        if self.name == "bfloat16":
            bf16 = _bf16_np()
            if bf16 is None:
                raise DTypeError("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
            return bf16
        return np.dtype(self.name if self.name != "bool" else np.bool_)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    def __repr__(self) -> str:
        return f"tg.{self.name if self.name != 'bool' else 'bool_'}"


bool_ = DType("bool", "bool", "bool", 1)
int8 = DType("int8", "i8", "int", 8)
int16 = DType("int16", "i16", "int", 16)
int32 = DType("int32", "i32", "int", 32)
int64 = DType("int64", "i64", "int", 64)
uint8 = DType("uint8", "u8", "uint", 8)
float16 = DType("float16", "f16", "float", 16)
bfloat16 = DType("bfloat16", "bf16", "float", 16)
float32 = DType("float32", "f32", "float", 32)
float64 = DType("float64", "f64", "float", 64)

ALL_DTYPES = (bool_, int8, int16, int32, int64, uint8, float16, bfloat16, float32, float64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NAME["bool_"] = bool_
FLOATS = (float16, bfloat16, float32, float64)


def as_dtype(obj) -> DType:
    """Map a DType, numpy dtype, name or torch dtype-like object to a Tiga DType."""
    if isinstance(obj, DType):
        return obj
    if isinstance(obj, str) and obj in _BY_NAME:
        return _BY_NAME[obj]
    if isinstance(obj, np.dtype):     # every result wraps its array's dtype: keep it cheap
        found = _BY_NP.get(obj)
        if found is None:
            found = _BY_NP[obj] = _as_dtype_slow(obj)
        return found
    return _as_dtype_slow(obj)


_BY_NP: dict = {}


def _as_dtype_slow(obj) -> DType:
    name = str(obj).replace("torch.", "")
    if name in _BY_NAME:
        return _BY_NAME[name]
    try:
        npd = np.dtype(obj)
    except TypeError as exc:
        raise DTypeError(f"dtype: expected a Tiga, numpy or torch dtype, found {obj!r}") from exc
    # an ml_dtypes bfloat16 can only be here if ml_dtypes is already imported
    if "ml_dtypes" in sys.modules and npd == _bf16_np():
        return bfloat16
    if npd.kind == "b":
        return bool_
    if npd.name in _BY_NAME:
        return _BY_NAME[npd.name]
    raise DTypeError(f"dtype: {npd.name} is not supported; use one of "
                     f"{', '.join(d.name for d in ALL_DTYPES)}")


def promote(a: DType, b: DType, a_weak: bool = False, b_weak: bool = False) -> DType:
    """Result dtype of a binary op.

    Unlike numpy, int with float gives the float (not float64), and a weakly typed
    operand (a Python scalar) never widens the other operand within its kind.
    """
    if a == b:
        return a
    order = {"bool": 0, "uint": 1, "int": 1, "float": 2}
    if a_weak != b_weak:
        strong, weak = (b, a) if a_weak else (a, b)
        if order[weak.kind] <= order[strong.kind]:
            return strong
        return float32 if weak.kind == "float" else weak
    if order[a.kind] != order[b.kind]:
        return a if order[a.kind] > order[b.kind] else b
    if a.kind == "float":
        if {a.name, b.name} == {"float16", "bfloat16"}:
            return float32
        return a if a.bits >= b.bits else b
    if a.kind != b.kind:  # uint with int: signed type wide enough for both
        width = max(a.bits if a.kind == "int" else 2 * a.bits,
                    b.bits if b.kind == "int" else 2 * b.bits)
        return _BY_NAME[f"int{min(width, 64)}"]
    return a if a.bits >= b.bits else b


def compute_dtype(d: DType) -> DType:
    """The dtype arithmetic runs in: half-precision storage computes in float32."""
    return float32 if d in (float16, bfloat16) else d
