"""benchmarks worker: runs ONE configuration (workload, size, peer) in this fresh process and
prints one `@@BENCH-RESULT <json>` line. Started by run.py as
`python benchmarks/worker.py '<json spec>'`; never imported by the test suite.

Order inside the process: build the inputs, the float64 oracle and the peer (untimed); first
call (timed apart: JIT compiles, caches) and its check; warm-ups; timed calls. Every output is
checked outside the timer; a peer that fails a check is reported "wrong" and not timed further.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure as M  # noqa: E402
import workloads as W  # noqa: E402

RESULT_TAG = "@@BENCH-RESULT "


class WrongResult(Exception):
    """A peer's output missed the float64 oracle: the configuration is reported 'wrong'."""


def aligned(data):
    """Every numpy array of the inputs moved to a 64-byte (cache-line) aligned buffer.

    numpy aligns large arrays to 16 bytes only, at an offset that changes from process to
    process; a kernel reading a misaligned field may stage a copy first, so a same-run
    comparison would otherwise measure allocator luck (up to 1.5x on stored CSR, N = 32768).
    Every peer gets the same aligned inputs."""
    import numpy as np

    if isinstance(data, dict):
        return {k: aligned(v) for k, v in data.items()}
    if type(data) in (list, tuple):
        return type(data)(aligned(v) for v in data)
    if type(data) is not np.ndarray or data.nbytes == 0:
        return data
    raw = np.empty(data.nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + data.nbytes].view(data.dtype).reshape(data.shape)
    out[...] = data
    return out


def run(spec: dict) -> dict:
    wl = W.registry()[spec["workload"]]
    if wl.runner is not None:
        return wl.runner(spec)
    peer = wl.peers[spec["peer"]]
    data = aligned(wl.setup(spec["size"]))
    expected: dict = {}
    n_inputs = wl.extra.get("distinct_calls", 1)   # dynamic workloads alternate inputs

    def oracle(i: int) -> list:
        key = i % n_inputs
        if key not in expected:
            expected[key] = wl.expected(data, key)
        return expected[key]

    for key in range(n_inputs):   # before any memory figure is taken
        oracle(key)
    fn = peer.factory(data, spec["threads"])
    if fn is None:
        return {"status": "n/a", "reason": f"{spec['peer']} has no path for this workload"}
    worst = [0.0]

    def verify(out, i: int) -> None:
        ok, err = M.check(out, oracle(i), wl.dtype, wl.tol_scale)
        worst[0] = max(worst[0], err)
        if not ok:
            raise WrongResult(f"call {i}: relative error {err:.3g} against the float64 "
                              f"oracle, over the {wl.dtype} tolerance "
                              f"{M.DEFAULT_TOL[wl.dtype] * wl.tol_scale:.3g}")

    mem = M.PeakMemory()
    mem.start()
    t0 = time.perf_counter()
    first = fn(0)
    first_ms = (time.perf_counter() - t0) * 1e3
    first_peak = mem.stop()
    verify(first, 0)
    del first
    mem.start()
    timing = M.timed_calls(fn, verify, spec["warmup"], spec["repeat"], spec["budget_s"])
    peak = mem.stop()
    return {**timing, "status": "ok", "rel_err": worst[0], "dtype": wl.dtype,
            "first_call_ms": first_ms, "peak_first_call_bytes": first_peak,
            "peak_bytes": peak, "peak_method": mem.method,
            "process_vmhwm_bytes": (M.status_kib("VmHWM") or 0) * 1024,
            "loadavg_1min": os.getloadavg()[0], **_tiga_origin(spec)}


def _tiga_origin(spec: dict) -> dict:
    """Which tiga the process imported (proves --compare measured the intended trees)."""
    mod = sys.modules.get("tiga")
    return {"tiga_file": getattr(mod, "__file__", None)} if mod is not None else {}


def main(argv: list) -> int:
    spec = json.loads(argv[1])
    try:
        res = run(spec)
    except WrongResult as e:
        res = {"status": "wrong", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - any failure of a peer is a result, not a crash
        res = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:500],
               "traceback": traceback.format_exc()[-3000:]}
    sys.stdout.write(RESULT_TAG + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
