"""Shared by tests/nn: PyG's own layer-test graphs, and a float64 comparison of a tg.nn
layer with the PyG layer whose state dict it loaded (outputs and every gradient)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pyg = pytest.importorskip("torch_geometric.nn")

# PyG's layer tests use edge_index [[0,0,0,1,2,3],[1,2,3,0,0,0]] on 4 nodes; the other
# cases add what those tests probe: isolated nodes, existing self loops (one node with two),
# duplicate edges, and no edges at all.
_BASE = [[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]
CASES = {
    "pyg": (_BASE, 4),
    "isolated": (_BASE, 6),
    "self_loops": ([_BASE[0] + [1, 3, 3], _BASE[1] + [1, 3, 3]], 4),
    "duplicates": ([_BASE[0] + [0, 0, 2, 2], _BASE[1] + [1, 1, 2, 2]], 5),
    "no_edges": ([[], []], 3),
}


def case(name: str) -> tuple:
    """(edge_index int64 (2, E), num_nodes) of a named case."""
    edges, n = CASES[name]
    return torch.tensor(edges, dtype=torch.int64).view(2, -1), n


def randomized(pyg_layer, seed: int = 0):
    """The PyG layer in float64 with every parameter and buffer redrawn (non-zero biases,
    so that their gradients mean something)."""
    gen = torch.Generator().manual_seed(seed)
    pyg_layer = pyg_layer.double()
    with torch.no_grad():
        for p in list(pyg_layer.parameters()) + list(pyg_layer.buffers()):
            if p.is_floating_point():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return pyg_layer


def loaded(ours, pyg_layer):
    """`ours` in float64 holding the PyG layer's state dict (same names, strictly)."""
    ours = ours.double()
    assert set(ours.state_dict()) == set(pyg_layer.state_dict())
    ours.load_state_dict(pyg_layer.state_dict())
    return ours


def _run(layer, call, inputs, cotangent=None):
    """(outputs, gradients of <outputs, cotangent> with respect to inputs and parameters by
    name); outputs may be a tensor or a tuple of them."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = call(layer, *leaves)
    outs = out if isinstance(out, tuple) else (out,)
    if cotangent is None:
        gen = torch.Generator().manual_seed(7)
        cotangent = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
    total = sum((o * c).sum() for o, c in zip(outs, cotangent))
    names = sorted(n for n, _ in layer.named_parameters())   # the same in both layers
    wrt = [t for t in leaves if t.requires_grad] + [dict(layer.named_parameters())[n]
                                                    for n in names]
    grads = torch.autograd.grad(total, wrt, allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], list(grads), cotangent


def assert_same(ours, pyg_layer, call, *inputs, rtol=1e-10, atol=1e-12):
    """ours(...) == pyg_layer(...) and every gradient equal (inputs, parameters), float64."""
    want, want_grads, cot = _run(pyg_layer, call, inputs)
    got, got_grads, _ = _run(ours, call, inputs, cot)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    assert len(got_grads) == len(want_grads)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol,
                                   msg=lambda m, i=i: f"grad {i}: {m}")
    return got
