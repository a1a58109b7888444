"""First-call latency of Tiga in fresh processes (issue 43, item 3), the median of 5 each:

- `import tiga`;
- the first propagate (stored-CSR weighted sum, 32,768 rows, 16 neighbours, 32 features),
  cold (a fresh, empty TIGA_CACHE_DIR) and warm (a second process on a directory an earlier
  process filled);
- the first `tg.grad` of it (after the first propagate), cold and warm;
- a Python loop of 50 PageRank-style propagates over one 20,000-row relation under `tg.jit`
  (unrolled into one program), cold, against `tg.repeat(50, ...)` of the same sweep.

    .venv/bin/python benchmarks/first_call.py            # 5 processes per figure
    .venv/bin/python benchmarks/first_call.py --quick    # 3 processes per figure

Each figure is printed with its target; run it alone on the machine (flock the bench lock).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROWS, DEGREE, FEATURES = 32_768, 16, 32
LOOP_ROWS, LOOP_DEGREE, LOOP_STEPS = 20_000, 8, 50

# (figure, key in the probe's JSON, target ms)
TARGETS = [
    ("import tiga", "import_ms", 200.0),
    ("first propagate, cold", "cold.first_ms", 100.0),
    ("first propagate, warm", "warm.first_ms", 5.0),
    ("first tg.grad, cold", "cold.grad_ms", 150.0),
    ("first tg.grad, warm", "warm.grad_ms", 30.0),
    ("50-step Python loop under tg.jit, cold", "loop.unrolled_ms", 300.0),
    ("tg.repeat(50, ...), cold (reference)", "loop.repeat_ms", None),
]

PROBE_PROPAGATE = r"""
import json, time
t0 = time.perf_counter()
import tiga as tg
t_import = time.perf_counter() - t0
import numpy as np
n, k, f = {rows}, {degree}, {features}
rng = np.random.default_rng(0)
col = rng.integers(0, n, size=n * k).astype(np.int64)
row_ptr = np.arange(0, n * k + 1, k, dtype=np.int64)
x = rng.standard_normal((n, f), dtype=np.float32)
w = rng.standard_normal(n * k, dtype=np.float32)

class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w

g = tg.Graph.from_csr(row_ptr, col, num_src=n)
m = WeightedSum()
call = lambda x, w: m(graph=g, src={{"x": x}}, dst={{}}, edge={{"w": w}})
grad = tg.grad(lambda x, w: call(x, w).sum(), argnums=(0, 1))
t0 = time.perf_counter(); y = call(x, w); np.asarray(y); t_first = time.perf_counter() - t0
t0 = time.perf_counter(); gx, gw = grad(x, w); np.asarray(gx); t_grad = time.perf_counter() - t0
want = np.zeros((n, f), np.float64)
np.add.at(want, np.repeat(np.arange(n), k), x[col].astype(np.float64) * w[:, None])
err = float(np.abs(np.asarray(y, np.float64) - want).max() / np.abs(want).max())
print(json.dumps({{"import_ms": t_import * 1e3, "first_ms": t_first * 1e3,
                  "grad_ms": t_grad * 1e3, "rel_err": err}}))
"""

PROBE_LOOP = r"""
import json, time
import tiga as tg
import numpy as np
n, k, steps = {rows}, {degree}, {steps}
rng = np.random.default_rng(0)
g = tg.Graph.from_csr(np.arange(0, n * k + 1, k, dtype=np.int64),
                      rng.integers(0, n, size=n * k).astype(np.int64), num_src=n)

