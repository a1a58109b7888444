"""Distributed hex-mesh benchmark (issue 16): the report's 26-neighbour, 16-feature sum over
an L^3 mesh, as 1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread (overlapped
and communicate-then-compute), with halo bytes and the share of boundary rows.

    python benchmarks/distributed.py                  # L = 32, 64, 96 (minutes; a quiet machine)
    python benchmarks/distributed.py --sides 16 --repeats 3     # a smoke run

The driver launches each configuration as `mpiexec -n P python -m mpi4py this --worker`
(bounded by MPIEXEC_TIMEOUT); rank 0 prints one JSON line, which the driver tabulates. The
first call (compilation) is not timed; each timed call starts after a barrier.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def worker(side: int, repeats: int, overlap: bool, grad: bool) -> None:
    import tiga as tg
    from workloads.hex_mesh import FEATURES, mesh_csr

    comm = tg.distributed.init()
    row_ptr, col = mesh_csr(side)
    g = tg.Graph.from_csr(row_ptr, col, num_src=side ** 3)
    x = np.random.default_rng(0).standard_normal((side ** 3, FEATURES), dtype=np.float32)
    dg = tg.distributed.partition(g, method="rows")
    dg.overlap = overlap
    xl = dg.local(x)

    class Sum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x

    if grad:
        step = tg.grad(lambda x: (Sum()(graph=dg, src={"x": x}) ** 2).sum())
    else:
        def step(x):
            return Sum()(graph=dg, src={"x": x})
    first = np.asarray(step(xl))
    if not grad:   # correctness against the single-process call
        want = np.asarray(Sum()(graph=g, src={"x": x}))
        assert np.allclose(dg.gather(first), want, rtol=1e-4, atol=1e-4)
    times, waits = [], []
    for _ in range(repeats):
        comm.raw.Barrier()
        t0 = time.perf_counter()
        step(xl)
        times.append(time.perf_counter() - t0)
        waits.append(dg.last_call.get("wait_s", 0.0))
    worst = comm.allgather_array(np.array([np.median(times), np.median(waits)]), "bench")
    p = dg.plan
    if comm.rank == 0:
        print("RESULT " + json.dumps({
            "side": side, "ranks": comm.size, "threads": os.environ.get("TIGA_NUM_THREADS"),
            "overlap": overlap, "grad": grad, "seconds": float(worst[:, 0].max()),
            "wait_seconds": float(worst[:, 1].max()),
            "halo_bytes_in": int(p.n_ghost * FEATURES * 4),
            "boundary_share": (p.n_owned - p.n_interior) / max(p.n_owned, 1)}), flush=True)


def launch(side, ranks, threads, repeats, overlap, grad) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, TIGA_NUM_THREADS=str(threads), MPIEXEC_TIMEOUT="900")
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "mpi4py", __file__,
           "--worker", str(side), "--repeats", str(repeats)] + \
        (["--no-overlap"] if not overlap else []) + (["--grad"] if grad else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=960, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return json.loads(lines[0][len("RESULT "):])


CONFIGS = (("1 rank x 1 thread", 1, 1, True), ("1 rank x 2 threads", 1, 2, True),
           ("2 ranks x 1 thread, communicate-then-compute", 2, 1, False),
           ("2 ranks x 1 thread, overlapped", 2, 1, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", type=int, nargs="+", default=[32, 64, 96])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--grad", action="store_true", help="time a gradient step instead")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-overlap", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.repeats, not a.no_overlap, a.grad)
        return
    for side in a.sides:
        rows = [(name, launch(side, r, t, a.repeats, ov, a.grad)) for name, r, t, ov in CONFIGS]
        base = rows[0][1]["seconds"]
        print(f"L = {side} ({side ** 3} nodes){' gradient step' if a.grad else ''}")
        for name, res in rows:
            extra = "" if res["ranks"] == 1 else (
                f", halo {res['halo_bytes_in'] / 2**20:.2f} MiB in per rank, boundary rows "
                f"{100 * res['boundary_share']:.1f}%, blocked in wait "
                f"{res['wait_seconds'] * 1e3:.2f} ms")
            print(f"  {name:48s} {res['seconds'] * 1e3:9.2f} ms  x{base / res['seconds']:.2f}"
                  f"{extra}")


if __name__ == "__main__":
    main()
