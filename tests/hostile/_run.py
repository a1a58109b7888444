"""Run hostile-input cases in a subprocess, so a crash or a hang fails a test, never pytest.

A snippet defines cases with the `case` decorator and the `raises` / `same` helpers of
PRELUDE; each case records "ok" or why it failed, and the snippet prints the records as one
JSON line. The test then checks the exit status (a segfault is a negative status), the
timeout (a hang) and every record.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

MARK = "HOSTILE-RESULTS "
TIMEOUT_S = 60

PRELUDE = '''
import json, sys, traceback, warnings
import numpy as np
import tiga as tg

RESULTS = {}

def case(fn):
    """Run a case now; record "ok" or the reason it failed (never let one case stop the rest)."""
    try:
        fn()
        RESULTS[fn.__name__] = "ok"
    except AssertionError as exc:
        RESULTS[fn.__name__] = f"FAIL: {exc}"
    except BaseException as exc:
        RESULTS[fn.__name__] = (f"FAIL: unexpected {type(exc).__name__}: {exc}\\n"
                                + traceback.format_exc(limit=-4))
    return fn

def raises(cls, fn, *needles):
    """fn() raises exactly `cls` whose message contains every needle; returns the error."""
    try:
        fn()
    except BaseException as exc:
        if type(exc) is not cls:
            raise AssertionError(f"expected {cls.__name__}, got {type(exc).__name__}: {exc}")
        for n in needles:
            assert n in str(exc), f"message lacks {n!r}: {exc}"
        return exc
    raise AssertionError(f"expected {cls.__name__}, nothing was raised")

def same(got, want, rtol=1e-12, atol=0.0):
    """Exact shape and dtype, values equal (NaN equal to NaN) within rtol."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
'''

EPILOGUE = f'''
print({MARK!r} + json.dumps(RESULTS), flush=True)
'''


@dataclass
class Run:
    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    results: dict = field(default_factory=dict)

    def describe(self) -> str:
        status = "timed out (hang)" if self.timed_out else f"exit status {self.rc}"
        return f"{status}\n--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n" \
               f"{self.stderr[-3000:]}"


def run_snippet(code: str, *, env: dict | None = None, timeout: float = TIMEOUT_S,
                prelude: bool = True) -> Run:
    """Run `code` (with PRELUDE before it and the JSON record after) in a fresh interpreter."""
    body = textwrap.dedent(code)
    source = (PRELUDE + body + EPILOGUE) if prelude else body
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONFAULTHANDLER", "1")   # a crash prints where it happened
    try:
        proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as exc:
        return Run(None, _text(exc.stdout), _text(exc.stderr), timed_out=True)
    run = Run(proc.returncode, proc.stdout, proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            run.results = json.loads(line[len(MARK):])
    return run


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def check_cases(code: str, expected: set | None = None, **kwargs) -> Run:
    """Run the cases of `code`; fail (naming every failed case) unless the process exited
    normally within the timeout and every case recorded "ok"."""
    run = run_snippet(code, **kwargs)
    assert not run.timed_out and run.rc == 0, run.describe()
    failed = {k: v for k, v in run.results.items() if v != "ok"}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())
    assert run.results, "no case ran\n" + run.describe()
    if expected is not None:
        assert set(run.results) == set(expected), (sorted(run.results), sorted(expected))
    return run
