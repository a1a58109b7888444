"""Example: GCN, GraphSAGE (mean), GAT (1 and 2 heads) and GIN layers written with Tiga.

Each layer is an ordinary torch.nn.Module: the dense projections (Linear layers, attention
vectors) stay in torch, and only the aggregation over the relation runs in Tiga, as a
MessagePassing call on torch tensors (so torch.autograd runs Tiga's compiled VJP). GIN
shows the other style: its MLP is captured with tg.nn.trace and runs inside Tiga's
`update` function. Parameter names follow PyG's layers, so `pyg_layer.load_state_dict(
layer.state_dict())` copies the weights.

Every layer is checked, forward and gradients (input and every parameter), against a dense
torch formula written independently here, and against PyG's own GCNConv / SAGEConv / GATConv
/ GINConv when torch_geometric is installed. Then a two-layer model of each kind is trained
on Zachary's karate club (34 members, 78 friendships, the club each member joined).

    .venv/bin/python examples/gnn_layers.py
"""
from __future__ import annotations

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


# ---- the aggregations (Tiga) ---------------------------------------------------------------

class WeightedSum(tg.MessagePassing):
    """GCN: sum over incoming edges of norm(j -> i) * h_j."""
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.h * edge.norm


class Mean(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return src.x


class Attention(tg.MessagePassing):
    """GAT: softmax over incoming edges of leaky_relu(a_src[j] + a_dst[i]), per head,
    weighting h_j; the online_softmax reducer never stores the per-edge weights."""
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge):
        score = tg.math.leaky_relu(src.a_src + dst.a_dst, 0.2)   # (heads,)
        return self.reducer(score, src.h)                         # value (heads, channels)


class GINAggregate(tg.MessagePassing):
    """GIN: mlp((1 + eps) x_i + sum_j x_j), the MLP evaluated inside Tiga's update."""
    reducer = tg.sum()

    def __init__(self, mlp: nn.Module, eps: float):
        super().__init__()
        self.mlp, self.eps = tg.nn.trace(mlp), eps

    def edge(self, src, dst, edge):
        return src.x

    def update(self, dst, aggregated):
        return self.mlp(dst.x * (1.0 + self.eps) + aggregated)


# ---- the layers (torch modules) ------------------------------------------------------------

class GCN(nn.Module):
    """PyG's GCNConv: D^-1/2 (A + I) D^-1/2 (x W^T) + b, D the in-degree of A + I."""

    def __init__(self, graph: tg.Graph, n_in: int, n_out: int):
        super().__init__()
        self.graph = graph.with_self_loops()
        self.register_buffer("norm", torch.from_numpy(self.graph.gcn_norm()),
                             persistent=False)
        self.lin = nn.Linear(n_in, n_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.aggregate = WeightedSum()

    def forward(self, x):
        h = self.lin(x)
        norm = self.norm.to(h.dtype)
        return self.aggregate(graph=self.graph, src={"h": h}, edge={"norm": norm}) + self.bias


class SAGE(nn.Module):
    """PyG's SAGEConv (mean): lin_l(mean_j x_j) + lin_r(x_i)."""

    def __init__(self, graph: tg.Graph, n_in: int, n_out: int):
        super().__init__()
        self.graph = graph
        self.lin_l = nn.Linear(n_in, n_out)
        self.lin_r = nn.Linear(n_in, n_out, bias=False)
        self.aggregate = Mean()

    def forward(self, x):
        return self.lin_l(self.aggregate(graph=self.graph, src={"x": x})) + self.lin_r(x)


class GAT(nn.Module):
    """PyG's GATConv (heads concatenated, self loops added, slope 0.2, no dropout)."""

    def __init__(self, graph: tg.Graph, n_in: int, n_out: int, heads: int = 1):
        super().__init__()
        self.graph, self.heads, self.n_out = graph.with_self_loops(), heads, n_out
        self.lin = nn.Linear(n_in, heads * n_out, bias=False)
        self.att_src = nn.Parameter(torch.randn(1, heads, n_out) * 0.3)
        self.att_dst = nn.Parameter(torch.randn(1, heads, n_out) * 0.3)
        self.bias = nn.Parameter(torch.zeros(heads * n_out))
        self.aggregate = Attention()

    def forward(self, x):
        h = self.lin(x).view(-1, self.heads, self.n_out)
        a_src = (h * self.att_src).sum(-1)
        a_dst = (h * self.att_dst).sum(-1)
        out = self.aggregate(graph=self.graph, src={"h": h, "a_src": a_src},
                             dst={"a_dst": a_dst})
        return out.reshape(-1, self.heads * self.n_out) + self.bias


class GIN(nn.Module):
    """PyG's GINConv with a fixed eps: nn((1 + eps) x_i + sum_j x_j)."""

    def __init__(self, graph: tg.Graph, n_in: int, n_out: int, eps: float = 0.1):
        super().__init__()
        self.graph = graph
        self.nn = nn.Sequential(nn.Linear(n_in, n_out), nn.ReLU(), nn.Linear(n_out, n_out))
        # float64, so that the buffer (read by the oracles) holds the same eps as the float
        # the aggregation uses
        self.register_buffer("eps", torch.tensor([eps], dtype=torch.float64))
        self.aggregate = GINAggregate(self.nn, eps)

    def forward(self, x):
        return self.aggregate(graph=self.graph, src={"x": x}, dst={"x": x})


LAYERS = {
    "GCN": lambda g, i, o: GCN(g, i, o),
    "GraphSAGE": lambda g, i, o: SAGE(g, i, o),
    "GAT (1 head)": lambda g, i, o: GAT(g, i, o, heads=1),
    "GAT (2 heads)": lambda g, i, o: GAT(g, i, o, heads=2),
    "GIN": lambda g, i, o: GIN(g, i, o),
}


# ---- oracles: dense torch formulas, and PyG --------------------------------------------------

def dense_reference(layer: nn.Module, x, adj):
    """The layer's formula on a dense adjacency adj[i, j] = edges j -> i (torch only)."""
    if isinstance(layer, GCN):
        a = adj + torch.eye(len(adj), dtype=adj.dtype)
        d = a.sum(1).rsqrt()
        return (d[:, None] * a * d[None, :]) @ layer.lin(x) + layer.bias
    if isinstance(layer, SAGE):
        mean = adj @ x / adj.sum(1, keepdim=True).clamp(min=1)
        return layer.lin_l(mean) + layer.lin_r(x)
    if isinstance(layer, GAT):
        mask = (adj + torch.eye(len(adj), dtype=adj.dtype)) > 0
        h = layer.lin(x).view(-1, layer.heads, layer.n_out)
        a_src, a_dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
        e = torch.nn.functional.leaky_relu(a_dst.T[:, :, None] + a_src.T[:, None, :], 0.2)
        alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)   # (H, i, j)
        out = torch.einsum("hij,jhc->ihc", alpha, h)
        return out.reshape(len(x), -1) + layer.bias
    return layer.nn((1 + layer.eps) * x + adj @ x)


