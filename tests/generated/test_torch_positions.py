"""Coordinates held by a generated relation as torch tensors that require grad are
differentiable inputs of the propagates that read them (through torch.autograd)."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from .oracle import radius_rows

torch = pytest.importorskip("torch")


def test_torch_position_gradients_match_the_oracle():
    rng = np.random.default_rng(5)
    p_np, x_np = rng.random((60, 3)), rng.random((60, 2))
    pos = torch.tensor(p_np, requires_grad=True)
    x = torch.tensor(x_np, requires_grad=True)
    g = tg.Graph.radius(pos, 0.3)
    y = tg.propagate(g, lambda s, d, e: s.x * (0.3 - e.distance), tg.sum(), src={"x": x})
    assert isinstance(y, torch.Tensor)
    (y ** 2).sum().backward()

    # the same loss in torch over the oracle's edge list
    rows = radius_rows(p_np, 0.3)
    dst = np.concatenate([np.full(len(r), i) for i, r in enumerate(rows)])
    src = np.concatenate(rows)
    p2 = torch.tensor(p_np, requires_grad=True)
    x2 = torch.tensor(x_np, requires_grad=True)
    dist = ((p2[src] - p2[dst]) ** 2).sum(1).sqrt()
    msg = x2[src] * (0.3 - dist)[:, None]
    y2 = torch.zeros(60, 2, dtype=torch.float64).index_add(0, torch.tensor(dst), msg)
    (y2 ** 2).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), y2.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(pos.grad.numpy(), p2.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-9, atol=1e-12)
