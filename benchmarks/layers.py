"""Benchmark: training steps of tg.nn layers against PyG's, in one process, same threads.

    .venv/bin/python benchmarks/layers.py --quick                # small sizes, 2 timed steps
    .venv/bin/python benchmarks/layers.py                        # every model, full size
    .venv/bin/python benchmarks/layers.py --models gcn sage      # some of them
    .venv/bin/python benchmarks/layers.py --models molecules     # graph classification only
    .venv/bin/python benchmarks/layers.py --out /tmp/layers.json
    .venv/bin/python benchmarks/layers.py --plot-from a.json b.json --plot plots/layers.png

Node classification (full batch): a synthetic graph the size of ogbn-arxiv (169,343 nodes,
1,166,243 directed edges, 128 features, 40 classes; the in-degree follows a power law, ids
shuffled: benchmarks/neighbor_loader.py's `synthetic`), the loss on a fixed 90,941 training
nodes (arxiv's train split size). Each model is two layers with ReLU between them, hidden
256: `gcn` (GCNConv), `sage` (SAGEConv, mean), `gat` (GATConv, 4 heads x 64, then 1 head),
`graphconv` (GraphConv, sum), `transformer` (TransformerConv, 4 heads x 64, then 1 head),
`gen` (GENConv, softmax aggregation, learnable temperature). One training step = zero_grad,
forward, cross entropy, backward, Adam step. Both models take the same `edge_index` tensor
(int64, (2, E)) as a PyG user passes it; the Tiga model loads the PyG model's state dict,
and both models' first outputs are compared before anything is timed.

Graph classification (`molecules`): 4,096 synthetic molecules of 18-32 atoms (25 on
average: a chain with about one ring closure per 6 atoms, bonds in both directions, 32
atom features, 2 classes), in batches of 128. The model: three GINConv layers (MLP 64-64,
ReLU), global_add_pool, a Linear to 2 classes. Timed two ways: `step` runs the training
steps over the 32 batches collated once beforehand (the second pass over them), and
`epoch` an epoch whose batches are collated on the way, shuffled (PyG: its DataLoader over
Data objects; Tiga: tg.Graph.batch of tg.Graphs and torch.cat of the features).

Timing: after warm-up steps (the first Tiga step compiles; its time is printed as
`first_step_s`), the two libraries' steps alternate, `--reps` each, and the medians are
compared: `speedup` = PyG median / Tiga median. torch runs with THP_MEM_ALLOC_ENABLE=1
(set here before torch is imported, unless the environment sets it: with 0, torch's
allocator leaves huge pages alone, which the small tensors of the molecule batches can be
far faster without) and `--threads` threads for both libraries.
Prints one JSON line per model.
"""
from __future__ import annotations

import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")   # before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NODE_MODELS = ("gcn", "sage", "gat", "graphconv", "transformer", "gen")
GRAPH_MODELS = ("molecules",)
HIDDEN = 256


# ---------------------------------------------------------------- node classification
def arxiv_like(quick: bool):
    """(x, y, edge_index, train index) as torch tensors; quick: 1/16 of the graph."""
    import torch
    from neighbor_loader import CLASSES, EDGES, FEATURES, NODES, TRAIN, synthetic
    if quick:
        nodes, edges = NODES // 16, EDGES // 16
        rng = np.random.default_rng(0)
        src, dst = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
        x = rng.standard_normal((nodes, FEATURES)).astype(np.float32)
        y = rng.integers(0, CLASSES, nodes)
        train = TRAIN // 16
    else:
        src, dst, x, y = synthetic()
        nodes, train = NODES, TRAIN
    train_idx = np.sort(np.random.default_rng(1).permutation(nodes)[:train])
    edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
    return (torch.from_numpy(x), torch.from_numpy(y), edge_index,
            torch.from_numpy(train_idx))


