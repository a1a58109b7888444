"""Example: node classification with a two-layer GCN (tg.nn), trained with torch.

The full loop a GNN user writes: a dataset object (node features, labels, an edge list and
train / validation / test masks), the relation built once as a `tg.Graph` and reused by
every layer and every epoch, a model of `tg.nn` layers, Adam, and model selection on the
validation set. The data is synthetic so that the example needs no download: 600 papers
in 4 topics, citing mostly within their topic (a stochastic block model), each with a
bag-of-words vector that only weakly reveals its topic. The graph is what makes the task
solvable: the same loop with the graph left out (an MLP) is the baseline it must beat.

    .venv/bin/python examples/node_classification.py
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

import tiga as tg


@dataclass
class NodeDataset:
    """One graph with node features, labels and disjoint train / validation / test masks
    (the layout of PyG's Planetoid datasets)."""

    x: torch.Tensor            # (num_nodes, num_features) float32
    y: torch.Tensor            # (num_nodes,) int64 class of each node
    edge_index: torch.Tensor   # (2, num_edges): row 0 cites row 1, both directions stored
    train_mask: torch.Tensor   # (num_nodes,) bool
    val_mask: torch.Tensor
    test_mask: torch.Tensor

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1


def synthetic_citations(num_nodes: int = 600, num_classes: int = 4, num_features: int = 64,
                        p_in: float = 0.03, p_out: float = 0.002,
                        seed: int = 0) -> NodeDataset:
    """A stochastic block model with noisy bag-of-words features; 20 labelled nodes per
    class for training, 100 for validation, the rest for testing."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, num_nodes)
    same = y[:, None] == y[None, :]
    upper = np.triu(rng.random((num_nodes, num_nodes)) < np.where(same, p_in, p_out), k=1)
    src, dst = np.nonzero(upper)
    edge_index = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1)
    # each topic favours 8 of the words a little; every paper also draws 10 random words
    topic_words = rng.permutation(num_features)[:num_classes * 8].reshape(num_classes, 8)
    x = (rng.random((num_nodes, num_features)) < 10 / num_features).astype(np.float32)
    for i in range(num_nodes):
        x[i, rng.choice(topic_words[y[i]], 2)] = 1.0
    order = rng.permutation(num_nodes)
    train = np.concatenate([order[y[order] == c][:20] for c in range(num_classes)])
    rest = np.setdiff1d(order, train)
    rest = rest[rng.permutation(len(rest))]
    masks = [np.zeros(num_nodes, bool) for _ in range(3)]
    for mask, ids in zip(masks, (train, rest[:100], rest[100:])):
        mask[ids] = True
    return NodeDataset(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(edge_index),
                       *(torch.from_numpy(m) for m in masks))


class GCN(nn.Module):
    """Two tg.nn.GCNConv layers with ReLU and dropout between them."""

    def __init__(self, num_features: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = tg.nn.GCNConv(num_features, hidden)
        self.conv2 = tg.nn.GCNConv(hidden, num_classes)

    def forward(self, x: torch.Tensor, graph: tg.Graph) -> torch.Tensor:
        h = torch.relu(self.conv1(x, graph))
        h = nn.functional.dropout(h, p=0.5, training=self.training)
        return self.conv2(h, graph)


class MLP(nn.Module):
    """The baseline: the same widths, no graph."""

    def __init__(self, num_features: int, hidden: int, num_classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Dropout(0.5),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor, graph=None) -> torch.Tensor:
        return self.net(x)


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(dim=1) == y[mask]).float().mean())


def train(model: nn.Module, data: NodeDataset, graph, epochs: int = 100) -> dict:
    """Adam on the training nodes; keeps the weights of the best validation epoch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best = {"val": -1.0}
    for epoch in range(1, epochs + 1):
        model.train()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data.x, graph)[data.train_mask],
                                           data.y[data.train_mask])
        loss.backward()                      # through Tiga's compiled backward kernels
        optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(data.x, graph)
        val = accuracy(logits, data.y, data.val_mask)
        if val > best["val"]:
            best = {"val": val, "test": accuracy(logits, data.y, data.test_mask),
                    "epoch": epoch, "loss": loss.item()}
    return best


def main(verbose: bool = True) -> dict:
    torch.manual_seed(0)
    data = synthetic_citations()
    # the relation, built once: every layer call and every epoch reuses it (and the
    # kernels compiled for it)
    graph = tg.Graph.from_edge_index(data.edge_index, num_nodes=len(data.y))
    gcn = train(GCN(data.x.shape[1], 16, data.num_classes), data, graph)
    mlp = train(MLP(data.x.shape[1], 16, data.num_classes), data, None)
    assert gcn["val"] > mlp["val"] + 0.1, (gcn, mlp)
    assert gcn["test"] > 0.7, gcn
    if verbose:
        print(f"node classification: {len(data.y)} nodes, {graph.num_edges} edges, "
              f"{int(data.train_mask.sum())} labelled; GCN test {gcn['test']:.2f} "
              f"vs MLP (no graph) {mlp['test']:.2f}")
    return {"gcn": gcn, "mlp": mlp}


if __name__ == "__main__":
    main()
