"""benchmarks: the report's Bunny-like EdgeNN study on CPU, Tiga vs torch eager (and compile).

35,947 points on a noisy torus (major/minor radius 1 / 0.35) normalised to the unit box, a
radius-0.013 relation (about 10 neighbours per point, no self edges), node features of width
8 and 32, message MLP [p_j - p_i; x_j] -> 32 ReLU -> 3 (--depth D: D hidden ReLU layers of 32)
summed into each destination, loss =
mean squared difference of the result to the positions. Per peer and width, in a fresh
process: forward median, loss+backward median (a full step minus the forward of the same
run), total step median, peak RSS above the level before the timed steps. Gradients of
positions, features and every MLP parameter are taken by torch.autograd in every peer.

Usage: python benchmarks/edge_nn.py [--quick] [--widths 8 32] [--peers ...] [--threads 2]
       [--depth 1]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

N_POINTS, RADIUS, HIDDEN, OUT, SEED = 35_947, 0.013, 32, 3, 0
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ---------------------------------------------------------------- workload
def torus_points(n: int = N_POINTS, seed: int = SEED) -> np.ndarray:
    """Area-uniform samples of a torus (R=1, r=0.35) plus small noise, scaled into [0, 1]^3."""
    rng = np.random.default_rng(seed)
    big, small = 1.0, 0.35
    u = rng.uniform(0, 2 * np.pi, n)
    v = np.empty(0)
    while v.size < n:  # rejection: the surface element is proportional to R + r cos v
        cand = rng.uniform(0, 2 * np.pi, 2 * n)
        keep = rng.uniform(0, big + small, 2 * n) < big + small * np.cos(cand)
        v = np.concatenate([v, cand[keep]])
    v = v[:n]
    p = np.stack([(big + small * np.cos(v)) * np.cos(u), (big + small * np.cos(v)) * np.sin(u),
                  small * np.sin(v)], axis=1)
    p += rng.normal(0.0, 0.002, p.shape)
    p -= p.min(axis=0)
    return (p / p.max()).astype(np.float32)


def radius_csr(points: np.ndarray, cutoff: float) -> tuple:
    """Destination-major CSR of {j != i : |p_j - p_i| <= cutoff} (scipy k-d tree)."""
    from scipy.spatial import cKDTree

    pairs = cKDTree(points).query_pairs(cutoff, output_type="ndarray")
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    order = np.lexsort((src, dst))
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=len(points)))])
    return row_ptr.astype(np.int64), src[order].astype(np.int64), dst[order].astype(np.int64)


def workload(width: int) -> dict:
    pos = torus_points()
    row_ptr, col, dst = radius_csr(pos, RADIUS)
    x = np.random.default_rng(SEED + 1).standard_normal((len(pos), width), dtype=np.float32)
    return {"pos": pos, "x": x, "row_ptr": row_ptr, "col": col, "dst": dst}


def make_mlp(torch, width: int, depth: int = 1):
    """`depth` hidden ReLU layers of HIDDEN units; depth 1 is the report's MLP (and its
    parameters are drawn identically, so depth-1 results do not depend on the option)."""
    torch.manual_seed(SEED)
    layers = [torch.nn.Linear(3 + width, HIDDEN), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, OUT))


# ---------------------------------------------------------------- peers (run in the child)
def peer_torch_eager(torch, d, mlp):
    src, dst = torch.from_numpy(d["col"]), torch.from_numpy(d["dst"])
    n = len(d["pos"])

    def forward(pos, x):
        msg = mlp(torch.cat((pos[src] - pos[dst], x[src]), dim=-1))
        return torch.zeros(n, OUT, dtype=msg.dtype).index_add(0, dst, msg)
    return forward, None


def peer_torch_compile(torch, d, mlp):
    forward, _ = peer_torch_eager(torch, d, mlp)
    return torch.compile(forward, dynamic=False), None


def peer_tiga(torch, d, mlp):
    """The report's form: tg.Graph.radius on the torch positions, edge.displacement. The
    neighbour search runs once per positions tensor (outside the timed steps, like the
    peers' prebuilt edge lists): the first call resolves the relation's CSR, which the
    kernels then walk; gradients reach the positions through the displacement."""
    import tiga as tg

    class EdgeNN(tg.MessagePassing):
        reducer = tg.sum()

        def __init__(self, module):
            super().__init__()
            self.mlp = tg.nn.trace(module)

        def edge(self, src, dst, edge):
            return self.mlp(edge.displacement, src.x)

    program = EdgeNN(mlp)
    graphs = {}

    def graph_of(pos):
        hit = graphs.get(id(pos))
        if hit is None or hit[0] is not pos:
            hit = graphs[id(pos)] = (pos, tg.Graph.radius(pos, cutoff=RADIUS))
        return hit[1]

    def forward(pos, x):
        return program(graph=graph_of(pos), src={"x": x})

    def explain(pos, x):
        graph = graph_of(pos)
        rp, col = (np.asarray(a) for a in graph.resolve_csr())
        same = np.array_equal(rp, d["row_ptr"]) and np.array_equal(col, d["col"])
        return (f"tg.Graph.radius relation identical to the scipy edge list: {same}\n"
                + str(program.explain(graph=graph, src={"x": x})))
    return forward, explain


def peer_pyg(torch, d, mlp):
    from torch_geometric.nn import MessagePassing

    class EdgeNN(MessagePassing):
        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, pos, x, edge_index):
            return self.propagate(edge_index, pos=pos, x=x)

        def message(self, pos_i, pos_j, x_j):
            return mlp(torch.cat((pos_j - pos_i, x_j), dim=-1))

    # PyG convention: row 0 = source (j), row 1 = target (i)
    edge_index = torch.stack([torch.from_numpy(d["col"]), torch.from_numpy(d["dst"])])
    layer = EdgeNN()
    return (lambda pos, x: layer(pos, x, edge_index)), None


PEERS = {"torch-eager": peer_torch_eager, "torch-compile": peer_torch_compile,
         "pyg": peer_pyg, "tiga": peer_tiga}


def child_run(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    d = workload(spec["width"])
    mlp = make_mlp(torch, spec["width"], spec.get("depth", 1))
    forward, explain = PEERS[spec["peer"]](torch, d, mlp)
    pos = torch.from_numpy(d["pos"]).requires_grad_()
    x = torch.from_numpy(d["x"]).requires_grad_()
    params = list(mlp.parameters())
    target = torch.from_numpy(d["pos"])

    def fwd():
        with torch.no_grad():
            return forward(pos, x)

    def step():
        for t in [pos, x, *params]:
            t.grad = None
        loss = (forward(pos, x) - target).square().mean()
        loss.backward()
        return loss

    t0 = time.perf_counter()
    step()
    first_ms = (time.perf_counter() - t0) * 1e3
    grads = [t.grad.clone() for t in [pos, x, *params]]
    mem = H.PeakRSS()
    mem.start()
    timing_step = H.time_calls(step, spec["warmup"], spec["repeat"], spec["budget_s"])
    peak_step = mem.stop()
    mem.start()
    timing_fwd = H.time_calls(fwd, spec["warmup"], spec["repeat"], spec["budget_s"])
    peak_fwd = mem.stop()
    res = {"fwd": timing_fwd, "step": timing_step, "first_step_ms": first_ms,
           "peak_rss_step_bytes": peak_step, "peak_rss_fwd_bytes": peak_fwd,
           "peak_rss_method": mem.method, "edges": int(len(d["col"])),
           "loadavg_1min": os.getloadavg()[0],
           "grad_digest": [float(g.double().abs().sum()) for g in grads]}
    if explain is not None:
        res["explain"] = explain(pos, x)
    return res


def child_check(spec: dict) -> dict:
    """Tiga's forward and every gradient against torch eager (outside any timing)."""
    import torch

    torch.set_num_threads(spec["threads"])
    d = workload(spec["width"])
    out = {}
    for name in ("tiga", "torch-eager"):
        mlp = make_mlp(torch, spec["width"], spec.get("depth", 1))
        forward, _ = PEERS[name](torch, d, mlp)
        pos = torch.from_numpy(d["pos"]).requires_grad_()
        x = torch.from_numpy(d["x"]).requires_grad_()
        y = forward(pos, x)
        loss = (y - torch.from_numpy(d["pos"])).square().mean()
        out[name] = [y.detach()] + list(torch.autograd.grad(loss, [pos, x,
                                                                   *mlp.parameters()]))
    errs = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
            for a, b in zip(out["tiga"], out["torch-eager"])]
    return {"max_rel_err": max(errs), "rel_err_per_output": errs}


