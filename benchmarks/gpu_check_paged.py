"""The GPU check's paged row (issue 28 item 3): a forward over a stored relation on the
device. The relation and its source field are written to a store, opened paged, and the
call runs under the Triton backend: its pages stream host -> device through the device tier
(cuda-python), double-buffered, under a "device" budget (or, without cuda-python, pages on
the host copied by torch; the row says which). Timed after a warm-up call, against the same
call on the relation held in memory (the row's "peer"); the result is checked against a
float64 numpy oracle. Prints one JSON line (the driver, gpu_check.py, reads the last one).

    python benchmarks/gpu_check_paged.py [--dry] [--rows N] [--repeat R]

--dry / GPU_CHECK_DRY=1: Triton's interpreter on CPU, tiny sizes (checks the plumbing).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

DRY = os.environ.get("GPU_CHECK_DRY") == "1" or "--dry" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tiga as tg  # noqa: E402

DEGREE, FEATURES, PAGES = (4, 4, 4) if DRY else (16, 32, 8)


class Gather(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x


def periodic(n: int) -> tuple:
    """Destination i reads i+1 .. i+DEGREE mod n (the paging benchmark's CSR)."""
    rp = np.arange(n + 1, dtype=np.int64) * DEGREE
    ci = ((np.arange(n)[:, None] + np.arange(1, DEGREE + 1)) % n).reshape(-1)
    return rp, ci.astype(np.int32)


def timed(fn, repeat: int) -> tuple:
    """(last result, mean milliseconds of `repeat` calls after one warm-up call)."""
    out = fn()
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return out, (time.perf_counter() - t0) * 1e3 / max(repeat, 1)


def run(n: int, repeat: int, where: str) -> dict:
    rp, ci = periodic(n)
    x = np.random.default_rng(0).standard_normal((n, FEATURES)).astype(np.float32)
    with tg.store.create(where, num_src=n, num_dst=n, overwrite=True) as w:
        w.append_csr_chunk(rp, ci)
        w.append_field("x", x, role="src")
    tg.config.backend = "triton-interpreter" if DRY else "triton"
    g, stored_x = tg.Graph.open(where), tg.store.open(where)["x"]
    page_rows = -(-n // PAGES)
    with tg.scope(page_rows=page_rows, budgets={"device": "1GB"}), tg.profile() as prof:
        got, ms = timed(lambda: np.asarray(Gather()(graph=g, src={"x": stored_x})), repeat)
    stats = prof.measured("paged")[-1]
    mem = tg.Graph.from_csr(rp, ci, num_src=n)
    _, mem_ms = timed(lambda: np.asarray(Gather()(graph=mem, src={"x": x})), repeat)
    want = x.astype(np.float64)[ci].reshape(n, DEGREE, FEATURES).sum(axis=1)
    tier = "device tier" if stats.bytes_device["to"] else "host pages"
    return {"event": "done", "ms": ms, "peer": "in-memory (same backend)", "peer_ms": mem_ms,
            "speedup": mem_ms / ms, "max_abs_diff": float(np.abs(got - want).max()),
            "scale": float(np.abs(want).max()), "pages": stats.pages, "route": stats.route,
            "tier": tier, "bytes_to_device": stats.bytes_device["to"],
            "bytes_from_device": stats.bytes_device["from"],
            "size": f"stored CSR n={n} deg={DEGREE} F={FEATURES}, {stats.pages} pages "
                    f"({tier})"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="= GPU_CHECK_DRY=1 (CPU, tiny sizes)")
    ap.add_argument("--rows", type=int, default=512 if DRY else 1 << 20)
    ap.add_argument("--repeat", type=int, default=1 if DRY else 3)
    args = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-paged-") as tmp:
            ev = run(args.rows, args.repeat, os.path.join(tmp, "s"))
    except Exception as exc:     # (the driver reports it in the row)
        ev = {"event": "error", "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(ev), flush=True)
    return 0 if ev["event"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
