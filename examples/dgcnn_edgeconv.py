"""Example: DGCNN's EdgeConv over a dynamic feature-space kNN, forward and backward.

Each layer rebuilds its relation from the current features (k = 20 nearest neighbours,
self included as in DGCNN) and computes

    x_i' = max_{j in kNN(x_i)} h([x_i, x_j - x_i])

with h a shared MLP. The first layer's kNN is on the 3-D input points (knn-shells: a cell
directory); the next two are on 64-D features (knn-tiled-scan: a register-blocked distance
product with an exact re-check; explain() names it). Gradients reach the MLP weights, the
features and, through `edge.displacement`, the coordinates the kNN was built on.

With torch installed the MLP is an ordinary torch.nn.Sequential captured by `tg.nn.trace`
and torch.autograd runs Tiga's compiled VJP; the check is a dense torch EdgeConv
(torch.cdist + topk + gather + max). Without torch the same layer runs on numpy weights
passed as parameters, differentiated by tg.grad, checked against a dense numpy EdgeConv and
float64 finite differences.

    .venv/bin/python examples/dgcnn_edgeconv.py
"""
from __future__ import annotations

import os

import numpy as np

import tiga as tg

N, K, WIDTH = 512, 20, 64
rng = np.random.default_rng(0)
points = rng.standard_normal((N, 3))


def dense_knn(x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) ids, nearest first, ties by smaller id, self included (float64, every pair)."""
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(len(x)), d2.shape), d2), axis=1)
    return order[:, :k]


def with_torch(torch) -> None:
    from torch import nn

    torch.manual_seed(0)
    mlps = [nn.Sequential(nn.Linear(2 * f, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)).double()
            for f in (3, WIDTH, WIDTH)]

    class EdgeConv(tg.MessagePassing):
        reducer = tg.max()

        def __init__(self, mlp):
            super().__init__()
            self.mlp = tg.nn.trace(mlp)

        def edge(self, src, dst, edge):
            return self.mlp(dst.x, edge.displacement)      # [x_i, x_j - x_i]

    convs = [EdgeConv(m) for m in mlps]
    x0 = torch.tensor(points, requires_grad=True)

    def tiga_net(x):
        for conv in convs:
            graph = tg.Graph.knn(x, K, loop=True)          # rebuilt from this layer's input
            x = conv(graph=graph, dst={"x": x})
        return x

    def dense_net(x):
        for mlp in mlps:
            idx = torch.from_numpy(dense_knn(x.detach().numpy(), K))
            xi = x[:, None, :].expand(-1, K, -1)
            x = mlp(torch.cat((xi, x[idx] - xi), dim=-1)).amax(dim=1)
        return x

    params = [x0, *(p for m in mlps for p in m.parameters())]
    out = tiga_net(x0)
    grads = torch.autograd.grad(out.square().mean(), params)
    want = dense_net(x0)
    want_grads = torch.autograd.grad(want.square().mean(), params)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got, ref, rtol=1e-7, atol=1e-9)
    feats = tiga_net(x0).detach()
    report = convs[-1].explain(graph=tg.Graph.knn(feats, K, loop=True), dst={"x": feats})
    if os.environ.get("TIGA_DEMO_VERBOSE") == "1":
        print(report)
    print(f"EdgeConv x3 (k={K}, {WIDTH}-D kNN), torch: forward and the gradients of all "
          f"{len(params)} inputs and weights match dense torch ({report.route})")


def relu_mlp(z, w1, b1, w2, b2, xp):
    return xp.maximum(z @ w1 + b1, 0.0) @ w2 + b2


def with_numpy() -> None:
    class EdgeConv(tg.MessagePassing):
        reducer = tg.max()

        def edge(self, src, dst, edge, w1, b1, w2, b2):
            z = tg.math.concatenate([dst.x, edge.displacement], axis=-1)
            return tg.math.matmul(tg.math.relu(tg.math.matmul(z, w1) + b1), w2) + b2

    def init(f):
        return [rng.standard_normal((2 * f, WIDTH)) / np.sqrt(2 * f), np.zeros(WIDTH),
                rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH), np.zeros(WIDTH)]

    weights = [init(f) for f in (3, WIDTH, WIDTH)]
    conv = EdgeConv()

    def net(x, *flat):
        for i in range(3):
            graph = tg.Graph.knn(x, K, loop=True)
            w1, b1, w2, b2 = flat[4 * i:4 * i + 4]
            x = conv(graph=graph, dst={"x": x}, w1=w1, b1=b1, w2=w2, b2=b2)
        return x

    def loss(x, *flat):
        return tg.math.mean(net(x, *flat) ** 2)

    def dense_loss(x, flat):
        for i in range(3):
            idx = dense_knn(x, K)
            z = np.concatenate([np.repeat(x[:, None], K, 1), x[idx] - x[:, None]], -1)
            x = relu_mlp(z, *flat[4 * i:4 * i + 4], np) .max(axis=1)
        return float(np.mean(x ** 2))

    flat = [a for w in weights for a in w]
    value, grads = tg.value_and_grad(loss, argnums=tuple(range(13)))(points, *flat)
    assert abs(float(np.asarray(value)) - dense_loss(points, flat)) < 1e-9
    args = [points, *flat]
    picks = np.random.default_rng(1)
    for _ in range(12):    # central differences on random entries (topology fixed)
        a = int(picks.integers(0, 13))
        i = tuple(int(picks.integers(0, s)) for s in args[a].shape)
        plus, minus = [v.copy() for v in args], [v.copy() for v in args]
        plus[a][i] += 1e-6
        minus[a][i] -= 1e-6
        fd = (dense_loss(plus[0], plus[1:]) - dense_loss(minus[0], minus[1:])) / 2e-6
        assert abs(float(np.asarray(grads[a])[i]) - fd) <= 1e-5 * max(1.0, abs(fd)), (a, i)
    print(f"EdgeConv x3 (k={K}, {WIDTH}-D kNN), numpy: forward matches dense numpy, "
          "gradients match finite differences")


if __name__ == "__main__":
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        with_torch(torch)
    else:
        print("EdgeConv x3, torch: skipped (torch not installed)")
    with_numpy()
