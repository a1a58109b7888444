"""Run by test_launch.py under mpiexec: rank 1 fails, rank 0 must not hang.

argv[1] == "silent": rank 1 never joins the exchange (it sleeps past the timeout); rank 0
must raise tg.DistributedError within TIGA_DIST_TIMEOUT and, uncaught under
`python -m mpi4py`, end the job with a non-zero status.
argv[1] == "raise": rank 1 raises before the call; `python -m mpi4py` aborts the job.
"""
import sys
import time

import numpy as np

import tiga as tg


class Sum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x


def main(mode: str) -> None:
    comm = tg.distributed.init()
    n = 16
    g = tg.Graph.from_csr(np.arange(n + 1), (np.arange(n) + 1) % n, num_src=n)   # a ring
    dg = tg.distributed.partition(g, method="rows")
    x = dg.local(np.arange(n, dtype=np.float64)[:, None])
    Sum()(graph=dg, src={"x": x})          # both ranks agree once
    if comm.rank == 1:
        if mode == "raise":
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(float(sys.argv[2]))
        return
    t0 = time.monotonic()
    try:
        Sum()(graph=dg, src={"x": x + 1.0})
    except tg.DistributedError as exc:
        print(f"rank 0 DistributedError after {time.monotonic() - t0:.1f} s: {exc}",
              flush=True)
        raise
    print("rank 0: no error (unexpected)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
