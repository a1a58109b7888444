"""Host overhead of a warm one-propagate call, with the kernel replaced by a stub.

    python benchmarks/host_overhead/warm_call.py [--calls 20000]

For cpu-llvm a backend whose launch does nothing is registered in place of cpu-llvm's (the
backend table, tiga.xla_free_runtime.backends: every kernel is launched through it); for
triton (its
interpreter backend, so it runs on this machine) the launched kernel is a no-op callable.
Everything else a warm call does runs as usual: call-cache lookup and guards, executor entry,
Task-IR walk, route lookup, operand checks, output allocation, result wrapping. What is
printed is microseconds per call with the stub, i.e. the host time a real kernel adds to,
as wall time and as this process's CPU time (time.process_time: on a shared host, the time
other processes hold the cores is not counted; with its kernel it also counts the kernel's
worker threads). Each is the best of 5 rounds. Issue 25's target: at most 15 us on both
backends.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402

import tiga as tg  # noqa: E402
from tiga.xla_free_runtime import backends  # noqa: E402
from tiga.xla_free_runtime.backends.triton import launch as triton_launch  # noqa: E402


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


class _NoopKernel:
    """A launched Triton kernel that does nothing: `kernel[grid](*args, **meta)`."""

    def __getitem__(self, grid):
        return _noop


def _noop(*args, **meta) -> None:
    return None


NOOP_KERNEL = _NoopKernel()   # (one object: building a class per launch timed the stub)


class _NoopLaunch:
    """cpu-llvm's backend with a launch that does nothing (render and compile delegate)."""

    def __init__(self, inner):
        self.inner, self.target = inner, inner.target
        self.render, self.compile = inner.render, inner.compile

    def launch(self, exe, op, args, stream=None) -> None:
        return None


def per_call_us(fn, calls: int, rounds: int = 5) -> tuple[float, float]:
    """(wall, process CPU) microseconds per call, each the best of `rounds`."""
    fn()
    wall = cpu = float("inf")
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        wall = min(wall, (time.perf_counter() - t0) / calls)
        cpu = min(cpu, (time.process_time() - c0) / calls)
    return wall * 1e6, cpu * 1e6


def _us(pair: tuple[float, float]) -> str:
    return f"{pair[0]:7.2f} us ({pair[1]:6.2f} us CPU)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n = 64
    g = tg.Graph.from_coo(rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n), num_src=n,
                          num_dst=n)
    kw = dict(graph=g, src={"x": rng.standard_normal((n, 8)).astype(np.float32)},
              edge={"w": rng.standard_normal((4 * n, 1)).astype(np.float32)})
    layer = WeightedSum()
    real = per_call_us(lambda: layer(**kw), args.calls // 4)
    saved = backends.BACKENDS["cpu-llvm"]
    backends.register(_NoopLaunch(saved))
    try:
        stub = per_call_us(lambda: layer(**kw), args.calls)
    finally:
        backends.register(saved)
    print(f"cpu-llvm  warm call {_us(real)} with its kernel, {_us(stub)} with a stub "
          "kernel (host overhead)")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        print("triton    not installed: skipped")
        return
    old = tg.config._backend    # (None: TIGA_BACKEND decides, and still does afterwards)
    tg.config.backend = "triton-interpreter"
    saved = triton_launch.TritonPlan.kernel
    try:
        layer(**kw)                                     # compile, warm the plan
        triton_launch.TritonPlan.kernel = lambda self, part="": NOOP_KERNEL
        stub = per_call_us(lambda: layer(**kw), args.calls)
    finally:
        triton_launch.TritonPlan.kernel = saved
        tg.config.backend = old
    print(f"triton    warm call {_us(stub)} with a stub launcher (host overhead)")


if __name__ == "__main__":
    main()
