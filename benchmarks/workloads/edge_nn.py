"""EdgeNN, the report's Bunny-like study on CPU: an MLP on every edge of a radius relation
over a noisy torus point cloud, summed into each point; forward, and a training step."""
from __future__ import annotations

import numpy as np

from . import Peer, Workload
from . import _common as C

N_POINTS, RADIUS, HIDDEN, OUT = 35_947, 0.013, 32, 3
WIDTHS = (8, 32)
TEXT = (f"{N_POINTS:,} points on a noisy torus (R = 1, r = 0.35) scaled into the unit box, "
        f"radius-{RADIUS} relation (about 10 neighbours, no self edge), node features of "
        f"the given width; message MLP [p_j - p_i; x_j] -> {HIDDEN} ReLU -> {OUT}, summed "
        "into each point. `step`: loss = mean((y - p)^2), gradients of the positions, the "
        "features and every MLP parameter by torch autograd. Size = feature width.")


def torus_points(n: int = N_POINTS) -> np.ndarray:
    """Area-uniform samples of a torus (R=1, r=0.35) plus small noise, scaled into [0, 1]^3."""
    rng = np.random.default_rng(C.SEED)
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


def setup(width: int) -> dict:
    """Points, features, the radius edge list (cKDTree: the peers' prebuilt relation) and the
    MLP parameters (uniform +-1/sqrt(fan_in), like torch.nn.Linear's default)."""
    from scipy.spatial import cKDTree

    pos = torus_points()
    pairs = cKDTree(pos).query_pairs(RADIUS, output_type="ndarray")
    src = np.concatenate([pairs[:, 0], pairs[:, 1]])
    dst = np.concatenate([pairs[:, 1], pairs[:, 0]])
    order = np.lexsort((src, dst))
    rng = np.random.default_rng(C.SEED + 1)
    params = []
    for fan_in, fan_out in ((3 + width, HIDDEN), (HIDDEN, OUT)):
        b = fan_in ** -0.5
        params += [rng.uniform(-b, b, (fan_out, fan_in)).astype(np.float32),
                   rng.uniform(-b, b, fan_out).astype(np.float32)]
    return {"pos": pos, "x": rng.standard_normal((len(pos), width), dtype=np.float32),
            "src": src[order].astype(np.int64), "dst": dst[order].astype(np.int64),
            "params": params}


def _mlp(torch, d: dict, dtype):
    w1, b1, w2, b2 = (torch.from_numpy(p).to(dtype) for p in d["params"])
    mlp = torch.nn.Sequential(torch.nn.Linear(w1.shape[1], HIDDEN), torch.nn.ReLU(),
                              torch.nn.Linear(HIDDEN, OUT)).to(dtype)
    with torch.no_grad():
        for p, v in zip(mlp.parameters(), (w1, b1, w2, b2)):
            p.copy_(v)
    return mlp


def _eager(torch, d: dict, mlp):
    src, dst = torch.from_numpy(d["src"]), torch.from_numpy(d["dst"])
    n = len(d["pos"])

    def forward(pos, x):
        msg = mlp(torch.cat((pos[src] - pos[dst], x[src]), dim=-1))
        return torch.zeros(n, OUT, dtype=msg.dtype).index_add(0, dst, msg)
    return forward


def expected(grad: bool):
    def oracle(d: dict, i: int) -> list:
        """float64 torch eager (same formula, every intermediate in float64)."""
        import torch

        mlp = _mlp(torch, d, torch.float64)
        pos = torch.from_numpy(d["pos"]).double().requires_grad_(grad)
        x = torch.from_numpy(d["x"]).double().requires_grad_(grad)
        y = _eager(torch, d, mlp)(pos, x)
        if not grad:
            return [y.detach().numpy()]
        loss = (y - torch.from_numpy(d["pos"]).double()).square().mean()
        return [g.numpy() for g in torch.autograd.grad(loss, [pos, x, *mlp.parameters()])]
    return oracle


def _peer(build, grad: bool):
    """fwd(i) under no_grad, or step(i): zero grads, loss, backward, return every gradient."""
    def factory(d: dict, threads: int):
        torch = C.torch_threads(threads)
        mlp = _mlp(torch, d, torch.float32)
        forward = build(torch, d, mlp)
        pos = torch.from_numpy(d["pos"]).requires_grad_(grad)
        x = torch.from_numpy(d["x"]).requires_grad_(grad)
        leaves, target = [pos, x, *mlp.parameters()], torch.from_numpy(d["pos"])

        def fwd(i):
            with torch.no_grad():
                return forward(pos, x)

        def step(i):
            for t in leaves:
                t.grad = None
            (forward(pos, x) - target).square().mean().backward()
            return [t.grad for t in leaves]
        return step if grad else fwd
    return factory


def _compiled(torch, d, mlp):
    return torch.compile(_eager(torch, d, mlp), dynamic=False)


def _pyg(torch, d, mlp):
    from torch_geometric.nn import MessagePassing

    class EdgeNN(MessagePassing):
        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, pos, x, edge_index):
            return self.propagate(edge_index, pos=pos, x=x)

        def message(self, pos_i, pos_j, x_j):
            return mlp(torch.cat((pos_j - pos_i, x_j), dim=-1))

    edge_index = torch.stack([torch.from_numpy(d["src"]), torch.from_numpy(d["dst"])])
    layer = EdgeNN()
    return lambda pos, x: layer(pos, x, edge_index)


def _tiga(torch, d, mlp):
    """The report's form: tg.Graph.radius on the torch positions, edge.displacement. The
    neighbour search runs once per positions tensor (outside the timed calls, like the peers'
    prebuilt edge lists); gradients reach the positions through the displacement."""
    import tiga as tg

    class EdgeNN(tg.MessagePassing):
        reducer = tg.sum()

        def __init__(self, module):
            super().__init__()
            self.mlp = tg.nn.trace(module)

        def edge(self, src, dst, edge):
            return self.mlp(edge.displacement, src.x)

    program, graphs = EdgeNN(mlp), {}

    def forward(pos, x):
        hit = graphs.get(id(pos))
        if hit is None or hit[0] is not pos:
            hit = graphs[id(pos)] = (pos, tg.Graph.radius(pos, cutoff=RADIUS))
        return program(graph=hit[1], src={"x": x})
    return forward


def _peers(grad: bool) -> dict:
    return {
        "torch eager": Peer(_peer(_eager, grad), ("torch",),
                            note="gather, cat, nn.Sequential, index_add"),
        "torch.compile": Peer(_peer(_compiled, grad), ("torch",),
                              note="torch.compile(dynamic=False) of the eager function"),
        "pyg": Peer(_peer(_pyg, grad), ("torch_geometric",),
                    note="MessagePassing(aggr='sum'), message = MLP"),
        "tiga": Peer(_peer(_tiga, grad), ("torch",), tiga=True,
                     note="tg.MessagePassing, tg.nn.trace(MLP), Graph.radius"),
    }


WORKLOADS = [
    Workload("edge_nn.fwd", "EdgeNN forward", TEXT, WIDTHS, setup, expected(False),
             _peers(False), size_label="width"),
    Workload("edge_nn.step", "EdgeNN training step (forward + backward)", TEXT, WIDTHS, setup,
             expected(True), _peers(True), size_label="width",
             # the position and feature gradients are sums with heavy cancellation: every
             # float32 peer (torch eager included) lands about 1e-3 from float64 there
             tol_scale=50.0),
]
