"""EdgeNN with MLPs deeper than Linear-act-Linear (middle Linears evaluated per edge inside
the fused forward and VJP kernels: vector multiply-adds, split partial sums, transposed
weight copies, flat weight-gradient folds).

Oracle: the same torch module applied by torch to an explicit edge list (gather -> MLP ->
index_add / scatter_reduce) with torch's autograd; torch.autograd.gradcheck (float64 finite
differences) away from the ReLU kinks.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tiga as tg  # noqa: E402

N, F = 30, 5


def relation(seed=0, n=N, degree=4):
    """A random CSR relation with an empty row, duplicate edges and self edges."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 2 * degree, n)
    deg[3] = 0
    row_ptr = np.concatenate([[0], np.cumsum(deg)])
    col = rng.integers(0, n, int(deg.sum()))
    graph = tg.Graph.from_csr(row_ptr, col, num_src=n)
    dst = np.repeat(np.arange(n), deg)
    return graph, torch.as_tensor(col), torch.as_tensor(dst)


def deep_mlp(width_in, hidden, out, depth, dtype=torch.float32):
    layers = [nn.Linear(width_in, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, out)).to(dtype)


def torch_reduce(msg, dst, name, n=N):
    if name == "sum":
        return torch.zeros(n, msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)
    mode = {"max": "amax", "mean": "mean"}[name]
    return torch.zeros(n, msg.shape[1], dtype=msg.dtype).scatter_reduce(
        0, dst[:, None].expand_as(msg), msg, mode, include_self=False)


def layer_for(module, reducer):
    traced = tg.nn.trace(module)

    class Layer(tg.MessagePassing):
        def edge(self, s, d, e):
            return traced(s.pos - d.pos, s.x)

    Layer.reducer = getattr(tg, reducer)()
    return Layer()


def inputs(dtype=torch.float32, seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, dtype=dtype, generator=g).requires_grad_()
    x = torch.randn(n, F, dtype=dtype, generator=g).requires_grad_()
    return pos, x


@pytest.mark.parametrize("depth,hidden,reducer", [
    (2, 32, "sum"), (3, 32, "sum"), (2, 16, "sum"), (3, 7, "sum"),
    (2, 32, "max"), (3, 16, "mean"), (4, 8, "sum")])
def test_deep_mlp_matches_torch_forward_and_gradients(depth, hidden, reducer):
    torch.manual_seed(depth * 100 + hidden)
    module = deep_mlp(3 + F, hidden, 3, depth)
    graph, src, dst = relation(depth)
    pos, x = inputs(seed=hidden)
    layer = layer_for(module, reducer)
    call = dict(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos})
    y = layer(**call)
    ref = torch_reduce(module(torch.cat((pos[src] - pos[dst], x[src]), -1)), dst, reducer)
    torch.testing.assert_close(y, ref, rtol=2e-5, atol=2e-5)
    variables = (pos, x, *module.parameters())
    ct = torch.randn_like(ref)
    for g, w in zip(torch.autograd.grad(y, variables, ct),
                    torch.autograd.grad(ref, variables, ct)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert "cpu-llvm" in str(layer.explain(**call)).splitlines()[0]


def _pre_activations(module, inp):
    """Every ReLU's input for the edge inputs `inp`."""
    out, h = [], inp
    for m in module:
        h = m(h)
        if isinstance(m, nn.Linear):
            out.append(h)
    return out[:-1]


@pytest.mark.parametrize("depth", [2, 3])
def test_gradcheck_deep_relu_edge_nn_float64(depth):
    graph, src, dst = relation(7, degree=2)
    for seed in range(500):
        torch.manual_seed(seed)
        module = deep_mlp(3 + F, 6, 2, depth, torch.float64)
        pos, x = inputs(torch.float64, seed)
        with torch.no_grad():
            pre = _pre_activations(module, torch.cat((pos[src] - pos[dst], x[src]), -1))
        if all(bool((p.abs() > 1e-3).all()) for p in pre):
            break
    else:
        raise AssertionError("no seed keeps the ReLU pre-activations away from 0")
    layer = layer_for(module, "sum")

    def f(pos, x, *params):
        # gradcheck perturbs the parameters' storage in place, so the live module sees it
        return layer(graph=graph, src={"pos": pos, "x": x}, dst={"pos": pos})

    assert torch.autograd.gradcheck(f, (pos, x, *module.parameters()), eps=1e-6, atol=1e-5,
                                    rtol=1e-4)


@pytest.mark.parametrize("depth", [2, 3])
def test_deep_mlp_over_radius_displacement_matches_torch(depth):
    """The benchmark's form: a symmetric radius relation (its VJP walks the relation once
    for the destination and source cotangents) and edge.displacement."""
    torch.manual_seed(depth)
    g = torch.Generator().manual_seed(depth)
    n = 60
    pos = torch.rand(n, 3, generator=g).requires_grad_()
    x = torch.randn(n, F, generator=g).requires_grad_()
    module = deep_mlp(3 + F, 32, 3, depth)
    traced = tg.nn.trace(module)

    class DisplacementNN(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return traced(edge.displacement, src.x)

    cutoff = 0.3
    y = DisplacementNN()(graph=tg.Graph.radius(pos, cutoff=cutoff), src={"x": x})
    mask = (torch.cdist(pos, pos) <= cutoff) & ~torch.eye(n, dtype=torch.bool)
    dst, src = mask.nonzero(as_tuple=True)
    ref = torch_reduce(module(torch.cat((pos[src] - pos[dst], x[src]), -1)), dst, "sum", n=n)
    torch.testing.assert_close(y, ref, rtol=2e-5, atol=2e-5)
    variables = (pos, x, *module.parameters())
    ct = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(y, variables, ct),
                         torch.autograd.grad(ref, variables, ct)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