# ---------------------------------------------------------------- parent
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[8, 32])
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--depth", type=int, default=1,
                   help="hidden ReLU layers of the message MLP (1: the report's MLP)")
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--envs", nargs="+", default=["tuned", "default"],
                   choices=["tuned", "default"])
    p.add_argument("--quick", action="store_true", help="repeat 5, warmup 1")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.repeat, a.warmup = min(a.repeat, 5), min(a.warmup, 1)
    return a


def _argv(spec):
    return [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]


def _median_key(r):
    return r["step"]["median_ms"] if r.get("status") == "ok" and "step" in r else None


def table(results: list, widths: list) -> str:
    rows = []
    for w in widths:
        group = {r["label"].split("/")[2]: r for r in results
                 if r["label"].startswith(f"run/{w}/")}
        eagers = [r for k, r in group.items()
                  if k.startswith("torch-eager@") and r.get("status") == "ok"]
        eager = min(eagers, key=_median_key) if eagers else None
        for peer, r in group.items():
            if r.get("status") != "ok":
                why = (r.get("stderr_tail") or r.get("status", "")).strip().splitlines()
                rows.append([w, peer, r.get("status"), (why[-1][-100:] if why else ""),
                             "", "", "", "", ""])
                continue
            f, s = r["fwd"]["median_ms"], r["step"]["median_ms"]
            bwd = s - f
            ratio = mem_ratio = "–"
            if eager is not None and eager.get("status") == "ok":
                ratio = f"{eager['step']['median_ms'] / s:.2f}×"
                mem_ratio = f"{r['peak_rss_step_bytes'] / max(1, eager['peak_rss_step_bytes']):.2f}"
            rows.append([w, peer, f"{f:.1f}", f"{bwd:.1f}", f"{s:.1f}",
                         f"{r['step']['min_ms']:.1f}–{r['step']['max_ms']:.1f}",
                         f"{r['peak_rss_step_bytes'] / 2**20:.0f}", ratio, mem_ratio])
    return H.markdown_table(["width", "impl", "fwd ms", "loss+bwd ms (step − fwd)",
                             "step ms", "step min–max", "peak ΔRSS MiB (step)",
                             "best eager step ÷ this", "peak ÷ that eager's"], rows)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child is not None:
        spec = json.loads(a.child)
        kind = spec.pop("kind")
        H.child_report({"run": child_run, "check": child_check}[kind](spec))
        return 0
    envs = {"default": H.thread_env(a.threads),
            # numpy's OpenBLAS pool and torch's spinning OpenMP pool oversubscribe two cores
            # next to Tiga's own pool (seconds-long stalls seen here); torch eager runs under
            # both settings, so the comparison takes its better one
            "tuned": {**H.thread_env(a.threads), "OPENBLAS_NUM_THREADS": "1",
                      "OMP_WAIT_POLICY": "PASSIVE"}}
    machine = H.machine_info(a.threads)
    machine["code"] = H.code_state(os.path.join(os.path.dirname(RESULTS_DIR), ".."))
    if a.depth < 1:
        raise SystemExit("--depth must be at least 1")
    base = {"threads": a.threads, "depth": a.depth, "warmup": a.warmup, "repeat": a.repeat,
            "budget_s": a.timeout * 0.3}
    raw, interrupted = [], False
    for rnd in range(a.rounds):
        for env_name in a.envs:
            jobs = []
            for w in a.widths:
                if env_name == a.envs[0]:
                    jobs.append((f"check/{w}", _argv({**base, "kind": "check", "width": w})))
                for peer in a.peers:
                    jobs.append((f"run/{w}/{peer}@{env_name}",
                                 _argv({**base, "kind": "run", "width": w, "peer": peer})))
            res, interrupted = H.run_all(jobs, a.timeout, envs[env_name],
                                         desc=f"edge-nn {env_name} {rnd + 1}/{a.rounds}")
            raw += [{**r, "round": rnd, "env": env_name} for r in res]
            if interrupted:
                break
        if interrupted:
            break
    by_label: dict = {}
    for r in raw:
        by_label.setdefault(r["label"], []).append(r)
    results = []
    for rs in by_label.values():
        ok = [r for r in rs if _median_key(r) is not None]
        pick = dict(min(ok, key=_median_key) if ok else rs[-1])
        pick["rounds"] = [_median_key(r) for r in rs]
        results.append(pick)
    path = a.out or os.path.join(
        RESULTS_DIR, f"edge_nn-{datetime.date.today().isoformat()}"
        f"{f'-depth{a.depth}' if a.depth != 1 else ''}{'-quick' if a.quick else ''}.json")
    settings = {k: v for k, v in vars(a).items() if k != "child"}
    H.write_json(path, {"workload": {"points": N_POINTS, "radius": RADIUS, "hidden": HIDDEN,
                                     "depth": a.depth, "out": OUT, "seed": SEED},
                        "settings": settings, "machine": machine, "results": results,
                        "interrupted": interrupted})
    print(f"machine: {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, threads "
          f"{a.threads}, MLP depth {a.depth}, load at start {machine.get('loadavg_at_start')}")
    for r in results:
        if r["label"].startswith("check/"):
            print(f"{r['label']}: Tiga vs torch eager max relative error "
                  f"{r.get('max_rel_err', r.get('status'))}")
    edges = next((r["edges"] for r in results if "edges" in r), None)
    print(f"edges: {edges}\n")
    print(table(results, a.widths))
    tiga = next((r for r in results if r["label"].endswith("/tiga") and "explain" in r), None)
    if tiga:
        print("\nTiga explain():\n" + tiga["explain"])
    print(f"\nresults: {path}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
