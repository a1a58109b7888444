"""EdgeNN gradient on numpy inputs through tg.grad and tg.jit(tg.grad): the program run
after the exact execution rewrites (trace/rewrites `executable`) against the same program
run as traced, interleaved in one process (rounds alternate the order).

The module is benchmarks/edge_nn.py's (its torus workload, radius, hidden and output
widths): a hand-written MLP `W2 relu(W1 [p_j - p_i; x_j] + b1) + b2` with the parameters
as arguments, the radius relation generated from the differentiated positions, loss =
mean squared difference of the result to the positions. Reports per-call medians, the
speed-up and whether both give bit-identical gradients.

Usage: python benchmarks/edge_nn_native_grad.py [--width 8] [--rounds 12] [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import edge_nn as workload  # noqa: E402

import tiga as tg  # noqa: E402
from tiga import api  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    hidden, out, cutoff = workload.HIDDEN, workload.OUT, workload.RADIUS
    rng = np.random.default_rng(workload.SEED)
    pos = workload.torus_points()
    x = rng.standard_normal((len(pos), a.width)).astype(np.float32)
    w1 = (rng.standard_normal((3 + a.width, hidden)) / 3).astype(np.float32)
    w2 = (rng.standard_normal((hidden, out)) / 5).astype(np.float32)
    b1, b2 = np.zeros(hidden, np.float32), np.zeros(out, np.float32)

    def loss(p, x, w1, b1, w2, b2):
        g = tg.Graph.radius(p, cutoff=cutoff)

        def edge(s, d, e):
            h = tg.math.relu(tg.math.concatenate([e.displacement, s.x], axis=-1) @ w1 + b1)
            return h @ w2 + b2
        y = tg.propagate(g, edge, tg.sum(), src={"x": x})
        return tg.math.mean((y - p) * (y - p))

    args = (pos, x, w1, b1, w2, b2)
    rewritten = api.executable

    def use(on):   # the traced program as it was run before the rewrites applied here
        api.executable = rewritten if on else (lambda program, kinds: program)

    nums = tuple(range(6))
    peers = {}
    for on in (False, True):
        use(on)
        peers[("grad", on)] = tg.grad(loss, argnums=nums)
        peers[("jit(grad)", on)] = tg.jit(tg.grad(loss, argnums=nums))
        for name in ("grad", "jit(grad)"):
            peers[(name, on)](*args)   # compile / fill the kernel caches
    times, first = {}, {}
    for r in range(a.rounds):
        for key in (list(peers) if r % 2 == 0 else list(reversed(peers))):
            use(key[1])
            ts = times.setdefault(key, [])
            for _ in range(a.reps):
                t = time.perf_counter()
                res = peers[key](*args)
                ts.append(time.perf_counter() - t)
            first.setdefault(key, [np.asarray(g) for g in res])
    use(True)
    print(f"N={len(pos)} cutoff={cutoff} width={a.width} hidden={hidden} out={out}; "
          f"load {os.getloadavg()[0]:.2f}")
    for name in ("grad", "jit(grad)"):
        before, after = np.median(times[(name, False)]), np.median(times[(name, True)])
        same = all(np.array_equal(u, v) for u, v in zip(first[(name, False)],
                                                          first[(name, True)]))
        print(f"{name:10s} as traced {1e3 * before:8.2f} ms  rewritten {1e3 * after:8.2f} ms  "
              f"speed-up {before / after:.3f}x  bit-identical {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
