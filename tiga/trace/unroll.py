"""trace: notice a Python loop that a trace unrolled (many identical propagates).

A Python `for` loop around a propagate inside `tg.jit` (or `tg.grad`, `tg.make_program`)
runs while tracing, so the program gets one propagate equation per iteration: tracing and
staging grow with the trip count. `tg.repeat` (or `tg.scan`, `tg.while_loop`) stages the
body once. The builder of each trace
counts its propagates by structure and warns once when one structure reaches
`UNROLL_THRESHOLD`.
"""
from __future__ import annotations

import os
import sys
import warnings

UNROLL_THRESHOLD = 8

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TraceWarning(UserWarning):
    """A trace recorded something that is probably not what you meant, and still works.

    Emitted when one trace (`tg.jit`, `tg.grad`, `tg.make_program`, ...) records 8 or more
    propagates of the same structure: the signature of a Python `for` loop unrolled while
    tracing. The program stays correct, but every iteration is traced and staged on its
    own, so the first call grows with the number of iterations (500 sweeps of a small
    PageRank: 0.57 s unrolled, 0.12 s as `tg.repeat`). Write the loop as
    `tg.repeat(n, body, init)` (a static count), `tg.scan(body, init, xs)` (each step also
    yields an output) or `tg.while_loop(cond, body, init, max_iterations)` (data-dependent);
    the loop body is then traced and compiled once.

    Silence it where the unrolling is deliberate:

        import warnings
        warnings.filterwarnings("ignore", category=tg.TraceWarning)
    """


def _structure(eqn) -> tuple | None:
    """A hashable key: equal for propagates that differ only in their operands' values."""
    p = eqn.params
    try:
        edge_fn = p["edge_fn"].structure_key()
        update = p.get("update")
        update = None if update is None else update.structure_key()
        reducer = p.get("reducer")
        reducer_key = (type(reducer).__name__, getattr(reducer, "name", None))
        types = tuple(str(getattr(a, "type", a)) for a in eqn.inputs)
        return (edge_fn, update, reducer_key, p.get("roles"), p.get("names"),
                p.get("reduce_by"), types)
    except Exception:   # an unusual propagate: never let the hint break a trace
        return None


def _user_stacklevel() -> int | None:
    """The stacklevel of the first frame outside the tiga package (the user's call), or
    None when a transformation of Tiga's (a VJP replaying the forward's equations) staged
    the propagate: a trace entered on the way up means the user did not write it."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            _PACKAGE_DIR + os.sep):
        if frame.f_code.co_name == "trace_flat" and frame.f_code.co_filename.endswith(
                os.path.join("trace", "staging.py")):
            return None
        frame, level = frame.f_back, level + 1
    return level


def note_propagate(builder, eqn) -> None:
    """Count `eqn` (a propagate just recorded by `builder`); warn once per builder."""
    if getattr(builder, "_unroll_warned", False):
        return
    key = _structure(eqn)
    if key is None:
        return
    counts = builder.__dict__.setdefault("_unroll_counts", {})
    counts[key] = counts.get(key, 0) + 1
    if counts[key] < UNROLL_THRESHOLD:
        return
    builder._unroll_warned = True
    level = _user_stacklevel()
    if level is None:
        return
    warnings.warn(
        f"this trace recorded {counts[key]} propagates of the same structure: a Python "
        "loop inside tg.jit (or tg.grad) is unrolled, one propagate per iteration, and "
        "each is traced and staged. Write the loop as tg.repeat(n, body, init) (tg.scan "
        "when each step also yields an output, tg.while_loop for a data-dependent count) so "
        "the body is traced and compiled once",
        TraceWarning, stacklevel=level)
