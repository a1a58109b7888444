"""Independent sum propagates over one radius/knn relation share one walk (the torch
bridge's VJPs): values and gradients against independent oracles, and the walk count."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.core.eval import eval_program
from tiga.core.prims.graph import propagate_p
from tiga.opt import fuse_relation_walks
from tiga.trace.message_passing import PropagateCall, run_call
from tiga.trace.staging import make_program

from .oracle import radius_rows

torch = pytest.importorskip("torch")


def _propagates(program) -> list:
    return [e for e in program.eqns if e.primitive is propagate_p]


def _two_walks(p, x, w):
    g = tg.Graph.radius(p, 0.3)
    a = tg.propagate(g, lambda s, d, e: tg.math.relu(s.x - d.x), tg.sum(), src={"x": x},
                     dst={"x": x})
    # grouped by source: the sum over each source's destinations
    b = run_call(PropagateCall(g, lambda s, d, e: s.x * d.w, tg.sum(), {"x": x}, {"w": w},
                               None, None, {}, reduce_by="src"))
    return a, b


def test_rewrite_merges_independent_walks_and_keeps_their_values():
    rng = np.random.default_rng(0)
    p, x, w = rng.random((50, 3)), rng.standard_normal((50, 4)), rng.standard_normal((50, 4))
    prog = make_program(_two_walks)(p, x, w)
    assert len(_propagates(prog)) == 2
    fused = fuse_relation_walks(prog, lambda v: "symmetric")
    assert len(_propagates(fused)) == 1
    for got, want in zip(eval_program(fused, p, x, w), eval_program(prog, p, x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # a directed relation: a source-grouped walk is not a destination-grouped one
    assert len(_propagates(fuse_relation_walks(prog, lambda v: "directed"))) == 2
    assert len(_propagates(fuse_relation_walks(prog, lambda v: None))) == 2


def _chained(p, x):
    g = tg.Graph.radius(p, 0.3)
    a = tg.propagate(g, lambda s, d, e: s.x * 2.0, tg.sum(), src={"x": x})
    b = tg.propagate(g, lambda s, d, e: s.a + d.x, tg.sum(), src={"a": a}, dst={"x": x})
    return a, b


def test_rewrite_leaves_dependent_walks_apart():
    rng = np.random.default_rng(1)
    p, x = rng.random((40, 3)), rng.standard_normal((40, 2))
    prog = make_program(_chained)(p, x)
    fused = fuse_relation_walks(prog, lambda v: "symmetric")
    assert len(_propagates(fused)) == 2
    for got, want in zip(eval_program(fused, p, x), eval_program(prog, p, x)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


class EdgeNN(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self, module):
        super().__init__()
        self.mlp = tg.nn.trace(module)

    def edge(self, src, dst, edge):
        return self.mlp(edge.displacement, src.x)


def _oracle_edges(graph, n):
    row_ptr, col = (np.asarray(a) for a in graph.resolve_csr())
    dst = np.repeat(np.arange(n), np.diff(row_ptr))
    return torch.tensor(col), torch.tensor(dst)


@pytest.mark.parametrize("kind", ["radius", "radius-truncated", "knn"])
def test_edge_mlp_vjp_walks_and_gradients(kind, monkeypatch):
    from tiga import opt

    torch.manual_seed(3)
    n = 90
    pos = torch.rand(n, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 3)).double()
    if kind == "radius":
        graph = tg.Graph.radius(pos, cutoff=0.3)
    elif kind == "radius-truncated":
        graph = tg.Graph.radius(pos, cutoff=0.3, max_neighbors=4)
    else:
        graph = tg.Graph.knn(pos, k=6)
    seen = []
    real = opt.optimize_program   # the shared "execute" passes, walk fusion last

    def spy(program, facts):
        out = real(program, facts)
        if facts.stage == "execute":
            seen.append(out[0])
        return out

    monkeypatch.setattr(opt, "optimize_program", spy)
    model = EdgeNN(mlp)
    y = model(graph=graph, src={"x": x})
    # the call resolved the relation (keyed on its edge count): the walks read that CSR
    assert graph._csr is not None
    assert "walk that CSR" in str(model.explain(graph=graph, src={"x": x}))
    variables = (pos, x, *mlp.parameters())
    grads = torch.autograd.grad(y.square().sum(), variables)
    walks = len(_propagates(seen[-1]))
    # symmetric radius: one walk (source cotangents by exchanged roles); otherwise the
    # destination-grouped walks merge and the source-grouped one stays apart
    assert walks == (1 if kind == "radius" else 2)

    col, dst = _oracle_edges(graph, n)
    if kind == "radius":   # the relation itself, from an independent oracle
        rows = radius_rows(pos.detach().numpy(), 0.3)
        assert sum(len(r) for r in rows) == len(col)
    ref = torch.zeros(n, 3, dtype=torch.float64).index_add(
        0, dst, mlp(torch.cat((pos[col] - pos[dst], x[col]), dim=-1)))
    want = torch.autograd.grad(ref.square().sum(), variables)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp, rtol=1e-9, atol=1e-11)
