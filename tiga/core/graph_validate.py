"""core: reading and validating relation inputs (index arrays, counts, relation parameters).

Every rule raises `GraphValidationError` naming the argument, the first offending position,
what was found and the rule that was expected. Nothing here lets a numpy exception escape.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .errors import GraphValidationError

LEVELS = ("none", "basic", "full")
INDEX_MAX = np.iinfo(np.int64).max
_INT32_MAX = np.iinfo(np.int32).max
# DLPack device type codes that hold host memory numpy can read directly.
_DLPACK_HOST = (1, 3)
_DLPACK_NAMES = {2: "cuda", 10: "rocm"}


def check_level(validate: Any) -> str:
    """The validation level named by `validate`."""
    if isinstance(validate, str) and validate in LEVELS:
        return validate
    raise GraphValidationError(
        f"validate: is {validate!r}, expected one of 'full', 'basic', 'none'")


def level_min(levels) -> str:
    """The weakest of several validation levels (a composite is only as checked as its parts)."""
    return min(levels, key=LEVELS.index, default="full")


def input_device(obj: Any) -> str:
    """'cpu', or 'cuda:N' for an object that DLPack places on an accelerator."""
    try:
        dev_type, dev_id = obj.__dlpack_device__()
    except Exception:  # no DLPack device, or a producer that cannot tell: host data
        return "cpu"
    if int(dev_type) in _DLPACK_HOST:
        return "cpu"
    return f"{_DLPACK_NAMES.get(int(dev_type), f'dlpack{int(dev_type)}')}:{int(dev_id)}"


def layout_problem(obj: Any) -> tuple[str, str] | None:
    """(what is wrong, hint) for a torch-like tensor Tiga cannot read as a dense array: nested,
    sparse or meta tensors (duck-typed: core never imports torch); None for anything else."""
    if getattr(obj, "is_nested", False) is True:
        return ("is a nested torch tensor (ragged rows), expected a strided tensor",
                "pass the rows as one flat tensor with a tg.Graph.cu_seqlens relation over "
                "them, or pad them (torch.nested.to_padded_tensor)")
    layout = getattr(obj, "layout", None)
    if (layout is not None and str(layout).startswith("torch.") and
            str(layout) != "torch.strided"):
        return (f"torch tensor has layout {layout}, expected torch.strided (dense)",
                "a sparse adjacency is a relation, not a field: pass it as the relation "
                "(a tg.nn layer's edge_index argument takes adj_t as it is; else "
                "tg.Graph.from_csr(t.crow_indices(), t.col_indices(), num_src=...), "
                "tg.Graph.from_coo or tg.Graph.from_scipy); only a field that is "
                "really dense data should be passed as t.to_dense()")
    if getattr(getattr(obj, "device", None), "type", None) == "meta":
        return ("torch tensor is on the meta device and holds no data, expected a CPU or "
                "CUDA tensor", "materialise it first (e.g. torch.empty_like(t, "
                               "device='cpu') or module.to_empty(device='cpu'))")
    return None


def _to_host(obj: Any, name: str) -> Any:
    """Detach autograd tensors and copy accelerator tensors to host memory."""
    if callable(getattr(obj, "detach", None)):
        obj = obj.detach()
    if input_device(obj) != "cpu":
        if not callable(getattr(obj, "cpu", None)):
            raise GraphValidationError(
                f"{name}: lives on {input_device(obj)} and has no .cpu() method, "
                "expected a host array or a tensor that can be copied to the host")
        obj = obj.cpu()
    return obj


def as_numpy(obj: Any, name: str) -> np.ndarray:
    """View `obj` (ndarray, list, __array__ or __dlpack__ producer) as an ndarray, zero-copy
    where the producer allows it."""
    problem = None if isinstance(obj, np.ndarray) else layout_problem(obj)
    if problem is not None:
        raise GraphValidationError(f"{name}: {problem[0]} ({problem[1]})")
    try:
        obj = _to_host(obj, name)
        if isinstance(obj, np.ndarray):
            return obj
        if hasattr(obj, "__array__") or not hasattr(obj, "__dlpack__"):
            arr = np.asarray(obj)
        else:
            arr = np.from_dlpack(obj)
    except GraphValidationError:
        raise
    except Exception as exc:  # ragged lists, huge Python ints, broken producers, ...
        raise GraphValidationError(
            f"{name}: could not be read as an array ({type(exc).__name__}: {exc}), "
            "expected a 1-D integer array") from exc
    # An empty Python list has no element type; numpy would call it float64.
    if arr.size == 0 and isinstance(obj, (list, tuple)):
        arr = arr.astype(np.int64)
    return arr


def read_index_array(obj: Any, name: str, ndim: int = 1) -> np.ndarray:
    """An integer array of rank `ndim` read from `obj`; these checks run at every level because
    storage needs a dtype and a shape."""
    arr = as_numpy(obj, name)
    if arr.dtype.kind not in "iu":
        found = "bool" if arr.dtype.kind == "b" else arr.dtype.name
        raise GraphValidationError(
            f"{name}: dtype is {found}, expected an integer dtype (int32 or int64)")
    if arr.ndim != ndim:
        raise GraphValidationError(
            f"{name}: has shape {tuple(arr.shape)}, expected a {ndim}-D array")
    return arr


def index_dtype_for(dtype: np.dtype) -> np.dtype:
    """Storage dtype for indices read as `dtype`: int32 stays int32 (narrow types widen to it),
    everything else becomes int64."""
    if dtype.kind in "iu" and dtype.itemsize < 4 or dtype == np.int32:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def as_index(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`arr` as a contiguous native-order array of `dtype`; no copy when it already is one."""
    return np.ascontiguousarray(arr, dtype=dtype)


