"""Hostile cache directories and environment variables (issue 13): special files where a
cache entry should be, damaged entries, absurd TIGA_NUM_THREADS values. Subprocesses only,
so a hang (a FIFO read) or a crash fails the test."""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile

import numpy as np
import pytest

from ._run import check_cases, run_snippet

# five programs with distinct kernels (one per reducer), each run and its entries listed
PROGRAMS = '''
import os, json
from pathlib import Path
g = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 1, 1]), num_src=2)
x = np.array([2.0, -3.0])
root = Path(os.environ["TIGA_CACHE_DIR"])
seen, report = set(), {}
for name in ("sum", "max", "min", "mean", "prod"):
    y = tg.propagate(g, lambda s, d, e: s.x * 1.5, getattr(tg, name)(), src={"x": x})
    now = {str(p) for p in root.rglob("*.tga")}
    report[name] = {"y": np.asarray(y).tolist(), "entries": sorted(now - seen)}
    seen |= now
from tiga.xla_free_runtime.caches.executables import CACHE
report["stats"] = CACHE.stats.as_dict()
print("REPORT " + json.dumps(report), flush=True)
'''

# the oracle: messages 1.5 * x[src] per row, reduced by numpy; empty rows 0 (prod: 1)
_ROWS = [[3.0, -4.5], [-4.5], []]
WANT = {name: [float(fn(r)) if r else (1.0 if name == "prod" else 0.0) for r in _ROWS]
        for name, fn in (("sum", np.sum), ("max", np.max), ("min", np.min),
                         ("mean", np.mean), ("prod", np.prod))}


def _report(run) -> dict:
    assert not run.timed_out and run.rc == 0, run.describe()
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("REPORT ")]
    assert line, run.describe()
    return json.loads(line[-1][len("REPORT "):])


def _replace_with(path: str, kind: str) -> None:
    os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "socket":
        # bound at a short path (AF_UNIX paths are limited to ~108 bytes), then moved; the
        # socket file stays behind with no listener
        short = os.path.join(tempfile.mkdtemp(prefix="tg", dir=os.path.dirname(path)), "s")
        if len(short) > 100:
            short = os.path.join(tempfile.mkdtemp(prefix="tg"), "s")
        s = socket.socket(socket.AF_UNIX)
        s.bind(short)
        s.close()
        shutil.move(short, path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "garbage":
        with open(path, "wb") as f:
            f.write(b"TIGASO01" * 3 + os.urandom(64) + b"TIGASO01")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX special files")
def test_special_files_in_the_cache_neither_hang_nor_crash(tmp_path):
    env = {"TIGA_CACHE_DIR": str(tmp_path / "cache")}
    first = _report(run_snippet(PROGRAMS, env=env))
    for name, want in WANT.items():
        assert first[name]["y"] == want, (name, first[name])
        assert first[name]["entries"], f"{name}: no cache entry was written"
    kinds = dict(zip(WANT, ("fifo", "directory", "socket", "device", "garbage")))
    for name, kind in kinds.items():
        for path in first[name]["entries"]:
            _replace_with(path, kind)
    second = _report(run_snippet(PROGRAMS, env=env, timeout=60))
    for name, want in WANT.items():
        assert second[name]["y"] == want, (name, kinds[name], second[name])
    # every replaced entry was found and refused; none was handed to the loader
    assert second["stats"]["disk_hits"] == 0, second["stats"]
    assert second["stats"]["corrupt_discarded"] >= len(kinds), second["stats"]


def test_cache_dir_that_is_not_a_directory(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plain = tmp_path / "file"
    plain.write_bytes(b"not a directory")
    for where in (fifo, plain, tmp_path / "missing" / "deeper"):
        report = _report(run_snippet(PROGRAMS, env={"TIGA_CACHE_DIR": str(where)}))
        for name, want in WANT.items():
            assert report[name]["y"] == want, (where, name, report[name])


THREAD_COUNT_VALUES = '''
import os
n = 20000
rng = np.random.default_rng(0)
rp = np.arange(n + 1) * 2
ci = rng.integers(0, n, 2 * n)
g = tg.Graph.from_csr(rp, ci, num_src=n)
x = rng.standard_normal(n)
want = np.add.reduceat(x[ci], rp[:-1])
call = lambda: tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x})
cap = 4 * (os.cpu_count() or 1)

def with_threads(value):
    os.environ["TIGA_NUM_THREADS"] = value
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = call()
    return y, [str(w.message) for w in seen]

@case
def started_with_a_bad_value():
    # the process was started with TIGA_NUM_THREADS=lots: import worked, the call names it
    raises(tg.TigaError, call, "TIGA_NUM_THREADS must be a positive integer, found 'lots'")

@case
def invalid_values_name_the_variable():
    for bad in ("0", "-3", "1.5", "2e3", "\\u0663", "4 threads"):
        os.environ["TIGA_NUM_THREADS"] = bad
        raises(tg.TigaError, call, "TIGA_NUM_THREADS must be a positive integer",
               f"found {bad!r}")

@case
def padded_value_is_read():
    y, warned = with_threads(" 2 ")
    same(y, want, rtol=1e-12, atol=1e-12)
    assert not warned, warned

@case
def too_many_threads_are_capped_with_a_warning():
    for value in ("1000", "9" * 5000):
        y, warned = with_threads(value)
        same(y, want, rtol=1e-12, atol=1e-12)
        assert any("TIGA_NUM_THREADS=" in w and f"using {cap} threads" in w for w in warned), \\
            warned
        threads = len(os.listdir("/proc/self/task"))
        assert threads <= cap + 8, f"{threads} threads alive for a cap of {cap}"

@case
def kernel_schedule_agrees_with_the_cap():
    os.environ["TIGA_NUM_THREADS"] = "1000"
    text = tg.jit(lambda v: tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                                         src={"x": v})).lower(x).ir("kernel")
    assert "threads = 1000" not in text and "threads=1000" not in text
'''


def test_thread_count_values():
    check_cases(THREAD_COUNT_VALUES, env={"TIGA_NUM_THREADS": "lots"})
