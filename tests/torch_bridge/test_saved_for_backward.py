"""Torch bridge: every tensor the backward reads is saved through ctx.save_for_backward, so
torch's version-counter check fires on an in-place change between forward and backward,
as it does for torch's own ops; and what the edge function reads is guarded."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402

INDPTR = np.array([0, 2, 3, 5])
INDICES = np.array([0, 2, 1, 0, 1])
INPLACE = "modified by an inplace operation"
SCALE = 2.0


def graph():
    return tg.Graph.from_csr(INDPTR, INDICES, num_src=3)


def adjacency():
    a = torch.zeros(3, 3, dtype=torch.float64)
    for i in range(3):
        for j in INDICES[INDPTR[i]:INDPTR[i + 1]]:
            a[i, j] += 1.0
    return a


def product(s, d, e):
    return s.w * s.x


def inputs():
    w = torch.linspace(-1.0, 2.0, 6, dtype=torch.float64).reshape(3, 2).requires_grad_()
    x = torch.arange(6.0, dtype=torch.float64).reshape(3, 2)    # needs no gradient
    return w, x


def test_gradient_matches_torch_when_nothing_changes():
    w, x = inputs()
    y = tg.propagate(graph(), product, tg.sum(), src={"w": w, "x": x})
    (y ** 2).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    ((adjacency() @ (w2 * x)) ** 2).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def test_inplace_change_of_a_field_the_backward_reads_raises_torchs_error():
    w, x = inputs()
    y = tg.propagate(graph(), product, tg.sum(), src={"w": w, "x": x})
    # torch's own ops raise too: the same rule for the Tiga call
    w2 = w.detach().clone().requires_grad_()
    x2 = x.clone()
    y2 = w2 * x2
    x2.add_(1)
    with pytest.raises(RuntimeError, match=INPLACE):
        y2.sum().backward()
    x.add_(1)
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


def test_inplace_change_of_a_captured_tensor_the_backward_reads_raises():
    w, x = inputs()
    scale = torch.tensor([1.5, -0.5], dtype=torch.float64)

    def edge(s, d, e):
        return s.w * scale

    y = tg.propagate(graph(), edge, tg.sum(), src={"w": w})
    scale.mul_(2)
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


def test_inplace_change_of_a_field_the_backward_does_not_read_is_allowed():
    w, x = inputs()

    def edge(s, d, e):
        return s.w + s.x

    y = tg.propagate(graph(), edge, tg.sum(), src={"w": w, "x": x})
    x.add_(1)            # d(w + x)/dw does not read x: torch's sum does not save it either
    y.sum().backward()
    torch.testing.assert_close(w.grad, adjacency().sum(0)[:, None].expand(3, 2).clone())


def scaled(s, d, e):
    return s.w * SCALE


def test_torch_calls_see_a_changed_global():
    global SCALE
    w, _ = inputs()
    try:
        for scale in (2.0, -3.0, -3.0):
            SCALE = scale
            y = tg.propagate(graph(), scaled, tg.sum(), src={"w": w})
            torch.testing.assert_close(y, adjacency() @ (w.detach() * scale))
    finally:
        SCALE = 2.0
