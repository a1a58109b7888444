"""core: reducer algebra (identity, lift, combine, finalize) and the built-in reducers.

Precision rule, followed by every route (the reference interpreter in core/segment.py, the
cpu-llvm kernels in lower/llvm/reducers.py, the Triton kernels in lower/triton/reducers.py):
float16 and bfloat16 messages are summed, averaged, multiplied and softmax-weighted in
float32, and the result is rounded once to the message dtype at the end of the row. max and
min are exact (they keep the message dtype); float32 and float64 accumulate in their own
dtype. Tolerance: an entry over n messages x_i is within ulp(exact) + n * 2**-24 * sum|x_i|
of the exact (float64) result, ulp being the spacing of the result dtype at that value;
routes may add in different orders, so they agree to that bound, not bit for bit
(tests/hostile/test_precision_wave3.py checks it on every route).

Non-finite messages follow numpy on every route: a NaN reaches the row's max, min, sum,
mean and prod; online_softmax's row is NaN for a NaN or +inf score, or when every score is
-inf (tests/lower/test_nonfinite_differential.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .errors import TigaError

BUILTIN = ("sum", "mean", "max", "min", "prod", "online_softmax", "argmin", "argmax")
# reducers whose empty row value `empty=` may set (None: the default, 0 or 1)
EMPTY_SETTABLE = ("max", "min", "prod")
# arg-reducers: the winning source id (of="src") or edge id (of="edge"); an int64 result
ARG = ("argmin", "argmax")
ARG_OF = ("src", "edge")


class ReducerMessage:
    """What `self.reducer(score, value)` returns in an edge function: packaged message parts.

    It does not aggregate anything per edge; it binds the parts for capture.
    """

    __slots__ = ("reducer", "parts")

    def __init__(self, reducer: Reducer, parts: tuple):
        self.reducer = reducer
        self.parts = parts


class Reducer:
    """A reducer: `finalize(fold(combine, identity, map(lift, messages)))`.

    User reducers give Python callables; the tracer stages them into regions
    (`traced(...)`) before a program stores them, so program structure never depends
    on object identity; they fold in their state's dtype.

    Built-in reducers over float16/bfloat16 messages accumulate in float32 and round once
    to the message dtype (max/min are exact): each result entry over n messages x_i is
    within ulp(exact) + n * 2**-24 * sum|x_i| of the exact value, on every route.
    NaN and inf behave as in numpy (a NaN message makes its row's max/min/sum NaN).
    """

    def __init__(self, name: str, identity: Any = 0.0, combine: Callable | None = None,
                 finalize: Callable | None = None, lift: Callable | None = None,
                 commutative: bool = True, associative: bool = True, *,
                 _builtin: bool = False, prune_threshold: float | None = None,
                 stats: bool = False, empty: float | None = None, of: str | None = None):
        if not _builtin:
            _check_user_reducer(name, identity, (combine, finalize, lift),
                                (commutative, associative))
        self.name = name
        self.identity = identity
        self.combine = combine
        self.finalize = finalize
        self.lift = lift
        self.commutative = commutative
        self.associative = associative
        self.builtin = _builtin
        self.prune_threshold = prune_threshold
        # online_softmax only: also return the per-row statistics (row max of the scores,
        # mass = sum exp(score - max)) as two more outputs, the residuals its VJP reads
        # (opt.attention_pairing sets it; never part of the public constructor)
        self.stats = bool(stats) and _builtin and name == "online_softmax"
        # max/min/prod: the value of a row without edges (None: the default 0, or 1 for prod)
        self.empty = empty if _builtin and name in EMPTY_SETTABLE else None
        self.of = of if _builtin and name in ARG else None
        self.regions: tuple | None = None  # (lift, combine, finalize) ClosedPrograms once traced

    @property
    def arity(self) -> int:
        """Message parts consumed per output (online_softmax takes score and value; an
        arg-reducer the message and the id the tracer appends to it)."""
        return 2 if self.name in ("online_softmax",) + ARG and self.builtin else 1

    @property
    def is_arg(self) -> bool:
        """True for tg.argmin / tg.argmax (their result is an int64 id)."""
        return self.builtin and self.name in ARG

    def __call__(self, *parts) -> ReducerMessage:
        if self.is_arg and len(parts) == 1:   # the id part is the tracer's, not the user's
            return ReducerMessage(self, parts)
        if len(parts) != self.arity:
            raise TigaError(f"{self.name} reducer takes {self.arity} message part(s) "
                            f"({'score, value' if self.arity == 2 else 'message'}), "
                            f"got {len(parts)}")
        return ReducerMessage(self, parts)

    def _key(self):
        if self.builtin:
            # repr: an empty=nan reducer equals itself
            return ("builtin", self.name, self.prune_threshold, self.stats,
                    repr(self.empty), self.of)
        if self.regions is None:   # by value: the same functions (objects) and settings
            return ("untraced", self.name, repr(self.identity), self.commutative,
                    self.associative, self.lift, self.combine, self.finalize)
        return ("user", self.name, repr(self.identity), self.commutative, self.associative,
                tuple(r.structure_key() if r is not None else None for r in self.regions))

    def __eq__(self, other) -> bool:
        return isinstance(other, Reducer) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def pp_param(self) -> str:
        """How the program printer shows this reducer (`sum`, `max[empty=-inf]`, ...)."""
        if self.builtin and (self.prune_threshold is not None or self.stats
                             or self.empty is not None or self.of is not None):
            opts = (([f"prune_threshold={self.prune_threshold}"]
                     if self.prune_threshold is not None else []) +
                (["stats"] if self.stats else []) +
                ([f"empty={self.empty!r}"] if self.empty is not None else []) +
                ([f"of={self.of}"] if self.of is not None else []))
            return f"{self.name}({', '.join(opts)})"
        return self.name if self.builtin else f"user:{self.name}"

    def __repr__(self) -> str:
        return f"tg.Reducer({self.pp_param()})"

    def with_stats(self) -> Reducer:
        """This built-in online_softmax also returning its per-row (max, mass)."""
        if not (self.builtin and self.name == "online_softmax"):
            raise TigaError(f"with_stats: only the built-in online_softmax keeps row "
                            f"statistics, found {self.pp_param()}")
        return Reducer(self.name, self.identity, _builtin=True,
                       prune_threshold=self.prune_threshold, stats=True)

    def with_regions(self, regions: tuple) -> Reducer:
        """A copy holding its traced (lift, combine, finalize) regions (the tracer's)."""
        r = Reducer(self.name, self.identity, self.combine, self.finalize, self.lift,
                    self.commutative, self.associative)
        r.regions = regions
        return r


def _check_user_reducer(name: Any, identity: Any, fns: tuple, flags: tuple) -> None:
    """Fail at construction, naming the argument, rather than at the first call."""
    if not isinstance(name, str) or not name:
        raise TigaError(f"Reducer: name is {name!r}, expected a non-empty string")
    if fns[0] is None:
        raise TigaError(f"Reducer {name!r}: combine is required, e.g. "
                        "combine=lambda a, b: a + b")
    for arg, fn in zip(("combine", "finalize", "lift"), fns):
        if fn is not None and not callable(fn):
            raise TigaError(f"Reducer {name!r}: {arg} is {fn!r} ({type(fn).__name__}), "
                            f"expected a callable{'' if arg == 'combine' else ' or None'}, "
                            f"e.g. {arg}=lambda a{', b' if arg == 'combine' else ''}: ...")
    if (identity is None or callable(identity) or
            isinstance(identity, (str, bytes, complex, dict, set))):
        raise TigaError(f"Reducer {name!r}: identity is {identity!r}, expected a real number "
                        "(the state of an empty row, e.g. 0.0 for a sum)")
    for arg, flag in zip(("commutative", "associative"), flags):
        if not isinstance(flag, bool):
            raise TigaError(f"Reducer {name!r}: {arg} is {flag!r}, expected True or False")


def _builtin(name: str, identity: Any, prune_threshold=None, **opts) -> Reducer:
    return Reducer(name, identity, _builtin=True, prune_threshold=prune_threshold, **opts)


def _checked_empty(name: str, empty: Any) -> float | None:
    """`empty=` as a float (inf, -inf and nan allowed), or None for the default."""
    if empty is None:
        return None
    if (isinstance(empty, bool) or not isinstance(empty, (int, float)) and
            not (hasattr(empty, "dtype") and getattr(empty, "shape", None) == ())):
        raise TigaError(f"tg.{name}(empty=...): the value of a row without edges must be a "
                        f"real scalar (e.g. math.inf), found {empty!r} "
                        f"({type(empty).__name__})")
    return float(empty)


def sum() -> Reducer:  # noqa: A001 - public name from API.md
    """Sum of the messages per row (0 without edges). float16/bfloat16 messages add in
    float32 and the sum rounds once: within ulp(exact) + n * 2**-24 * sum|x| of it."""
    return _builtin("sum", 0.0)


def mean() -> Reducer:
    """Mean of the messages per row (0 without edges). float16/bfloat16 messages add in
    float32, divide, and round once: within ulp(exact) + n * 2**-24 * sum|x| / n of it."""
    return _builtin("mean", 0.0)


def max(empty: float | None = None) -> Reducer:  # noqa: A001
    """Largest message per row; a row without edges gives `empty` (default 0). Exact in
    every dtype; a NaN message makes its row NaN (as numpy's maximum)."""
    return _builtin("max", -math.inf, empty=_checked_empty("max", empty))


def min(empty: float | None = None) -> Reducer:  # noqa: A001
    """Smallest message per row; a row without edges gives `empty` (default 0). Exact in
    every dtype; a NaN message makes its row NaN (as numpy's minimum)."""
    return _builtin("min", math.inf, empty=_checked_empty("min", empty))


def prod(empty: float | None = None) -> Reducer:
    """Product of the messages per row; a row without edges gives `empty` (default 1).
    float16/bfloat16 messages multiply in float32 and round once (relative error within
    n * 2**-24 plus one ulp of the message dtype)."""
    return _builtin("prod", 1.0, empty=_checked_empty("prod", empty))


def _arg(name: str, of: Any) -> Reducer:
    if of not in ARG_OF:
        raise TigaError(f"tg.{name}(of=...): of must be \"src\" (the winning source id) or "
                        f"\"edge\" (the winning edge id, in the relation's edge order), "
                        f"found {of!r}")
    return _builtin(name, math.inf if name == "argmin" else -math.inf, of=of)


def argmin(of: str = "src") -> Reducer:
    """Per destination row (and per message entry) the id of the smallest message: its
    source id (`of="src"`) or edge id (`of="edge"`); ties go to the smaller id, a NaN
    message wins (as numpy's argmin), a row without edges gives -1. int64, not
    differentiable."""
    return _arg("argmin", of)


def argmax(of: str = "src") -> Reducer:
    """As `argmin`, for the largest message."""
    return _arg("argmax", of)


def online_softmax(prune_threshold: float | None = None) -> Reducer:
    """Streaming softmax-weighted sum of values; pruning is approximate and off by default.

    float16/bfloat16 scores and values run in float32 (running max, mass, accumulator) and
    the result rounds once. A row is NaN for a NaN or +inf score or when every score is
    -inf (as torch.softmax); a row without edges is 0."""
    if prune_threshold is not None and not (isinstance(prune_threshold, (int, float))
                                            and prune_threshold > 0
                                            and math.isfinite(prune_threshold)):
        raise TigaError(f"online_softmax: prune_threshold must be a positive finite number "
                        f"or None (disabled), found {prune_threshold!r}")
    return _builtin("online_softmax", 0.0, prune_threshold)
