"""GPU workloads (issue 29): each one's Tiga call and the best peer installed on the device,
run one side at a time by a worker process that benchmarks/gpu_check.py drives (so that a
peer that stalls is killed without losing the rest of the run).

Workloads (sizes for a lent GPU; GPU_CHECK_DRY=1 / --dry: tiny sizes on CPU through
triton-interpreter, to check the plumbing where no GPU is lent):

    csr-32k, csr-131k, csr-1m   stored CSR weighted sum, degree 16, 32 float32 features,
                                int32 indices; peer: torch.sparse CSR @ x
    hex-mesh                    26-neighbour sum over a 64^3 lattice (implicit stencil), 16
                                features; peer: depthwise torch conv3d (ones, centre 0)
    radius, knn                 131,072 points in the unit cube, ~16 neighbours (radius) /
                                k = 16, neighbour sum of 32 features, relation built per call;
                                peer: PyG's torch_cluster radius_graph / knn_graph + index_add,
                                else a blocked torch.cdist (+ topk)
    edgenn-step                 EdgeConv's message relu([x_i, x_j - x_i] @ W) summed, forward
                                + backward (x, W); peer: PyG EdgeConv, else torch eager
    attention-{fwd,step}-{fp16,fp32}  dense attention L=4096, 4 heads of 64 (step: forward +
                                backward); peer: torch SDPA

    python benchmarks/gpu.py --worker       # JSON commands on stdin, events on stdout
    python benchmarks/gpu.py                # = python benchmarks/gpu_check.py (the check)

A worker command {"workload", "side": "tiga" | "peer", "warmup", "repeat", "save",
"compare"} answers {"event": "ready"} once its data is on the device, {"event": "warm"}
after the warm-up calls, then {"event": "done", "ms": per call (CUDA events around the
repeat calls; perf_counter on CPU), "peer": the peer's name, "max_abs_diff", "scale"}
(the peer compares its result with the one the Tiga side saved), or {"event": "error"}.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

DRY = os.environ.get("GPU_CHECK_DRY") == "1" or "--dry" in sys.argv
FULL = {"csr-32k": 32768, "csr-131k": 131072, "csr-1m": 1 << 20, "hex-mesh": 64,
        "radius": 131072, "knn": 131072, "edgenn-step": 131072, "attention": 4096}
TINY = {"csr-32k": 40, "csr-131k": 72, "csr-1m": 136, "hex-mesh": 4, "radius": 60,
        "knn": 60, "edgenn-step": 48, "attention": 24}
SIZE = TINY if DRY else FULL
DEGREE, FEATURES, K, HEADS, DIM = 16, 32, 16, 4, 64
if DRY:
    FEATURES, HEADS, DIM = 8, 2, 16
NAMES = ["csr-32k", "csr-131k", "csr-1m", "hex-mesh", "radius", "knn", "edgenn-step",
         "attention-fwd-fp16", "attention-fwd-fp32", "attention-step-fp16",
         "attention-step-fp32"]


def device() -> str:
    return "cpu" if DRY else "cuda"


def _torch():
    import torch
    return torch


def _gen(seed: int):
    return _torch().Generator().manual_seed(seed)


def _randn(*shape, seed: int, dtype=None):
    t = _torch()
    return t.randn(*shape, generator=_gen(seed), dtype=dtype or t.float32).to(device())


# ---- workloads: setup(name) -> (tiga call, [(peer name, peer call or None if absent)]) --

def _csr(n: int, seed: int = 0):
    """int32 indices, as a relation of fewer than 2^31 edges can be stored (Tiga reads its
    column ids in their stored width; torch.sparse takes int32 CSR indices too)."""
    t = _torch()
    cols = t.randint(0, n, (n * DEGREE,), generator=_gen(seed), dtype=t.int32).to(device())
    row_ptr = t.arange(n + 1, dtype=t.int32, device=device()) * DEGREE
    return row_ptr, cols


def stored_csr(n: int):
    import tiga as tg

    t = _torch()
    row_ptr, cols = _csr(n)
    g = tg.Graph.from_csr(row_ptr, cols, num_src=n)
    x, w = _randn(n, FEATURES, seed=1), t.rand(n * DEGREE, generator=_gen(2)).to(device())
    layer = _layers()["weighted"]
    a = t.sparse_csr_tensor(row_ptr, cols, w, size=(n, n))
    return (lambda: layer(graph=g, src={"x": x}, dst={}, edge={"w": w}),
            [("torch.sparse", lambda: a @ x)])


def hex_mesh(side: int):
    import itertools

    import tiga as tg

    t = _torch()
    offsets = tuple(o for o in itertools.product((-1, 0, 1), repeat=3) if o != (0, 0, 0))
    g = tg.Graph.stencil((side, side, side), offsets)
    x = _randn(side ** 3, 16, seed=3)
    layer = _layers()["sum"]
    k = t.ones(16, 1, 3, 3, 3, device=device())
    k[:, :, 1, 1, 1] = 0
    xc = x.reshape(side, side, side, 16).permute(3, 0, 1, 2)[None].contiguous()

    def conv():
        y = t.nn.functional.conv3d(xc, k, padding=1, groups=16)
        return y[0].permute(1, 2, 3, 0).reshape(side ** 3, 16)
    return (lambda: layer(graph=g, src={"x": x}, dst={}, edge={}), [("torch conv3d", conv)])


def _cluster():
    try:
        import torch_cluster
        return torch_cluster
    except ImportError:
        return None


def _blocked(n: int, fn, step: int = 4096):
    return _torch().cat([fn(slice(i, min(n, i + step))) for i in range(0, n, step)])


def radius(n: int):
    import tiga as tg

    t = _torch()
    pos, x = _randn(n, 3, seed=4).sigmoid(), _randn(n, FEATURES, seed=5)
    cutoff = float((12.0 / (np.pi * n)) ** (1.0 / 3.0))   # about 16 neighbours a point
    layer, tc = _layers()["sum"], _cluster()

    def pyg():
        ei = tc.radius_graph(pos, cutoff, max_num_neighbors=n, loop=False)
        return t.zeros_like(x).index_add_(0, ei[1], x[ei[0]])

    def cdist():
        def block(b):
            m = (t.cdist(pos[b], pos) <= cutoff).to(x.dtype)
            m[t.arange(m.shape[0]), t.arange(b.start, b.stop)] = 0.0
            return m @ x
        return _blocked(n, block)
    return (lambda: layer(graph=tg.Graph.radius(pos, cutoff), src={"x": x}, dst={}, edge={}),
            [("PyG radius_graph", pyg if tc else None), ("torch.cdist", cdist)])


def knn(n: int):
    import tiga as tg

    t = _torch()
    pos, x = _randn(n, 3, seed=6).sigmoid(), _randn(n, FEATURES, seed=7)
    layer, tc = _layers()["sum"], _cluster()

    def pyg():
        ei = tc.knn_graph(pos, K, loop=False)
        return t.zeros_like(x).index_add_(0, ei[1], x[ei[0]])

    def cdist():
        def block(b):
            d = t.cdist(pos[b], pos)
            d[t.arange(d.shape[0]), t.arange(b.start, b.stop)] = float("inf")
            return x[d.topk(K, largest=False).indices].sum(1)
        return _blocked(n, block)
    return (lambda: layer(graph=tg.Graph.knn(pos, K), src={"x": x}, dst={}, edge={}),
            [("PyG knn_graph", pyg if tc else None), ("torch.cdist + topk", cdist)])


def edgenn_step(n: int):
    """EdgeConv's message, so PyG's EdgeConv (Linear without bias, ReLU) is the same sum."""
    import tiga as tg

    t = _torch()
    row_ptr, cols = _csr(n, seed=8)
    g = tg.Graph.from_csr(row_ptr, cols, num_src=n)
    x = _randn(n, FEATURES, seed=9).requires_grad_()
    w1 = (_randn(2 * FEATURES, FEATURES, seed=10) / (2 * FEATURES) ** 0.5).requires_grad_()
    rows = t.arange(n, device=device()).repeat_interleave(DEGREE)
    layer = _layers()["edgenn"]

    def step(fwd):
        def run():
            y = fwd()
            return t.autograd.grad(y, (x, w1), t.ones_like(y))[0]
        return run

    def eager():
        h = t.relu(t.cat([x[rows], x[cols] - x[rows]], -1) @ w1)
        return t.zeros_like(x).index_add(0, rows, h)
    return (step(lambda: layer(graph=g, src={"x": x}, dst={"x": x}, edge={}, w1=w1)),
            [("PyG EdgeConv", _pyg_edge_conv(x, w1, cols, rows)), ("torch eager", step(eager))])


def _pyg_edge_conv(x, w1, cols, rows):
    """PyG's EdgeConv step with W in its Linear (None where PyG is not installed)."""
    t = _torch()
    try:
        from torch_geometric.nn import EdgeConv
    except ImportError:
        return None
    lin = t.nn.Linear(w1.shape[0], w1.shape[1], bias=False).to(device())
    conv = EdgeConv(t.nn.Sequential(lin, t.nn.ReLU()), aggr="add")
    with t.no_grad():   # (after EdgeConv's reset_parameters, which redraws it)
        lin.weight.copy_(w1.t())
    ei = t.stack([cols.long(), rows])   # (source j, target i): x_i is the row's own one

    def step():
        y = conv(x, ei)
        return t.autograd.grad(y, (x, lin.weight), t.ones_like(y))[0]
    return step


