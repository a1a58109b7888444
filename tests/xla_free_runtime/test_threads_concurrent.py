"""One layer called from 8 threads at once, 200 calls each, on different graphs, shapes and
dtypes: every result equals the one the same call gives single-threaded. The caches that
remain (call cache, task walks, compiled kernels, transposes) are keyed by value and must not
hand one call another's program, relation or buffers; run reports stay per thread."""
from __future__ import annotations

import threading

import numpy as np

import tiga as tg

THREADS, CALLS = 8, 200


class Layer(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge, scale):
        return tg.math.tanh(src.x) * edge.w * scale + dst.h


def _cases(seed=0) -> list:
    """Calls that differ in relation (size, kind), feature shape and dtype."""
    rng = np.random.default_rng(seed)
    cases = []
    for k in range(12):
        n, e, f = int(rng.integers(5, 60)), int(rng.integers(0, 300)), (1, 3, 8)[k % 3]
        dtype = (np.float64, np.float32)[k % 2]
        if k % 4 == 3:
            g = tg.Graph.dense(n)
            e = n * n
        else:
            g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n,
                                  num_dst=n)
        cases.append(dict(graph=g, src={"x": rng.standard_normal((n, f)).astype(dtype)},
                          dst={"h": rng.standard_normal((n, f)).astype(dtype)},
                          edge={"w": rng.standard_normal((e, 1)).astype(dtype)},
                          scale=float(k + 1)))
    return cases


def test_one_layer_from_eight_threads_matches_single_threaded():
    layer, cases = Layer(), _cases()
    want = [np.asarray(layer(**kw)) for kw in cases]
    for kw, w in zip(cases, want):       # the single-threaded results are the oracle's
        np.testing.assert_allclose(w, np.asarray(layer.reference(**kw)), rtol=1e-5, atol=1e-5)
    failures, start = [], threading.Barrier(THREADS)

    def worker(t):
        start.wait()
        order = np.random.default_rng(100 + t).integers(0, len(cases), CALLS)
        with tg.profile() as prof:
            for i in order:
                got = np.asarray(layer(**cases[i]))
                if got.dtype != want[i].dtype or not np.array_equal(got, want[i]):
                    failures.append((t, int(i)))
        if len(prof.calls) != CALLS:        # each thread's profile saw its own calls only
            failures.append((t, "profile", len(prof.calls)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert failures == [], failures[:10]


def test_gradients_from_threads_match_single_threaded():
    layer, cases = Layer(), _cases(seed=1)[:6]

    def grads(kw):
        def loss(x, w):
            return tg.math.sum(layer(graph=kw["graph"], src={"x": x}, dst=kw["dst"],
                                     edge={"w": w}, scale=kw["scale"]) ** 2)
        return [np.asarray(a) for a in tg.grad(loss, argnums=(0, 1))(kw["src"]["x"],
                                                                     kw["edge"]["w"])]

    want = [grads(kw) for kw in cases]
    failures = []

    def worker(t):
        for j in range(25):
            i = (t + j) % len(cases)
            for a, b in zip(grads(cases[i]), want[i]):
                if not np.array_equal(a, b):
                    failures.append((t, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert failures == [], failures[:10]