def read_copy_flag(copy: Any) -> bool:
    if isinstance(copy, (bool, np.bool_)):
        return bool(copy)
    raise GraphValidationError(f"copy: is {copy!r}, expected True or False")


def owned_index(arr: np.ndarray, given: Any, dtype: np.dtype, copy: bool,
                name: str) -> np.ndarray:
    """`arr` (read from the caller's `given`) as contiguous `dtype` storage the graph owns.

    A graph must not read memory the caller can still write: a later write could send a
    compiled kernel out of bounds. copy=True stores a private copy (none is made when the
    dtype conversion already made one). copy=False keeps the caller's memory and marks it
    read-only, so a later write raises numpy's ValueError; memory numpy cannot freeze (torch
    tensors, buffers, memory maps) is copied anyway.
    """
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > INDEX_MAX:
        # storage is signed 64-bit: such an entry would wrap to a negative id
        pos = first_true(arr > INDEX_MAX)
        raise GraphValidationError(f"{name}: entry at position {pos} is {int(arr[pos])}, "
                                   f"expected at most {INDEX_MAX} (int64 index storage)")
    out = as_index(arr, dtype)
    if isinstance(given, (list, tuple)) or not np.may_share_memory(out, arr):
        return out     # a fresh array nobody else holds
    if not copy and _freeze(out):
        return out
    return out.copy()


def _freeze(arr: np.ndarray) -> bool:
    """Make `arr` and every numpy array it views read-only; False (nothing changed) when the
    memory belongs to something that is not a numpy array."""
    chain, a = [], arr
    while isinstance(a, np.ndarray):
        chain.append(a)
        a = a.base
    if a is not None or not chain[-1].flags.owndata:
        return False
    for a in chain:
        a.flags.writeable = False
    return True


def check_count(value: Any, name: str, note: str = "") -> int:
    """A non-negative size (num_src, num_dst, a shape entry) as a Python int."""
    if isinstance(value, (bool, np.bool_)):
        raise GraphValidationError(f"{name}: is {value!r}{note}, expected a non-negative integer")
    try:
        n = operator.index(value)
    except TypeError:
        raise GraphValidationError(
            f"{name}: is {value!r}{note}, expected a non-negative integer") from None
    if not 0 <= n <= INDEX_MAX:
        raise GraphValidationError(
            f"{name}: is {n}{note}, expected a non-negative integer <= {INDEX_MAX}")
    return int(n)