def attention(name: str):
    import tiga as tg

    t = _torch()
    seq, step = SIZE["attention"], "step" in name
    dtype = t.float16 if name.endswith("fp16") else t.float32
    g = tg.Graph.dense(seq, seq)
    q, k, v = (_randn(seq, HEADS, DIM, seed=11 + i, dtype=dtype).requires_grad_(step)
               for i in range(3))
    scale = DIM ** -0.5
    layer = _layers()["attention"]

    def tiga_fwd():
        return layer(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=scale)

    def sdpa_fwd():
        y = t.nn.functional.scaled_dot_product_attention(
            *[a.transpose(0, 1).unsqueeze(0) for a in (q, k, v)], scale=scale)
        return y.squeeze(0).transpose(0, 1)

    def run(fwd):
        def fwd_bwd():
            y = fwd()
            return t.autograd.grad(y, (q, k, v), t.ones_like(y))[0]
        return fwd_bwd if step else fwd
    return run(tiga_fwd), [("SDPA", run(sdpa_fwd))]


def setup(name: str):
    if name.startswith("csr-"):
        return stored_csr(SIZE[name])
    if name.startswith("attention-"):
        return attention(name)
    return {"hex-mesh": hex_mesh, "radius": radius, "knn": knn,
            "edgenn-step": edgenn_step}[name](SIZE[name])


