"""Example: GCN, GraphSAGE (mean), GAT (1 and 2 heads) and GIN from tg.nn, Tiga's layer zoo.

tg.nn.GCNConv, SAGEConv, GATConv and GINConv are ordinary torch.nn.Modules with PyG's
constructor arguments and parameter names: the dense projections (Linear layers, attention
vectors, GIN's network) stay in torch, and only the aggregation over the relation runs in
Tiga, as a MessagePassing call on torch tensors (so torch.autograd runs Tiga's compiled VJP).
Because the names are PyG's, `pyg_conv.load_state_dict(conv.state_dict())` copies the
weights either way. GCN and GAT add self loops as PyG's layers do
(Graph.add_remaining_self_loops): a member that already has a self loop gets no second one.

Every layer is checked, forward and gradients (input and every parameter), against a dense
torch formula written independently here, and against PyG's own GCNConv / SAGEConv / GATConv
/ GINConv when torch_geometric is installed: on the karate club, and on the karate club with
self loops on some members (one of them twice). Then a two-layer model of each kind is
trained on Zachary's karate club (34 members, 78 friendships, the club each member joined).

    .venv/bin/python examples/gnn_layers.py
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

import tiga as tg

# Zachary's karate club (public data): friendships, and the club each member joined
# (0: Mr. Hi, 1: Officer). networkx ships the same graph; it is used when installed.
KARATE_EDGES = (
    "0-1 0-2 0-3 0-4 0-5 0-6 0-7 0-8 0-10 0-11 0-12 0-13 0-17 0-19 0-21 0-31 1-2 1-3 1-7 "
    "1-13 1-17 1-19 1-21 1-30 2-3 2-7 2-8 2-9 2-13 2-27 2-28 2-32 3-7 3-12 3-13 4-6 4-10 5-6 "
    "5-10 5-16 6-16 8-30 8-32 8-33 9-33 13-33 14-32 14-33 15-32 15-33 18-32 18-33 19-33 "
    "20-32 20-33 22-32 22-33 23-25 23-27 23-29 23-32 23-33 24-25 24-27 24-31 25-31 26-29 "
    "26-33 27-33 28-31 28-33 29-32 29-33 30-32 30-33 31-32 31-33 32-33")
KARATE_CLUB = "0000000001000011001010111111111111"


def karate_club() -> tuple[np.ndarray, np.ndarray]:
    """(edge_index (2, 156) with both directions of each friendship, club labels (34,))."""
    try:
        import networkx as nx
        g = nx.karate_club_graph()
        pairs = np.array(sorted((min(a, b), max(a, b)) for a, b in g.edges()))
        club = np.array([g.nodes[i]["club"] != "Mr. Hi" for i in range(34)], dtype=np.int64)
    except ImportError:
        pairs = np.array([[int(v) for v in e.split("-")] for e in KARATE_EDGES.split()])
        club = np.array([int(c) for c in KARATE_CLUB])
    assert pairs.shape == (78, 2)
    return np.concatenate([pairs.T, pairs.T[::-1]], axis=1), club


# ---- the layers (tg.nn) ---------------------------------------------------------------------

def gin_network(n_in: int, n_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, n_out), nn.ReLU(), nn.Linear(n_out, n_out))


LAYERS = {
    "GCN": lambda i, o: tg.nn.GCNConv(i, o),
    "GraphSAGE": lambda i, o: tg.nn.SAGEConv(i, o, aggr="mean"),
    "GAT (1 head)": lambda i, o: tg.nn.GATConv(i, o, heads=1),
    "GAT (2 heads)": lambda i, o: tg.nn.GATConv(i, o, heads=2),   # output (N, 2 * o)
    "GIN": lambda i, o: tg.nn.GINConv(gin_network(i, o), eps=0.1),
}


# ---- oracles: dense torch formulas, and PyG --------------------------------------------------

def with_one_loop_each(adj):
    """adj with every diagonal entry 1: PyG's add_remaining_self_loops (unit weights)."""
    eye = torch.eye(len(adj), dtype=adj.dtype)
    return adj * (1 - eye) + eye


