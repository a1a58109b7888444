"""GPU benchmark (issue 17): stored-CSR weighted sum and dense attention on the Triton backend
against torch.sparse and SDPA on the same device, in the same run.

    python benchmarks/gpu.py [--nodes 131072] [--degree 16] [--features 32] [--repeat 20]

Without a CUDA device (or without triton/torch) it says so and exits 0. Tiga's timings here
include the host<->device copies of the current launcher (numpy in, numpy out); the report's
targets (stored CSR >= 1.5x torch.sparse, attention >= 0.8x SDPA) are for device-resident
inputs, which the device tier (not built yet) will provide.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _gpu_ready() -> str | None:
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install -e '.[gpu,torch]')"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def _time(fn, repeat: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat


def stored_csr(nodes: int, degree: int, features: int, repeat: int) -> None:
    import torch

    import tiga as tg

    rng = np.random.default_rng(0)
    cols = rng.integers(0, nodes, size=nodes * degree)
    row_ptr = np.arange(nodes + 1, dtype=np.int64) * degree
    g = tg.Graph.from_csr(row_ptr, cols, num_src=nodes)
    x = rng.normal(size=(nodes, features)).astype(np.float32)
    w = rng.uniform(size=nodes * degree).astype(np.float32)

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w

    layer = WeightedSum()
    tg.config.backend = "triton"
    t_tiga = _time(lambda: layer(graph=g, src={"x": x}, dst={}, edge={"w": w}), repeat)
    a = torch.sparse_csr_tensor(torch.from_numpy(row_ptr), torch.from_numpy(cols),
                                torch.from_numpy(w), size=(nodes, nodes)).cuda()
    xt = torch.from_numpy(x).cuda()
    t_torch = _time(lambda: a @ xt, repeat)
    print(f"stored CSR  n={nodes} deg={degree} F={features}: tiga/triton {t_tiga * 1e3:.3f} ms "
          f"(with copies), torch.sparse {t_torch * 1e3:.3f} ms, "
          f"speedup {t_torch / t_tiga:.2f}x")


def attention(seq: int, dim: int, repeat: int) -> None:
    import torch

    q = torch.randn(1, 1, seq, dim, device="cuda")
    t_sdpa = _time(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), repeat)
    print(f"attention   L={seq} D={dim}: SDPA {t_sdpa * 1e3:.3f} ms (Tiga's Triton attention "
          "kernel is not built yet)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=131072)
    ap.add_argument("--degree", type=int, default=16)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    why = _gpu_ready()
    if why is not None:
        print(f"benchmarks/gpu.py: skipped: {why}")
        return 0
    stored_csr(args.nodes, args.degree, args.features, args.repeat)
    attention(4096, 64, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