def size_text(name: str) -> str:
    if name.startswith("attention-"):
        return f"L={SIZE['attention']} H={HEADS} D={DIM}"
    if name == "hex-mesh":
        return f"{SIZE[name]}^3 F=16"
    return f"n={SIZE[name]} F={FEATURES}"


_LAYERS: dict = {}


def _layers() -> dict:
    if _LAYERS:
        return _LAYERS
    import tiga as tg

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w

    class Sum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x

    class EdgeNN(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge, w1):
            return tg.math.relu(tg.math.concatenate([dst.x, src.x - dst.x], axis=-1) @ w1)

    class Attention(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge, scale):
            return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)

    _LAYERS.update(weighted=WeightedSum(), sum=Sum(), edgenn=EdgeNN(), attention=Attention())
    return _LAYERS


# ---- the worker ----------------------------------------------------------------------------

def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _sync() -> None:
    if not DRY:
        _torch().cuda.synchronize()


TIMED_MS = 1500.0   # a timing loop's length: fewer repeats (down to 3) for slow calls


def timed(fn, warmup: int, repeat: int) -> tuple:
    """(ms per call, calls timed) after `warmup` calls: CUDA events around back-to-back calls
    (what a caller waits for, host time included), perf_counter on CPU."""
    est = 0.0
    for _ in range(max(1, warmup)):   # (the last one timed alone: the driver's 10x check)
        t0 = time.perf_counter()
        fn()
        _sync()
        est = (time.perf_counter() - t0) * 1e3
    _emit(event="warm", est_ms=est)
    repeat = min(repeat, max(3, int(TIMED_MS / max(est, 1e-3))))
    if DRY:
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - t0) * 1e3 / repeat, repeat
    t = _torch()
    start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat, repeat


def run_command(cmd: dict) -> dict:
    """One side of one workload: set up, warm up, time, save or compare the result."""
    t = _torch()
    tiga_fn, peers = setup(cmd["workload"])
    name, fn = "tiga", tiga_fn
    if cmd["side"] == "peer":
        found = [(p, f) for p, f in peers if f is not None]
        if not found:
            return {"event": "done", "peer": None, "why": "no peer installed"}
        name, fn = found[0]
    _sync()
    _emit(event="ready", peer=name)
    ms, calls = timed(fn, cmd["warmup"], cmd["repeat"])
    out = fn().detach().to(t.float64)   # (with autograd on: a step differentiates)
    done = {"event": "done", "ms": ms, "calls": calls,
            "peer": name if cmd["side"] == "peer" else None}
    if cmd.get("save"):
        np.save(cmd["save"], out.cpu().numpy())
    if cmd.get("compare") and os.path.exists(cmd["compare"]):
        ref = t.from_numpy(np.load(cmd["compare"])).to(out.device)
        done["max_abs_diff"] = float((out - ref).abs().max()) if out.numel() else 0.0
        done["scale"] = float(ref.abs().max()) if ref.numel() else 0.0
    return done


def worker() -> int:
    """Serve commands from stdin until it closes (gpu_check.py kills a stalled one)."""
    if DRY:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import tiga as tg

    tg.config.backend = "triton-interpreter" if DRY else "triton"
    tg.config.strict = True   # a propagate that falls back to the reference is an error
    for line in sys.stdin:
        try:
            _emit(**run_command(json.loads(line)))
        except Exception:   # noqa: BLE001 - reported to the driver, which goes on
            _emit(event="error", error=traceback.format_exc(limit=-4))
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker())
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check.py"),
                   run_name="__main__")
