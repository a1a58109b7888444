"""tg.edge_map (per-edge values in the relation's edge order, API.md section 4) and
`radius(cutoff=inf)`: messages, neighbour distances and GAT-style attention weights, against
numpy, torch / PyG and float64 central finite differences, on the reference interpreter and
cpu-llvm (strict)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tiga as tg


@pytest.fixture
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


def _central_fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def _coo(rng, num_src=5, num_dst=4, num_edges=9):
    src = rng.integers(0, num_src, num_edges)
    dst = rng.integers(0, num_dst - 1, num_edges)     # the last destination has no edges
    src[-1], dst[-1] = src[0], dst[0]                  # a duplicate edge
    return src, dst, tg.Graph.from_coo(src, dst, num_src=num_src, num_dst=num_dst)


class Message(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, scale):
        return src.x * edge.w + dst.h * scale


def test_messages_in_the_users_edge_order(strict):
    rng = np.random.default_rng(0)
    src, dst, g = _coo(rng)
    x, h = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    w = rng.normal(size=(9, 1))
    want = x[src] * w + h[dst] * 0.5
    got = tg.edge_map(g, Message().edge, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.5)
    assert got.shape == (9, 3)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-14)
    # summing the per-edge values per destination is the propagate itself
    y = Message()(graph=g, src={"x": x}, dst={"h": h}, edge={"w": w}, scale=0.5)
    np.testing.assert_allclose(np.asarray(y), np.stack(
        [want[dst == d].sum(0) for d in range(4)]), rtol=1e-12, atol=1e-14)


def test_edge_map_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    src, dst, g = _coo(rng)
    h = rng.normal(size=(4, 2))
    weights = rng.normal(size=(9, 2))

    def f(x, w):
        e = tg.edge_map(g, lambda s, d, e: tg.math.tanh(s.x * e.w) * d.h, src={"x": x},
                        dst={"h": h}, edge={"w": w})
        return (e * weights).sum()

    x, w = rng.normal(size=(5, 2)), rng.normal(size=(9, 2))
    dx, dw = tg.grad(f, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(dx), _central_fd(lambda v: float(np.asarray(
        f(v, w))), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(dw), _central_fd(lambda v: float(np.asarray(
        f(x, v))), w), rtol=1e-6, atol=1e-8)


def test_bad_keyword_is_named():
    g = tg.Graph.from_csr(np.array([0, 1]), np.array([0]), num_src=1)
    with pytest.raises(tg.TigaError, match="egde: unexpected keyword argument of tg.edge_map"):
        tg.edge_map(g, lambda s, d, e: s.x, src={"x": np.ones(1)}, egde={"w": np.ones(1)})


@pytest.mark.parametrize("cutoff", [0.9, math.inf])
def test_neighbour_distances_over_radius(strict, cutoff):
    rng = np.random.default_rng(2)
    pos = rng.uniform(-1, 1, (30, 3))
    g = tg.Graph.radius(pos, cutoff)
    row_ptr, col_idx = g.resolve_csr()
    dst = np.repeat(np.arange(30), np.diff(row_ptr))
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    want_pairs = {(i, j) for i in range(30) for j in range(30) if i != j and d[i, j] <= cutoff}
    assert set(zip(dst.tolist(), col_idx.tolist())) == want_pairs
    got = tg.edge_map(g, lambda s, d, e: e.distance)
    np.testing.assert_allclose(np.asarray(got), d[dst, col_idx], rtol=1e-14)

    def f(p):
        gg = tg.Graph.radius(p, cutoff)
        return (tg.propagate(gg, lambda s, d, e: e.distance ** 3, tg.sum()) ** 2).sum()

    def ref(p):
        dd = np.linalg.norm(p[:, None] - p[None], axis=-1)
        keep = np.zeros_like(dd, bool)
        keep[dst, col_idx] = True      # the topology is held fixed (not differentiated)
        return float(((np.where(keep, dd, 0.0) ** 3).sum(1) ** 2).sum())

    np.testing.assert_allclose(np.asarray(tg.grad(f)(pos)), _central_fd(ref, pos), rtol=1e-5)


def test_radius_cutoff_inf_with_a_query_reads_every_point():
    pos = np.array([[0.0, 0.0], [1e30, 0.0], [0.0, -1e30]])
    g = tg.Graph.radius(pos, math.inf, query=np.array([[5.0, 5.0], [-1e300, 1e300]]))
    row_ptr, col_idx = g.resolve_csr()
    assert row_ptr.tolist() == [0, 3, 6] and col_idx.tolist() == [0, 1, 2, 0, 1, 2]
    with pytest.raises(tg.GraphValidationError, match=r"cutoff: is nan, expected a positive"):
        tg.Graph.radius(pos, math.nan)


def _attention(g, h, a_src, a_dst):
    """GAT attention weights: a softmax per destination over edge_map scores."""
    def leaky_relu(s, d, e):
        z = s.h @ a_src + d.h @ a_dst
        return tg.math.maximum(z, 0.2 * z)

    score = tg.edge_map(g, leaky_relu, src={"h": h}, dst={"h": h})
    top = tg.propagate(g, lambda s, d, e: e.score, tg.max(), edge={"score": score})
    p = tg.edge_map(g, lambda s, d, e: tg.math.exp(e.score - d.top), dst={"top": top},
                    edge={"score": score})
    mass = tg.propagate(g, lambda s, d, e: e.p, tg.sum(), edge={"p": p})
    return tg.edge_map(g, lambda s, d, e: e.p / d.mass, dst={"mass": mass}, edge={"p": p})


def test_gat_attention_weights_match_pyg_softmax(strict):
    torch = pytest.importorskip("torch")
    pyg_utils = pytest.importorskip("torch_geometric.utils")
    rng = np.random.default_rng(3)
    src, dst, g = _coo(rng, 6, 6, 14)
    h = rng.normal(size=(6, 4))
    a_src, a_dst = rng.normal(size=4), rng.normal(size=4)
    alpha = np.asarray(_attention(g, h, a_src, a_dst))

    th = torch.tensor(h, requires_grad=True)
    ei = torch.tensor(np.stack([src, dst]))
    raw = th[ei[0]] @ torch.tensor(a_src) + th[ei[1]] @ torch.tensor(a_dst)
    want = pyg_utils.softmax(torch.nn.functional.leaky_relu(raw, 0.2), ei[1], num_nodes=6)
    np.testing.assert_allclose(alpha, want.detach().numpy(), rtol=1e-12)
    # gradients of a weighted sum of the weights, against torch autograd
    c = rng.normal(size=14)
    (want * torch.tensor(c)).sum().backward()
    dh = tg.grad(lambda v: (_attention(g, v, a_src, a_dst) * c).sum())(h)
    np.testing.assert_allclose(np.asarray(dh), th.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_edge_map_on_torch_tensors_is_differentiable():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    src, dst, g = _coo(rng)
    x = torch.tensor(rng.normal(size=(5, 2)), requires_grad=True)
    w = torch.tensor(rng.normal(size=(9, 2)), requires_grad=True)
    e = tg.edge_map(g, lambda s, d, e: s.x * e.w, src={"x": x}, edge={"w": w})
    assert isinstance(e, torch.Tensor) and tuple(e.shape) == (9, 2)
    (e ** 2).sum().backward()
    xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ((xs[torch.tensor(src)] * ws) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, xs.grad)
    torch.testing.assert_close(w.grad, ws.grad)