def pyg_layer(name: str, layer: nn.Module):
    """PyG's own layer with `layer`'s weights, or None without torch_geometric."""
    try:
        import torch_geometric.nn as pyg
    except ImportError:
        return None
    n_in = layer.nn[0].in_features if isinstance(layer, GIN) else \
        (layer.lin_l if isinstance(layer, SAGE) else layer.lin).in_features
    if isinstance(layer, GCN):
        conv = pyg.GCNConv(n_in, layer.bias.numel())
    elif isinstance(layer, SAGE):
        conv = pyg.SAGEConv(n_in, layer.lin_l.out_features, aggr="mean")
    elif isinstance(layer, GAT):
        conv = pyg.GATConv(n_in, layer.n_out, heads=layer.heads)
    else:
        conv = pyg.GINConv(nn.Sequential(nn.Linear(n_in, layer.nn[0].out_features),
                                         nn.ReLU(), nn.Linear(layer.nn[2].in_features,
                                                              layer.nn[2].out_features)),
                           eps=float(layer.eps))
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
    layer = LAYERS[name](graph, x.shape[1], 4).double()
    with torch.no_grad():   # non-zero biases, so that their gradients mean something
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    adj = torch.zeros(len(x), len(x), dtype=x.dtype)
    adj.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1],
                                                              dtype=x.dtype), accumulate=True)
    params = list(layer.parameters())
    cot = torch.randn(layer(x).shape, dtype=x.dtype)
    got = _value_and_grads(layer, x, params, cot)
    oracles = {"dense torch": _value_and_grads(lambda v: dense_reference(layer, v, adj), x,
                                               params, cot)}
    conv = pyg_layer(name, layer)
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
    def __init__(self, name: str, graph: tg.Graph, n_in: int, hidden: int, n_out: int):
        super().__init__()
        if name.startswith("GAT"):   # two heads concatenated, then one head for the logits
            self.first = GAT(graph, n_in, hidden // 2, heads=2)
            self.second = GAT(graph, hidden, n_out, heads=1)
        else:
            self.first = LAYERS[name](graph, n_in, hidden)
            self.second = LAYERS[name](graph, hidden, n_out)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def train(name: str, graph: tg.Graph, club: np.ndarray, epochs: int = 100) -> dict:
    """Semi-supervised: only the two leaders (members 0 and 33) are labelled."""
    torch.manual_seed(0)
    x = torch.eye(34)   # one-hot member features, as in PyG's KarateClub
    y = torch.from_numpy(club)
    labelled = torch.tensor([0, 33])
    model = TwoLayer(name, graph, 34, 16, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    first_loss = None
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x)[labelled], y[labelled])
        loss.backward()
        opt.step()
        first_loss = float(loss.detach()) if first_loss is None else first_loss
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).double().mean())
    return {"first_loss": first_loss, "loss": float(loss.detach()), "accuracy": accuracy}


def main(epochs: int = 100, verbose: bool = True) -> dict:
    edge_index_np, club = karate_club()
    graph = tg.Graph.from_edge_index(edge_index_np, num_nodes=34)
    edge_index = torch.from_numpy(edge_index_np)
    x = torch.randn(34, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    say = print if verbose else (lambda *a: None)
    say(f"karate club: {graph.num_dst} members, {graph.num_edges // 2} friendships")
    results = {"checks": {}, "train": {}}
    for name in LAYERS:
        diffs = check_layer(name, graph, edge_index, x)
        results["checks"][name] = diffs
        text = "; ".join(f"vs {o}: forward {f:.1e}, gradients {g:.1e}"
                         for o, (f, g) in diffs.items())
        say(f"{name:14s} {text}")
    for name in ("GCN", "GraphSAGE", "GAT", "GIN"):
        r = train(name, graph, club, epochs)
        results["train"][name] = r
        say(f"train {name:14s} loss {r['first_loss']:.3f} -> {r['loss']:.3f}, "
            f"club predicted for {r['accuracy']:.0%} of the members")
    return results


if __name__ == "__main__":
    res = main()
    worst = max(max(f, g) for d in res["checks"].values() for f, g in d.values())
    assert worst < 1e-9, f"a layer differs from its oracle by {worst}"
    print("all layers match their oracles (float64)")