def dense_reference(layer: nn.Module, x, adj):
    """The layer's formula on a dense adjacency adj[i, j] = number of edges j -> i."""
    if isinstance(layer, tg.nn.GCNConv):
        a = with_one_loop_each(adj)
        d = a.sum(1).rsqrt()
        return (d[:, None] * a * d[None, :]) @ layer.lin(x) + layer.bias
    if isinstance(layer, tg.nn.SAGEConv):
        mean = adj @ x / adj.sum(1, keepdim=True).clamp(min=1)
        return layer.lin_l(mean) + layer.lin_r(x)
    if isinstance(layer, tg.nn.GATConv):
        count = with_one_loop_each(adj)          # a duplicate edge is a second message
        h = layer.lin(x).view(-1, layer.heads, layer.out_channels)
        a_src, a_dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
        e = torch.nn.functional.leaky_relu(a_dst.T[:, :, None] + a_src.T[:, None, :], 0.2)
        e = e.masked_fill(count == 0, float("-inf"))                        # (H, i, j)
        w = count * (e - e.amax(-1, keepdim=True)).exp()
        alpha = w / w.sum(-1, keepdim=True)
        out = torch.einsum("hij,jhc->ihc", alpha, h)
        return out.reshape(len(x), -1) + layer.bias
    return layer.nn((1 + layer.eps) * x + adj @ x)


def pyg_layer(layer: nn.Module):
    """PyG's own layer with `layer`'s weights (same constructor, same parameter names), or
    None without torch_geometric."""
    try:
        import torch_geometric.nn as pyg
    except ImportError:
        return None
    if isinstance(layer, tg.nn.GINConv):
        first, last = layer.nn[0], layer.nn[2]
        conv = pyg.GINConv(gin_network(first.in_features, last.out_features),
                           eps=layer.initial_eps)
    elif isinstance(layer, tg.nn.GATConv):
        conv = pyg.GATConv(layer.in_channels, layer.out_channels, heads=layer.heads)
    else:
        conv = getattr(pyg, type(layer).__name__)(layer.in_channels, layer.out_channels)
    conv = conv.to(next(layer.parameters()).dtype)
    conv.load_state_dict(layer.state_dict())
    return conv


def _value_and_grads(fn, x, params, cot):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    grads = torch.autograd.grad((y * cot).sum(), [x, *params])
    return y.detach(), grads


def check_layer(name: str, graph: tg.Graph, edge_index, x) -> dict:
    """Forward and gradient differences of the Tiga layer against each oracle."""
    torch.manual_seed(1)
    layer = LAYERS[name](x.shape[1], 4).double()
    with torch.no_grad():   # non-zero biases, so that their gradients mean something
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    adj = torch.zeros(len(x), len(x), dtype=x.dtype)
    adj.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1],
                                                              dtype=x.dtype), accumulate=True)
    params = list(layer.parameters())
    cot = torch.randn(layer(x, graph).shape, dtype=x.dtype)
    got = _value_and_grads(lambda v: layer(v, graph), x, params, cot)
    oracles = {"dense torch": _value_and_grads(lambda v: dense_reference(layer, v, adj), x,
                                               params, cot)}
    conv = pyg_layer(layer)
    if conv is not None:
        by_name = dict(conv.named_parameters())
        pyg_params = [by_name[n] for n, _ in layer.named_parameters()]
        oracles["PyG"] = _value_and_grads(lambda v: conv(v, edge_index), x, pyg_params, cot)
    out = {}
    for oracle, (y, grads) in oracles.items():
        out[oracle] = (float((got[0] - y).abs().max()),
                       max(float((a - b).abs().max()) for a, b in zip(got[1], grads)))
    return out


# ---- training ------------------------------------------------------------------------------