class Spread(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.r

spread = Spread()
sweep = lambda r: 0.15 / n + 0.85 / k * spread(graph=g, src={{"r": r}})

@tg.jit
def unrolled(r):
    for _ in range(steps):
        r = sweep(r)
    return r

@tg.jit
def repeated(r):
    return tg.repeat(steps, sweep, r)

import warnings
warnings.simplefilter("ignore")    # the unrolled loop's TraceWarning is expected here
r0 = np.full(n, 1.0 / n, np.float32)
fn = unrolled if "{which}" == "unrolled" else repeated
t0 = time.perf_counter(); out = np.asarray(fn(r0)); t = time.perf_counter() - t0
print(json.dumps({{"{which}_ms": t * 1e3, "sum": float(out.sum())}}))
"""


def _env(cache: str, pycache: str) -> dict:
    """The probe's environment: its own TIGA_CACHE_DIR, and Python's bytecode cache on (an
    installed package has its .pyc files; PYTHONDONTWRITEBYTECODE would make every import
    compile Tiga's sources, ~0.35 s), kept outside the source tree."""
    env = {**os.environ, "TIGA_CACHE_DIR": cache, "PYTHONPYCACHEPREFIX": pycache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(code: str, cache: str, pycache: str) -> dict:
    env = _env(cache, pycache)
    # (run outside the source tree: `python -c` puts the working directory first on
    # sys.path, which would shadow a PYTHONPATH export of another commit)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600, cwd=os.path.dirname(cache))
    if out.returncode != 0:
        raise RuntimeError(f"probe failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(reps: int) -> dict:
    """{figure key: [ms per fresh process]}"""
    prop = PROBE_PROPAGATE.format(rows=ROWS, degree=DEGREE, features=FEATURES)
    got: dict = {}
    root = tempfile.mkdtemp(prefix="tiga-firstcall-")
    pyc = os.path.join(root, "pycache")
    try:
        # one untimed process writes the bytecode cache (what installing the package does;
        # with PYTHONPYCACHEPREFIX set, Python reads no __pycache__ folder, numpy's included)
        _run(prop, os.path.join(root, "warmup"), pyc)
        for which in ("unrolled", "repeat"):
            code = PROBE_LOOP.format(rows=LOOP_ROWS, degree=LOOP_DEGREE, steps=LOOP_STEPS,
                                     which=which)
            _run(code, os.path.join(root, f"warmup-{which}"), pyc)
        for r in range(reps):
            cold = _run(prop, os.path.join(root, f"cold{r}"), pyc)  # an empty cache
            warm = _run(prop, os.path.join(root, f"cold{r}"), pyc)  # the one it filled
            for mode, res in (("cold", cold), ("warm", warm)):
                assert res["rel_err"] < 1e-4, res
                for key in ("first_ms", "grad_ms"):
                    got.setdefault(f"{mode}.{key}", []).append(res[key])
            got.setdefault("import_ms", []).extend([cold["import_ms"], warm["import_ms"]])
            for which in ("unrolled", "repeat"):
                code = PROBE_LOOP.format(rows=LOOP_ROWS, degree=LOOP_DEGREE,
                                         steps=LOOP_STEPS, which=which)
                res = _run(code, os.path.join(root, f"loop-{which}{r}"), pyc)
                got.setdefault(f"loop.{which}_ms", []).append(res[f"{which}_ms"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 processes per figure, not 5")
    ap.add_argument("--json", help="also write the raw times (ms) here")
    args = ap.parse_args(argv)
    reps = 3 if args.quick else 5
    load = os.getloadavg()[0]
    got = measure(reps)
    print(f"First call, median of {reps} fresh processes "
          f"(propagate: {ROWS:,} rows x {DEGREE} neighbours x {FEATURES} features; "
          f"loop: {LOOP_STEPS} sweeps over {LOOP_ROWS:,} rows)")
    print("| figure | median ms | min-max ms | target ms | met |")
    print("|---|---:|---:|---:|:-:|")
    failed = 0
    for label, key, target in TARGETS:
        ts = got[key]
        med = statistics.median(ts)
        ok = "" if target is None else ("yes" if med <= target else "no")
        failed += ok == "no"
        print(f"| {label} | {med:.1f} | {min(ts):.1f}-{max(ts):.1f} | "
              f"{'' if target is None else f'{target:.0f}'} | {ok} |")
    print(f"load average (1 min): {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