def first_true(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def check_range(arr: np.ndarray, name: str, bound: int, bound_name: str) -> None:
    """Every entry satisfies 0 <= entry < bound (full validation, O(E))."""
    if arr.size == 0:
        return
    # min/max are cheaper than a mask; the mask is only built to locate a failure.
    if int(arr.min()) >= 0 and int(arr.max()) < bound:
        return
    pos = first_true((arr < 0) | (arr >= bound))
    raise GraphValidationError(
        f"{name}: entry at position {pos} is {int(arr[pos])}, "
        f"expected 0 <= {name} < {bound_name} = {bound}")


def check_row_ptr_ends(row_ptr: np.ndarray, num_edges: int, names: tuple) -> None:
    """The O(1) CSR rules: row_ptr[0] == 0 and row_ptr[-1] == len(col_idx)."""
    rp, ci = names
    if int(row_ptr[0]) != 0:
        raise GraphValidationError(
            f"{rp}: entry at position 0 is {int(row_ptr[0])}, expected {rp}[0] == 0")
    last = int(row_ptr[-1])
    if last != num_edges:
        raise GraphValidationError(
            f"{rp}: last entry (position {len(row_ptr) - 1}) is {last}, "
            f"expected {rp}[-1] == len({ci}) = {num_edges}")


def check_monotonic(arr: np.ndarray, name: str) -> None:
    """Non-decreasing entries; compares neighbours directly so unsigned dtypes cannot wrap."""
    if arr.size < 2:
        return
    bad = arr[1:] < arr[:-1]
    if bad.any():
        pos = first_true(bad) + 1
        raise GraphValidationError(
            f"{name}: entry at position {pos} is {int(arr[pos])}, expected non-decreasing "
            f"{name} (entry at position {pos - 1} is {int(arr[pos - 1])})")


def check_csr(row_ptr: np.ndarray, col_idx: np.ndarray, num_src: int, level: str,
              names: tuple = ("row_ptr", "col_idx"), bound_name: str = "num_src") -> None:
    """The CSR rules of API.md section 2 at `level` ('none' checks nothing)."""
    if level == "none":
        return
    check_row_ptr_ends(row_ptr, len(col_idx), names)
    if level == "full":
        check_monotonic(row_ptr, names[0])
        check_range(col_idx, names[1], num_src, bound_name)


def check_same_length(a: np.ndarray, b: np.ndarray, names: tuple) -> None:
    if len(a) != len(b):
        raise GraphValidationError(
            f"{names[1]}: has length {len(b)}, expected len({names[1]}) == "
            f"len({names[0]}) = {len(a)}")


def check_coo(src: np.ndarray, dst: np.ndarray, num_src: int, num_dst: int, level: str,
              names: tuple = ("src", "dst"), bounds: tuple = ("num_src", "num_dst")) -> None:
    """COO range rules (lengths are checked at construction, whatever the level)."""
    if level == "full":
        check_range(src, names[0], num_src, bounds[0])
        check_range(dst, names[1], num_dst, bounds[1])


def read_cu_seqlens(cu_seqlens: Any) -> tuple:
    """Sequence boundaries: 1-D integers, starting at 0, non-decreasing."""
    arr = read_index_array(cu_seqlens, "cu_seqlens")
    if arr.size == 0:
        raise GraphValidationError(
            "cu_seqlens: has length 0, expected at least one entry (cu_seqlens[0] == 0)")
    if int(arr[0]) != 0:
        raise GraphValidationError(
            f"cu_seqlens: entry at position 0 is {int(arr[0])}, expected cu_seqlens[0] == 0")
    check_monotonic(arr, "cu_seqlens")
    check_count(int(arr[-1]), "cu_seqlens[-1]")
    return tuple(int(v) for v in arr.tolist())


def read_shape(shape: Any) -> tuple:
    """A lattice shape: a non-empty sequence of non-negative integers."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        entries = list(shape)
    except TypeError:
        raise GraphValidationError(
            f"shape: is {shape!r}, expected a sequence of non-negative integers") from None
    if not entries:
        raise GraphValidationError("shape: is empty, expected at least one dimension")
    out = tuple(check_count(n, f"shape: entry at position {i}") for i, n in enumerate(entries))
    total = 1
    for n in out:
        total *= n
    if total > INDEX_MAX:
        raise GraphValidationError(f"shape: has {total} points, expected at most {INDEX_MAX}")
    return out


def _read_offset(off: Any, pos: int, rank: int) -> tuple:
    try:
        entries = list(off)
        if isinstance(off, (str, bytes)) or any(isinstance(v, (bool, np.bool_)) for v in entries):
            raise TypeError
        vec = tuple(int(operator.index(v)) for v in entries)
    except TypeError:
        raise GraphValidationError(
            f"offsets: entry at position {pos} is {off!r}, "
            f"expected a tuple of {rank} integers") from None
    if len(vec) != rank:
        raise GraphValidationError(
            f"offsets: entry at position {pos} has {len(vec)} components, "
            f"expected len(shape) = {rank}")
    if any(abs(v) > _INT32_MAX for v in vec):
        raise GraphValidationError(
            f"offsets: entry at position {pos} is {vec}, expected components within "
            f"+-{_INT32_MAX}")
    return vec


def read_offsets(offsets: Any, rank: int) -> tuple:
    """Stencil offsets: a sequence of integer tuples, each with `rank` components."""
    if isinstance(offsets, np.ndarray):
        offsets = offsets.tolist()
    try:
        entries = list(offsets)
    except TypeError:
        raise GraphValidationError(
            f"offsets: is {offsets!r}, expected a sequence of integer tuples") from None
    return tuple(_read_offset(off, i, rank) for i, off in enumerate(entries))


def read_flag(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise GraphValidationError(f"{name}: is {value!r}, expected True or False")
