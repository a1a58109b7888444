"""trace: checks on what a message-passing call is given and what its functions return.

Each failure names the argument, field or function, the rule and what was found, before any
numpy or tracing error could surface without that context (API.md section 9).
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..core.dtypes import as_dtype
from ..core.errors import DTypeError, TigaError, TraceError, UnsupportedError
from ..core.graph_validate import layout_problem
from .tracer import Tracer

_INT64 = (-(1 << 63), (1 << 63) - 1)


def fn_name(fn: Callable) -> str:
    """How an edge/update/reducer function is named in messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    # `f.<locals>.Layer.edge` reads better as `Layer.edge`
    return name.rsplit("<locals>.", 1)[-1] if name else repr(fn)


def _keyword_names(fn: Callable, skip: int) -> set | None:
    """Keyword parameters `fn` accepts beyond its first `skip` positional ones;
    None when it takes **kwargs or cannot be inspected (it accepts anything). Memoised
    per code object: inspect.signature costs ~0.1 ms, a warm call's budget."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return _inspected(fn, skip)
    key = (code, hasattr(fn, "__self__"), skip)
    if key not in _NAMES:
        if len(_NAMES) > 4096:
            _NAMES.clear()
        _NAMES[key] = _inspected(fn, skip)
    return _NAMES[key]


# (code object, bound method?, skip) -> keyword names: a memo of what the code declares,
# never a value of a call
_NAMES: dict = {}


def _inspected(fn: Callable, skip: int) -> set | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = sum(1 for p in params if p.kind is not p.KEYWORD_ONLY)
    return {p.name for p in named[max(0, min(skip, positional)):]}


def check_keywords(caller: str, call_keywords: Iterable[str], edge_fn: Callable,
                   update: Callable | None, params: dict) -> None:
    """Every extra keyword of the call must be a parameter of the edge or update function
    (API.md section 4: such keywords are runtime operands); a typo like `egde=` is named."""
    if not params:
        return
    accepted: set = set()
    for fn, skip in ((edge_fn, 3), (update, 2)):
        if fn is None:
            continue
        names = _keyword_names(fn, skip)
        if names is None:
            return
        accepted |= names
    unknown = sorted(k for k in params if k not in accepted)
    if not unknown:
        return
    valid = list(call_keywords) + sorted(accepted)
    close = difflib.get_close_matches(unknown[0], valid, n=1)
    guess = f"; did you mean {close[0]}=?" if close else ""
    own = ", ".join(sorted(accepted)) or "none"
    fns = fn_name(edge_fn) + ("" if update is None else f" / {fn_name(update)}")
    raise TigaError(f"{unknown[0]}: unexpected keyword argument of {caller}; it takes "
                    f"{', '.join(call_keywords)} and the keyword parameters of {fns} "
                    f"({own}){guess}")


def field_dict(role: str, fields) -> dict:
    """The `src=` / `dst=` / `edge=` argument: a mapping of field name -> array, or None."""
    if type(fields) is dict:    # (the common case, before the slower ABC check)
        return dict(fields)
    if fields is None:
        return {}
    if not isinstance(fields, Mapping):
        raise TigaError(f"{role}: expected a dict of field name -> array (e.g. {role}="
                        f"{{'x': array}}) or None, found {type(fields).__name__}")
    return dict(fields)


_SUPPORTED: set = set()    # numpy dtypes as_dtype accepted (a memo: every call checks)


def check_fields(role: str, fields: dict) -> None:
    """The fields of one role: identifier names, operand values (`check_operand`)."""
    for name, value in fields.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TigaError(f"{role}: field names must be identifiers, found {name!r}")
        if type(value) is not np.ndarray or value.dtype not in _SUPPORTED:
            check_operand(f"{role}.{name}", value)


def check_operand(label: str, value) -> None:
    """A field or keyword operand: an array (numpy, tg.Tensor, torch, any __array__ or
    DLPack producer) of a supported dtype, or a Python/numpy scalar."""
    if type(value) is np.ndarray and value.dtype in _SUPPORTED:
        return
    if isinstance(value, (Tracer, bool, float, np.generic)):
        return
    problem = None if isinstance(value, np.ndarray) else layout_problem(value)
    if problem is not None:
        raise UnsupportedError(f"{label}: {problem[0]}", hint=problem[1])
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise DTypeError(f"{label}: Python int {value} does not fit int64")
        return
    dtype = getattr(value, "dtype", None)
    if dtype is None and isinstance(value, (list, tuple)):
        try:
            dtype = np.asarray(value).dtype
        except (ValueError, TypeError, OverflowError) as exc:
            raise DTypeError(f"{label}: could not be read as an array ({exc})") from None
    if dtype is None:
        if hasattr(value, "__array__") or hasattr(value, "__dlpack__"):
            return
        raise DTypeError(f"{label}: expected an array (numpy, tg.Tensor or torch) or a "
                         f"number, found {type(value).__name__}")
    try:
        as_dtype(dtype)
    except DTypeError:
        kind = "torch dtype" if str(dtype).startswith("torch.") else "dtype"
        raise DTypeError(f"{label}: {kind} {dtype} is not supported; expected a float, integer "
                         "or bool dtype (float16, bfloat16, float32, float64, int8 to int64, "
                         "uint8, bool)") from None
    if type(value) is np.ndarray:
        _SUPPORTED.add(dtype)


def check_edge_output(out, edge_fn: Callable) -> None:
    """What an edge function returned must be a message: no None, no non-numeric objects."""
    parts = out if isinstance(out, (tuple, list)) else (out,)
    if out is None or any(p is None for p in parts):
        raise TraceError(f"edge function {fn_name(edge_fn)}: returned None; it must return "
                         "the message, e.g. `return src.x * edge.w` (is a `return` missing?)")
    for p in parts:
        if isinstance(p, (str, bytes, dict, set)):
            raise TraceError(f"edge function {fn_name(edge_fn)}: returned a "
                             f"{type(p).__name__}, expected an array (the message)")


def checked_region(fn: Callable, reducer: str, what: str, same_as=None) -> Callable:
    """`fn` (a user reducer's lift/combine/finalize) wrapped so that anything but one array
    of the message's type (`same_as`; finalize may change it) fails naming the reducer."""
    def wrapped(*args):
        out = fn(*args)
        if out is None or isinstance(out, (tuple, list, dict)):
            found = "None" if out is None else f"a {type(out).__name__} of {len(out)}"
            raise TraceError(f"reducer {reducer!r}: {what} returned {found}, expected one "
                             f"array{'' if same_as is None else f' of type {same_as}'}")
        if (same_as is not None and isinstance(out, Tracer) and
                tuple(out.aval.shape) != tuple(same_as.shape)):
            raise TraceError(f"reducer {reducer!r}: {what} returned shape "
                             f"{tuple(out.aval.shape)}, expected the message shape "
                             f"{tuple(same_as.shape)}")
        return out
    return wrapped