class TwoLayer(nn.Module):
    def __init__(self, name: str, n_in: int, hidden: int, n_out: int):
        super().__init__()
        if name.startswith("GAT"):   # two heads concatenated, then one head for the logits
            self.first = tg.nn.GATConv(n_in, hidden // 2, heads=2)
            self.second = tg.nn.GATConv(hidden, n_out, heads=1)
        else:
            self.first = LAYERS[name](n_in, hidden)
            self.second = LAYERS[name](hidden, n_out)

    def forward(self, x, graph):
        return self.second(torch.relu(self.first(x, graph)), graph)


def train(name: str, graph: tg.Graph, club: np.ndarray, epochs: int = 100) -> dict:
    """Semi-supervised: only the two leaders (members 0 and 33) are labelled."""
    torch.manual_seed(0)
    x = torch.eye(34)   # one-hot member features, as in PyG's KarateClub
    y = torch.from_numpy(club)
    labelled = torch.tensor([0, 33])
    model = TwoLayer(name, 34, 16, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    first_loss = None
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, graph)[labelled], y[labelled])
        loss.backward()
        opt.step()
        first_loss = float(loss.detach()) if first_loss is None else first_loss
    with torch.no_grad():
        accuracy = float((model(x, graph).argmax(1) == y).double().mean())
    return {"first_loss": first_loss, "loss": float(loss.detach()), "accuracy": accuracy}


def main(epochs: int = 100, verbose: bool = True) -> dict:
    edge_index_np, club = karate_club()
    graph = tg.Graph.from_edge_index(edge_index_np, num_nodes=34)
    edge_index = torch.from_numpy(edge_index_np)
    x = torch.randn(34, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    say = print if verbose else (lambda *a: None)
    say(f"karate club: {graph.num_dst} members, {graph.num_edges // 2} friendships")
    # the same checks where members 0 and 33 have a self loop and member 5 two: GCN and GAT
    # keep one loop per member (PyG's add_remaining_self_loops), SAGE and GIN read them all
    loops = np.array([[0, 33, 5, 5], [0, 33, 5, 5]])
    looped_np = np.concatenate([edge_index_np, loops], axis=1)
    looped = tg.Graph.from_edge_index(looped_np, num_nodes=34)
    results = {"checks": {}, "checks_with_loops": {}, "train": {}}
    for key, (rel, ei) in {"checks": (graph, edge_index),
                           "checks_with_loops": (looped, torch.from_numpy(looped_np))}.items():
        say("karate club" + (" with self loops" if key == "checks_with_loops" else "") + ":")
        for name in LAYERS:
            diffs = check_layer(name, rel, ei, x)
            results[key][name] = diffs
            text = "; ".join(f"vs {o}: forward {f:.1e}, gradients {g:.1e}"
                             for o, (f, g) in diffs.items())
            say(f"  {name:14s} {text}")
    for name in ("GCN", "GraphSAGE", "GAT", "GIN"):
        r = train(name, graph, club, epochs)
        results["train"][name] = r
        say(f"train {name:14s} loss {r['first_loss']:.3f} -> {r['loss']:.3f}, "
            f"club predicted for {r['accuracy']:.0%} of the members")
    return results


if __name__ == "__main__":
    # one summary line; TIGA_DEMO_VERBOSE=1 also prints each layer's check and training run
    res = main(verbose=os.environ.get("TIGA_DEMO_VERBOSE") == "1")
    worst = max(max(f, g) for key in ("checks", "checks_with_loops")
                for d in res[key].values() for f, g in d.values())
    assert worst < 1e-9, f"a layer differs from its oracle by {worst}"
    trained = ", ".join(f"{k} {r['accuracy']:.0%}" for k, r in res["train"].items())
    compared = sorted({o for d in res["checks"].values() for o in d})
    pyg = ("" if "PyG" in compared else
           "; PyG skipped (torch_geometric not installed)")
    print(f"GNN layers: {len(res['checks'])} of {len(LAYERS)} match "
          f"{' and '.join(compared)} (worst {worst:.0e}){pyg}; "
          f"trained on the karate club: {trained}")
