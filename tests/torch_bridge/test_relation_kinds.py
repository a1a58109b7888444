"""torch.autograd through Tiga's compiled VJP on every relation kind, with an MLP edge
function and several reducers.

Oracle: the relation's own CSR (resolve_csr) as an explicit edge list, torch's
scatter_reduce/index_add with torch autograd, and torch.autograd.gradcheck (float64 finite
differences).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tiga as tg  # noqa: E402

GRAPHS = {
    "csr": lambda: tg.Graph.from_csr(np.array([0, 2, 2, 5, 6]), np.array([1, 4, 0, 0, 3, 2]),
                                     num_src=5),
    "coo": lambda: tg.Graph.from_coo(np.array([3, 0, 1, 1, 4]), np.array([2, 0, 1, 0, 2]),
                                     num_src=5, num_dst=4),
    "dense": lambda: tg.Graph.dense(5, 4),
    "triangular": lambda: tg.Graph.triangular(5),
    "cu_seqlens": lambda: tg.Graph.cu_seqlens(np.array([0, 2, 5]), causal=True),
    "cat": lambda: tg.Graph.cat([tg.Graph.dense(2, 2), tg.Graph.triangular(3)]),
    "stencil": lambda: tg.Graph.stencil((2, 3), [(0, 1), (1, 0), (0, -1)], periodic=True),
}


def edge_list(graph):
    """(src, dst) per edge in the user's edge order."""
    row_ptr, col = (np.asarray(a) for a in graph.resolve_csr())
    dst = np.repeat(np.arange(graph.num_dst), np.diff(row_ptr))
    perm = graph.edge_perm
    if perm is not None:  # CSR position p holds user edge perm[p]
        order = np.empty_like(np.asarray(perm))
        order[np.asarray(perm)] = np.arange(len(order))
        col, dst = col[order], dst[order]
    return torch.tensor(col, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)


def reference(module, x, h, a, src, dst, num_dst, reducer):
    msg = module(torch.cat((x[src] - h[dst], x[src] * a), -1))
    if reducer == "sum":
        return torch.zeros(num_dst, msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)
    mode = {"mean": "mean", "max": "amax"}[reducer]
    return torch.zeros(num_dst, msg.shape[1], dtype=msg.dtype).scatter_reduce(
        0, dst[:, None].expand_as(msg), msg, mode, include_self=False)


@pytest.mark.parametrize("kind", sorted(GRAPHS))
@pytest.mark.parametrize("reducer", ["sum", "mean", "max"])
def test_mlp_edge_function_on_every_relation_kind(kind, reducer):
    graph = GRAPHS[kind]()
    src, dst = edge_list(graph)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    traced = tg.nn.trace(module)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(graph.num_src, 2, dtype=torch.float64, generator=g, requires_grad=True)
    h = torch.randn(graph.num_dst, 2, dtype=torch.float64, generator=g, requires_grad=True)
    a = torch.randn(graph.num_edges, 2, dtype=torch.float64, generator=g, requires_grad=True)

    def edge(s, d, e):
        return traced(s.x - d.h, s.x * e.a)

    def f(x, h, a, *params):
        return tg.propagate(graph, edge, getattr(tg, reducer)(), src={"x": x}, dst={"h": h},
                            edge={"a": a})

    y = f(x, h, a)
    torch.testing.assert_close(y, reference(module, x, h, a, src, dst, graph.num_dst,
                                            reducer))
    # max: tanh keeps messages distinct, so no tie moves under the 1e-6 perturbations
    assert torch.autograd.gradcheck(f, (x, h, a, *module.parameters()), eps=1e-6,
                                    atol=1e-6, rtol=1e-5)
