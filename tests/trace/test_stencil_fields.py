"""Stencil relations: the documented edge order (destination-major over C-ordered points,
then offsets in order, missing neighbours skipped) and fields in lattice shape (*shape, ...)
with results in the same shape. Oracle: a dense numpy operator built with Python loops from
the documented order."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tiga as tg

SHAPE = (4, 5, 6)
OFFSETS = [(1, 0, 0), (-1, 0, 0), (0, 2, 0), (0, 0, -1), (0, 0, 0)]


def _edges(shape, offsets, periodic):
    """[(dst, src)] in the documented edge order."""
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    out = []
    for p, coord in enumerate(itertools.product(*[range(n) for n in shape])):
        for off in offsets:
            c = [a + o for a, o in zip(coord, off)]
            if periodic:
                c = [a % n for a, n in zip(c, shape)]
            elif any(not 0 <= a < n for a, n in zip(c, shape)):
                continue
            out.append((p, int(np.dot(c, strides))))
    return out


def _operator(shape, offsets, periodic, w):
    n = int(np.prod(shape))
    a = np.zeros((n, n))
    for e, (d, s) in enumerate(_edges(shape, offsets, periodic)):
        a[d, s] += w[e]
    return a


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w - dst.x


@pytest.mark.parametrize("periodic", [False, True])
def test_edge_order_is_destination_major_then_offsets(periodic):
    g = tg.Graph.stencil(SHAPE, OFFSETS, periodic=periodic)
    edges = _edges(SHAPE, OFFSETS, periodic)
    assert g.num_edges == len(edges)
    np.testing.assert_array_equal(g.to_edge_index(), np.array(edges).T[::-1])
    if periodic:   # edge p * K + k is point p's k-th offset
        assert [d for d, _ in edges] == list(np.repeat(np.arange(120), len(OFFSETS)))
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=120), rng.normal(size=len(edges))
    got = Weighted()(graph=g, src={"x": x}, dst={"x": x}, edge={"w": w})
    deg = np.bincount([d for d, _ in edges], minlength=120)
    np.testing.assert_allclose(np.asarray(got), _operator(SHAPE, OFFSETS, periodic, w) @ x
                               - deg * x, atol=1e-12)


@pytest.mark.parametrize("features", [(), (3,)])
def test_lattice_shaped_fields_and_results(features):
    g = tg.Graph.stencil(SHAPE, OFFSETS)
    edges = _edges(SHAPE, OFFSETS, False)
    rng = np.random.default_rng(1)
    x = rng.normal(size=SHAPE + features)
    w = rng.normal(size=(len(edges),) + (1,) * len(features))
    mp = Weighted()
    call = dict(graph=g, src={"x": x}, dst={"x": x}, edge={"w": w})
    got = mp(**call)
    assert got.shape == SHAPE + features
    flat = x.reshape((120,) + features)
    a = _operator(SHAPE, OFFSETS, False, w.reshape(-1))
    deg = np.bincount([d for d, _ in edges], minlength=120)
    want = np.tensordot(a, flat, axes=1) - deg.reshape((120,) + (1,) * len(features)) * flat
    np.testing.assert_allclose(np.asarray(got), want.reshape(SHAPE + features), atol=1e-12)
    np.testing.assert_allclose(np.asarray(mp.reference(**call)), np.asarray(got), atol=1e-12)
    # a flat call gives flat rows; a mixed call (one field in lattice shape) gives lattice rows
    flat_out = mp(graph=g, src={"x": flat}, dst={"x": flat}, edge={"w": w})
    assert flat_out.shape == (120,) + features
    mixed = mp(graph=g, src={"x": x}, dst={"x": flat}, edge={"w": w})
    np.testing.assert_allclose(np.asarray(mixed), np.asarray(got), atol=1e-12)


def test_gradient_in_lattice_shape():
    g = tg.Graph.stencil(SHAPE, OFFSETS[:4])
    edges = _edges(SHAPE, OFFSETS[:4], False)
    rng = np.random.default_rng(2)
    x, w, c = rng.normal(size=SHAPE), rng.normal(size=len(edges)), rng.normal(size=SHAPE)

    def loss(x):
        y = Weighted()(graph=g, src={"x": x}, dst={"x": x}, edge={"w": w})
        return tg.math.sum(tg.math.multiply(y, c))

    got = np.asarray(tg.grad(loss)(x))
    assert got.shape == SHAPE
    op = _operator(SHAPE, OFFSETS[:4], False, w) - np.diag(
        np.bincount([d for d, _ in edges], minlength=120))
    np.testing.assert_allclose(got, (op.T @ c.reshape(-1)).reshape(SHAPE), atol=1e-12)


def test_torch_lattice_input():
    torch = pytest.importorskip("torch")
    g = tg.Graph.stencil(SHAPE, OFFSETS[:2], periodic=True)
    x = torch.randn(SHAPE + (2,), dtype=torch.float64, requires_grad=True)
    w = torch.ones(240, 1, dtype=torch.float64)
    y = Weighted()(graph=g, src={"x": x}, dst={"x": x}, edge={"w": w})
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == SHAPE + (2,)
    # periodic +-1 along axis 0: x[i+1] + x[i-1] - 2 x[i]
    want = torch.roll(x, -1, 0) + torch.roll(x, 1, 0) - 2 * x
    torch.testing.assert_close(y, want)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-12, rtol=0)


def test_wrong_lattice_shape_names_both_forms():
    g = tg.Graph.stencil(SHAPE, OFFSETS)
    with pytest.raises(tg.ShapeError, match=r"leading axis of 120 .* or leading axes "
                                            r"\(4, 5, 6\) \(lattice\), found shape "
                                            r"\(4, 5, 7\)"):
        Weighted()(graph=g, src={"x": np.zeros((4, 5, 7))}, dst={"x": np.zeros(120)},
                   edge={"w": np.zeros(g.num_edges)})
