"""Benchmark: tg.nn.NeighborLoader sampling throughput (and a GraphSAGE epoch) on a synthetic
graph the size of ogbn-arxiv (169,343 nodes, 1,166,243 edges, 128 features, 40 classes).

    .venv/bin/python benchmarks/neighbor_loader.py --quick       # 20 batches per mode
    .venv/bin/python benchmarks/neighbor_loader.py               # a full epoch per mode
    .venv/bin/python benchmarks/neighbor_loader.py --out /tmp/nl.json

Seeds: a fixed 90,941 training nodes (ogbn-arxiv's train split size), batches of 1024,
num_neighbors [15, 10], shuffled, seed 0. Modes: "memory" (the CSR in memory, sampling
only), "memory+features" (also slicing x and y into each batch), "paged" (the graph written
to a tg.store and opened as a paged tg.Graph: each hop reads only the row_ptr and col_idx
entries it samples) and "paged+features" (also x, a store field on disk, read by the rows of
each batch's nodes: scattered rows touch most of its chunks). Sampled edges per
second = edges of the sampled subgraphs / wall time of iterating the loader. "sage" times a
GraphSAGE step (2 x tg.nn.SAGEConv, hidden 256, forward, backward, Adam) on each batch of
the memory+features loader, after one warm-up batch; "pyg sage" the same steps with PyG's
SAGEConv (same weights, same batches: the loader's seed). PyG's NeighborLoader
runs in the same process where its sampler can (it needs pyg-lib or torch-sparse; without
them the line says why it was skipped). The degree distribution is skewed (in-degree ~ a
power law), ids shuffled. Prints one JSON line per mode.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

NODES, EDGES, FEATURES, CLASSES, TRAIN = 169_343, 1_166_243, 128, 40, 90_941
FANOUTS, BATCH = [15, 10], 1024


def synthetic(seed: int = 0):
    """(src, dst) int64 with a power-law in-degree, and x, y."""
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, NODES + 1) ** 0.75
    ids = rng.permutation(NODES)
    dst = ids[np.searchsorted(np.cumsum(weight / weight.sum()), rng.random(EDGES))
              .clip(max=NODES - 1)]
    src = rng.integers(0, NODES, EDGES)
    x = rng.standard_normal((NODES, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, NODES)
    return src, dst, x, y


def write_store(path: Path, row_ptr, col_idx, x, chunk: int = 16384):
    import tiga as tg
    with tg.store.create(path, num_src=NODES, num_dst=NODES, index_dtype="int32") as w:
        for a in range(0, NODES, chunk):
            b = min(a + chunk, NODES)
            w.append_csr_chunk(row_ptr[a:b + 1] - row_ptr[a], col_idx[row_ptr[a]:row_ptr[b]])
        w.append_field("x", x, role="src")
    return tg.Graph.open(path)


def run_loader(loader, limit: int | None) -> dict:
    edges = nodes = batches = 0
    t0 = time.perf_counter()
    for sub in loader:
        edges += int(sub.e_id.numel())
        nodes += int(sub.n_id.numel())
        batches += 1
        if limit is not None and batches >= limit:
            break
    dt = time.perf_counter() - t0
    return {"batches": batches, "sampled_edges": edges, "sampled_nodes": nodes,
            "seconds": round(dt, 4), "edges_per_s": round(edges / dt),
            "batches_per_s": round(batches / dt, 2)}


def run_sage(loader, limit: int | None, lib: str = "tiga") -> dict:
    """GraphSAGE steps on the loader's batches: tg.nn.SAGEConv, or (lib="pyg") PyG's
    SAGEConv on the same batches (the same seed, so the same subgraphs), both layers
    starting from the same PyG-initialised weights."""
    import torch

    import tiga as tg
    torch.manual_seed(0)
    layers = _pyg_sage()
    if lib == "tiga":
        made = (tg.nn.SAGEConv(FEATURES, 256), tg.nn.SAGEConv(256, CLASSES))
        for mine, theirs in zip(made, layers):
            mine.load_state_dict(theirs.state_dict())
        layers = made
    conv1, conv2 = layers
    opt = torch.optim.Adam([*conv1.parameters(), *conv2.parameters()], lr=0.01)

    def step(sub):
        opt.zero_grad()
        out = conv2(conv1(sub.x, sub.edge_index).relu(), sub.edge_index)[:sub.batch_size]
        loss = torch.nn.functional.cross_entropy(out, sub.y[:sub.batch_size])
        loss.backward()
        opt.step()
        return float(loss.detach())

    it = iter(loader)
    step(next(it))                                  # warm-up: compiles the propagates
    batches, t0 = 0, time.perf_counter()
    for sub in it:
        loss = step(sub)
        batches += 1
        if limit is not None and batches >= limit:
            break
    dt = time.perf_counter() - t0
    return {"batches": batches, "seconds": round(dt, 4),
            "seconds_per_batch": round(dt / max(batches, 1), 4), "last_loss": round(loss, 4)}


def _pyg_sage() -> tuple:
    """PyG's two SAGEConv layers (the reference init for both libraries), or tg.nn's own
    init where PyG is not installed."""
    try:
        from torch_geometric.nn import SAGEConv
    except ImportError:
        import tiga as tg
        SAGEConv = tg.nn.SAGEConv
    return SAGEConv(FEATURES, 256), SAGEConv(256, CLASSES)


def _has_pyg() -> bool:
    try:
        import torch_geometric.nn  # noqa: F401
        return True
    except ImportError:
        return False


def run_pyg(src, dst, x, y, train, limit) -> dict:
    try:
        import torch
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader
        data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y),
                    edge_index=torch.from_numpy(np.stack([src, dst])), num_nodes=NODES)
        loader = NeighborLoader(data, num_neighbors=FANOUTS, batch_size=BATCH, shuffle=True,
                                input_nodes=torch.from_numpy(train))
        return run_loader(loader, limit)
    except ImportError as exc:
        return {"skipped": f"PyG's sampler is unavailable ({exc})"}


def plot(results: list, path: str) -> None:
    """Sampled edges per second of each loader mode, and the GraphSAGE step of each library."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    loaders = [r for r in results if "edges_per_s" in r]
    steps = [r for r in results if "seconds_per_batch" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.barh([r["mode"] for r in loaders], [r["edges_per_s"] / 1e6 for r in loaders])
    a.set_xlabel("sampled edges per second (millions)")
    a.set_title("tg.nn.NeighborLoader, [15, 10], batches of 1024")
    b.barh([r["mode"] for r in steps], [1e3 * r["seconds_per_batch"] for r in steps])
    b.set_xlabel("ms per GraphSAGE step (forward, backward, Adam)")
    b.set_title("the same sampled batches")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 batches per mode, 5 SAGE steps")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--no-sage", action="store_true", help="skip the GraphSAGE steps")
    p.add_argument("--out", help="also write the results as a JSON list here")
    p.add_argument("--plot", help="write a plot of the results here (PNG)")
    p.add_argument("--plot-from", help="plot this JSON list (--out of an earlier run) and exit")
    args = p.parse_args()
    if args.plot_from:
        plot(json.loads(Path(args.plot_from).read_text()), args.plot or "neighbor_loader.png")
        return

    import warnings

    import torch

    import tiga as tg
    torch.set_num_threads(args.threads)
    limit, sage_limit = (20, 5) if args.quick else (None, None)
    src, dst, x, y = synthetic()
    train = np.sort(np.random.default_rng(1).permutation(NODES)[:TRAIN])
    t0 = time.perf_counter()
    graph = tg.Graph.from_coo(src, dst, num_src=NODES, num_dst=NODES)
    build_s = time.perf_counter() - t0
    row_ptr, col_idx = (np.asarray(a) for a in graph.resolve_csr())
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    common = {"num_neighbors": FANOUTS, "batch_size": BATCH, "shuffle": True, "seed": 0,
              "input_nodes": train}
    results = []

    def report(mode: str, res: dict) -> None:
        res = {"mode": mode, "nodes": NODES, "edges": EDGES, "num_neighbors": FANOUTS,
               "batch_size": BATCH, "quick": args.quick, "threads": args.threads} | res
        results.append(res)
        print(json.dumps(res), flush=True)

    report("memory", {"graph_build_s": round(build_s, 3)} |
           run_loader(tg.nn.NeighborLoader(graph, **common), limit))
    report("memory+features", run_loader(tg.nn.NeighborLoader(graph, x=xt, y=yt, **common),
                                         limit))
    with tempfile.TemporaryDirectory() as tmp:
        paged = write_store(Path(tmp) / "arxiv", row_ptr, col_idx, x)
        loader = tg.nn.NeighborLoader(paged, store_fields=False, **common)
        res = run_loader(loader, limit)
        res["entries_read"] = loader.rows.entries_read
        report("paged", res)
        report("paged+features", run_loader(tg.nn.NeighborLoader(paged, y=yt, **common),
                                            limit))
    if not args.no_sage:
        report("sage", run_sage(tg.nn.NeighborLoader(graph, x=xt, y=yt, **common),
                                sage_limit))
        if _has_pyg():    # PyG's layers on the same sampled batches (its sampler may not run)
            report("pyg sage", run_sage(tg.nn.NeighborLoader(graph, x=xt, y=yt, **common),
                                        sage_limit, lib="pyg"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report("pyg", run_pyg(src, dst, x, y, train, limit))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
