"""First-call latency: import, trace, lower, compile and run the stored-CSR weighted sum once
in a new process, with an empty disk cache (cold) or one a previous process filled (warm)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from . import Peer, Workload
from . import _common as C

DEGREE, FEATURES = 32, 32
MAX_PROBES = 5   # processes per configuration: each pays a whole import and compile
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = ("The stored-CSR weighted sum (degree 32, 32 features) called for the first time in a "
        "new Python process: `first ms` is the first forward call (trace + lower + LLVM "
        "compile or disk-cache load + run), `step first ms` the first `tg.grad` call after "
        "it, `import ms` the `import tiga`. Each repeat is its own process; `cold` gives "
        "each an empty TIGA_CACHE_DIR, `warm` one filled by an earlier process.")
PROBE = ("import sys; sys.path.insert(0, {dir!r}); "
         "from workloads.first_call import probe; probe({n})")


def probe(n: int) -> None:
    """Runs in its own process: one first-call measurement, checked, printed as JSON."""
    import measure as M

    t0 = time.perf_counter()
    import tiga as tg
    t_import = time.perf_counter() - t0
    d = C.random_csr(n, DEGREE, FEATURES)

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w

    g = tg.Graph.from_csr(d["row_ptr"], d["col"], num_src=n)
    m = WeightedSum()
    call = lambda x, w: m(graph=g, src={"x": x}, dst={}, edge={"w": w})
    grad = tg.grad(lambda x, w: call(x, w).sum(), argnums=(0, 1))
    res = {"import_ms": t_import * 1e3}
    outs = {}
    for key, fn in (("first", lambda: call(d["x"], d["w"])), ("second", None),
                    ("step_first", lambda: grad(d["x"], d["w"]))):
        fn = fn or (lambda: call(d["x"], d["w"]))
        t0 = time.perf_counter()
        outs[key] = fn()
        res[f"{key}_ms"] = (time.perf_counter() - t0) * 1e3
    errs = [M.check(outs["first"], C.csr_forward64(d), "float32")[1],
            M.check(outs["step_first"], C.csr_grads64(d), "float32", 2.0)[1]]
    res["rel_err"] = max(errs)
    res["ok"] = errs[0] <= M.DEFAULT_TOL["float32"] and errs[1] <= 2 * M.DEFAULT_TOL["float32"]
    res["vmhwm_bytes"] = (M.status_kib("VmHWM") or 0) * 1024
    print(json.dumps(res))


def _probe_once(n: int, cache: str, timeout: float) -> dict:
    env = {**os.environ, "TIGA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", PROBE.format(dir=BENCH_DIR, n=n)], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def runner(spec: dict) -> dict:
    """The worker's entry for this workload: `repeat` probe processes (1 to MAX_PROBES)."""
    import shutil

    warm = spec["workload"].endswith(".warm")
    reps, probes = max(1, min(spec["repeat"], MAX_PROBES)), []
    root = tempfile.mkdtemp(prefix="tiga-firstcall-")
    try:
        if warm:
            _probe_once(spec["size"], os.path.join(root, "shared"), 300)   # fills the cache
        for r in range(reps):
            cache = os.path.join(root, "shared" if warm else f"cold{r}")
            probes.append(_probe_once(spec["size"], cache, 300))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not all(p["ok"] for p in probes):
        return {"status": "wrong", "reason": f"first call off the float64 oracle by "
                                             f"{max(p['rel_err'] for p in probes):.3g}"}
    times = [p["first_ms"] for p in probes]
    med = lambda key: statistics.median(p[key] for p in probes)
    return {"status": "ok", "median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "reps": reps, "warmup": 0, "times_ms": times,
            "rel_err": max(p["rel_err"] for p in probes), "dtype": "float32",
            "second_call_ms": med("second_ms"), "step_first_ms": med("step_first_ms"),
            "import_ms": med("import_ms"), "first_call_ms": times[0],
            "peak_bytes": max(p["vmhwm_bytes"] for p in probes),
            "peak_method": "whole-process VmHWM of the probe process",
            "loadavg_1min": os.getloadavg()[0]}


def _none(d, threads):
    return None


_PEERS = {"tiga": Peer(_none, tiga=True, note="new process per repeat")}
WORKLOADS = [
    Workload(f"first_call.{mode}", f"Tiga first call, {mode} disk cache", TEXT, (8192,),
             lambda n: None, lambda d, i: [], _PEERS, runner=runner)
    for mode in ("cold", "warm")
]