def two_layer(lib, name: str, features: int, classes: int):
    """A two-layer model of `lib` (torch_geometric.nn or tiga.nn) layers."""
    import torch
    if name == "gcn":
        convs = lib.GCNConv(features, HIDDEN), lib.GCNConv(HIDDEN, classes)
    elif name == "sage":
        convs = lib.SAGEConv(features, HIDDEN), lib.SAGEConv(HIDDEN, classes)
    elif name == "gat":
        convs = (lib.GATConv(features, HIDDEN // 4, heads=4),
                 lib.GATConv(HIDDEN, classes, heads=1))
    elif name == "graphconv":
        convs = lib.GraphConv(features, HIDDEN), lib.GraphConv(HIDDEN, classes)
    elif name == "transformer":
        convs = (lib.TransformerConv(features, HIDDEN // 4, heads=4),
                 lib.TransformerConv(HIDDEN, classes, heads=1))
    elif name == "gen":
        convs = (lib.GENConv(features, HIDDEN, aggr="softmax", t=1.0, learn_t=True),
                 lib.GENConv(HIDDEN, classes, aggr="softmax", t=1.0, learn_t=True))
    else:
        raise ValueError(f"unknown model {name!r}")

    class TwoLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = convs

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return TwoLayer()


def node_steps(model, opt, x, y, edge_index, train_idx):
    import torch

    def step():
        opt.zero_grad()
        out = model(x, edge_index)
        loss = torch.nn.functional.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def run_node(name: str, data, reps: int, warmup: int) -> dict:
    import torch
    import torch_geometric.nn as pyg_nn

    import tiga as tg
    x, y, edge_index, train_idx = data
    torch.manual_seed(0)
    pyg = two_layer(pyg_nn, name, x.size(1), int(y.max()) + 1)
    ours = two_layer(tg.nn, name, x.size(1), int(y.max()) + 1)
    ours.load_state_dict(pyg.state_dict())
    with torch.no_grad():
        want, got = pyg(x, edge_index), ours(x, edge_index)
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
    if not err < 1e-4:
        raise AssertionError(f"{name}: tg.nn and PyG outputs differ (relative {err:.2e})")
    steps = {}
    first = {}
    for lib, model in (("tiga", ours), ("pyg", pyg)):
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        steps[lib] = node_steps(model, opt, x, y, edge_index, train_idx)
        t0 = time.perf_counter()
        steps[lib]()
        first[lib] = time.perf_counter() - t0
        for _ in range(warmup - 1):
            steps[lib]()
    res = alternate(steps, reps)
    return {"model": name, "nodes": int(x.size(0)), "edges": int(edge_index.size(1)),
            "features": int(x.size(1)), "hidden": HIDDEN, "rel_err_vs_pyg": float(f"{err:.2e}"),
            "first_step_s": {k: round(v, 3) for k, v in first.items()}} | res


def alternate(steps: dict, reps: int) -> dict:
    """Each library's step in turn, `reps` rounds; medians (and minima) in ms."""
    times: dict = {k: [] for k in steps}
    for _ in range(reps):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_ms": {k: round(v, 2) for k, v in med.items()},
            "min_ms": {k: round(min(v), 2) for k, v in times.items()},
            "reps": reps, "speedup": round(med["pyg"] / med["tiga"], 2)}


# ---------------------------------------------------------------- graph classification
def molecules(count: int, features: int, seed: int = 0):
    """(edge lists, features, labels): chains of 18-32 atoms with ring closures."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(18, 33))
        a = np.arange(n - 1)
        bonds = [np.stack([a, a + 1])]
        rings = max(1, n // 6)
        i = rng.integers(0, n - 5, rings)
        bonds.append(np.stack([i, i + rng.integers(4, 6, rings)]))
        b = np.concatenate(bonds, axis=1)
        edge_index = np.concatenate([b, b[::-1]], axis=1).astype(np.int64)
        x = rng.standard_normal((n, features)).astype(np.float32)
        out.append((n, edge_index, x, int(rng.integers(0, 2))))
    return out


def gin(lib, features: int):
    import torch

    def mlp(i):
        return torch.nn.Sequential(torch.nn.Linear(i, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 64))

    class GIN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([lib.GINConv(mlp(features)), lib.GINConv(mlp(64)),
                                              lib.GINConv(mlp(64))])
            self.lin = torch.nn.Linear(64, 2)

        def forward(self, x, edge_index, batch):
            for conv in self.convs:
                x = conv(x, edge_index).relu()
            return self.lin(lib.global_add_pool(x, batch))

    return GIN()


def run_molecules(count: int, batch_size: int, reps: int, warmup: int) -> dict:
    import torch
    import torch_geometric.nn as pyg_nn
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

    import tiga as tg
    features = 32
    mols = molecules(count, features)
    data = [Data(x=torch.from_numpy(x), edge_index=torch.from_numpy(ei), y=torch.tensor([c]),
                 num_nodes=n) for n, ei, x, c in mols]
    graphs = [tg.Graph.from_coo(ei[0], ei[1], num_src=n, num_dst=n) for n, ei, _, _ in mols]
    xs = [torch.from_numpy(x) for _, _, x, _ in mols]
    labels = torch.tensor([c for *_, c in mols])

    def tiga_batch(idx):
        b = tg.Graph.batch([graphs[i] for i in idx])
        return torch.cat([xs[i] for i in idx]), b, b, labels[idx]

    def pyg_batches(shuffle: bool):
        for b in DataLoader(data, batch_size=batch_size, shuffle=shuffle):
            yield b.x, b.edge_index, b.batch, b.y

    def tiga_batches(shuffle: bool):
        order = torch.randperm(count) if shuffle else torch.arange(count)
        for a in range(0, count, batch_size):
            yield tiga_batch(order[a:a + batch_size].tolist())

    torch.manual_seed(0)
    pyg, ours = gin(pyg_nn, features), gin(tg.nn, features)
    ours.load_state_dict(pyg.state_dict())
    collated = {"pyg": list(pyg_batches(False)), "tiga": list(tiga_batches(False))}
    with torch.no_grad():
        want = pyg(*collated["pyg"][0][:3])
        got = ours(*collated["tiga"][0][:3])
    err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
    if not err < 1e-4:
        raise AssertionError(f"GIN: tg.nn and PyG outputs differ (relative {err:.2e})")
    models = {"pyg": pyg, "tiga": ours}
    opts = {k: torch.optim.Adam(m.parameters(), lr=0.01) for k, m in models.items()}

    def train(lib, batches):
        model, opt = models[lib], opts[lib]
        n = 0
        for x, ei, batch, y in batches:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x, ei, batch), y)
            loss.backward()
            opt.step()
            n += 1
        return n

    first = {}
    for lib in ("tiga", "pyg"):
        t0 = time.perf_counter()
        train(lib, collated[lib][:1])
        first[lib] = time.perf_counter() - t0
        for _ in range(warmup):
            train(lib, collated[lib])     # every batch once: each relation prepared
    nb = len(collated["pyg"])
    step = alternate({k: (lambda k=k: train(k, collated[k])) for k in ("tiga", "pyg")}, reps)
    epoch = alternate({"tiga": lambda: train("tiga", tiga_batches(True)),
                       "pyg": lambda: train("pyg", pyg_batches(True))}, reps)
    per_step = {k: round(v / nb, 3) for k, v in step["median_ms"].items()}
    return {"model": "molecules", "graphs": count, "batch_size": batch_size, "batches": nb,
            "nodes": sum(m[0] for m in mols), "edges": sum(m[1].shape[1] for m in mols),
            "features": features, "rel_err_vs_pyg": float(f"{err:.2e}"),
            "first_step_s": {k: round(v, 3) for k, v in first.items()},
            "step_ms_per_batch": per_step, "step_speedup": step["speedup"],
            "epoch_ms": epoch["median_ms"], "epoch_min_ms": epoch["min_ms"],
            "epoch_speedup": epoch["speedup"], "reps": reps}


def plot(results: list, path: str) -> None:
    """A bar per model: PyG's median step time / Tiga's (the molecules: per batch step and
    per shuffled epoch)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names, ratios = [], []
    for r in results:
        if r["model"] == "molecules":
            thp = "" if r.get("THP_MEM_ALLOC_ENABLE") == "1" else "\nTHP off"
            names += [f"GIN molecules\n(step){thp}", f"GIN molecules\n(epoch){thp}"]
            ratios += [r["step_speedup"], r["epoch_speedup"]]
        else:
            names.append(r["model"])
            ratios.append(r["speedup"])
    fig, ax = plt.subplots(figsize=(1.1 * len(names) + 2, 3.6))
    bars = ax.bar(range(len(names)), ratios, color=["C0" if v >= 1 else "C3" for v in ratios])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("PyG time / Tiga time")
    ax.set_yscale("log")
    threads = {r.get("threads") for r in results}
    ax.set_title(f"Training step, tg.nn vs PyG (threads: {', '.join(map(str, threads))})",
                 fontsize=9)
    for b, v in zip(bars, ratios):
        ax.annotate(f"{v:.2f}x", (b.get_x() + b.get_width() / 2, v), ha="center",
                    va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="1/16 of the graph, 512 molecules, 2 timed steps (a check that it runs)")
    p.add_argument("--models", nargs="+", default=list(NODE_MODELS + GRAPH_MODELS),
                   choices=NODE_MODELS + GRAPH_MODELS)
    p.add_argument("--threads", type=int, default=2, help="torch threads, both libraries")
    p.add_argument("--reps", type=int, default=7, help="timed steps per library")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", help="also write the results as a JSON list here")
    p.add_argument("--plot", help="write a bar chart of the speedups here (PNG)")
    p.add_argument("--plot-from", nargs="+", metavar="JSON",
                   help="plot these --out files instead of running")
    args = p.parse_args(argv)
    if args.plot_from:
        plot([r for f in args.plot_from for r in json.loads(Path(f).read_text())],
             args.plot or "layers.png")
        return
    if args.quick:
        args.reps, args.warmup = 2, 1

    import torch
    torch.set_num_threads(args.threads)
    meta = {"threads": args.threads, "quick": args.quick,
            "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE")}
    results = []

    def report(res: dict) -> None:
        results.append(res | meta)
        print(json.dumps(results[-1]), flush=True)
        if args.out:      # after each model: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(results, indent=1))

    node = [m for m in args.models if m in NODE_MODELS]
    if node:
        data = arxiv_like(args.quick)
        for name in node:
            report(run_node(name, data, args.reps, args.warmup))
    if "molecules" in args.models:
        report(run_molecules(512 if args.quick else 4096, 128, args.reps, args.warmup))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
