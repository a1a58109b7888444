"""Eager control flow and plain tg.grad against their tg.jit forms, same process, same data.

    python benchmarks/host_overhead/eager_vs_jit.py [--rounds 5]

Case (issue 25): 131,072 rows x 16 neighbours x 32 float32 features, mean, `tg.repeat(5, ...)`;
tg.grad of a sum over 4,096 rows x 8 neighbours x 16 features. Prints best-of-rounds seconds and
the ratios eager / jit; the targets are <= 1.2.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import tiga as tg


def _graph(n, deg, seed=0):
    rng = np.random.default_rng(seed)
    cols = rng.integers(0, n, size=n * deg)
    return tg.Graph.from_csr(np.arange(0, n * deg + 1, deg), cols, num_src=n)


class Mean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return src.x


def best(fn, rounds, inner):
    fn()                                    # warm: compile and cache
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    layer = Mean()

    g = _graph(131_072, 16)
    x = np.random.default_rng(1).standard_normal((131_072, 32)).astype(np.float32)

    def step(h):
        return layer(graph=g, src={"x": h})

    def eager():
        return tg.repeat(5, step, x)

    jitted = tg.jit(lambda h: tg.repeat(5, step, h))
    np.testing.assert_allclose(np.asarray(eager()), np.asarray(jitted(x)), rtol=1e-4, atol=1e-5)
    t_e, t_j = best(eager, args.rounds, 3), best(lambda: jitted(x), args.rounds, 3)
    print(f"repeat(5) eager {t_e * 1e3:8.2f} ms   jit {t_j * 1e3:8.2f} ms   "
          f"eager/jit {t_e / t_j:5.2f}")

    g2 = _graph(4_096, 8)
    x2 = np.random.default_rng(2).standard_normal((4_096, 16))

    def loss(h):
        return tg.math.sum(tg.propagate(g2, lambda s, d, e: s.h, tg.sum(), src={"h": h}))

    plain, jgrad = tg.grad(loss), tg.jit(tg.grad(loss))
    np.testing.assert_allclose(np.asarray(plain(x2)), np.asarray(jgrad(x2)), rtol=1e-10)
    t_g, t_jg = best(lambda: plain(x2), args.rounds, 200), best(lambda: jgrad(x2), args.rounds, 200)
    print(f"grad        plain {t_g * 1e3:8.3f} ms   jit {t_jg * 1e3:8.3f} ms   "
          f"plain/jit {t_g / t_jg:5.2f}")


if __name__ == "__main__":
    main()
