"""torch.compile of a model holding Tiga layers (issue 26 item 6).

Each Tiga call is one opaque `tiga::call` op in the Dynamo graph (fullgraph=True: no graph
break), compiled under the eager, aot_eager and inductor backends. Outputs and gradients
(input, edge weights, torch parameters and the parameters an edge MLP captures) are compared
with the eager Tiga model and with the same message passing written in torch (index_add /
scatter_reduce), in float64. Kept small: inductor compiles take about a minute on 2 cores.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.utils import counters  # noqa: E402

import tiga as tg  # noqa: E402

N, E, F = 6, 14, 3


def relation(seed=0):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, N - 1, E))          # the last destination has no edges
    src = rng.integers(0, N, E)
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))])
    return (tg.Graph.from_csr(row_ptr, src, num_src=N), torch.as_tensor(src),
            torch.as_tensor(dst))


GRAPH, SRC, DST = relation()


class Weighted(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


class EdgeMLPMax(tg.MessagePassing):
    reducer = tg.max()

    def __init__(self, mlp):
        self.mlp = tg.nn.trace(mlp)

    def edge(self, src, dst, edge):
        return self.mlp(src.h, dst.h)


class Model(torch.nn.Module):
    """torch Linear -> Tiga weighted sum -> relu -> Tiga max over an edge MLP."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(F, 4).double()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Tanh(),
                                       torch.nn.Linear(5, 2)).double()
        self.weighted, self.edge_max = Weighted(), EdgeMLPMax(self.mlp)

    def forward(self, x, w, reference=False):
        if reference:
            return self._torch(x, w)
        h = self.weighted(graph=GRAPH, src={"x": self.lin(x)}, edge={"w": w[:, None]})
        return self.edge_max(graph=GRAPH, src={"h": torch.relu(h)}, dst={"h": h})

    def _torch(self, x, w):
        msg = self.lin(x)[SRC] * w[:, None]
        h = torch.zeros(N, 4, dtype=msg.dtype).index_add(0, DST, msg)
        m = self.mlp(torch.cat([torch.relu(h)[SRC], h[DST]], -1))
        return torch.zeros(N, 2, dtype=m.dtype).scatter_reduce(
            0, DST[:, None].expand_as(m), m, "amax", include_self=False)


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, F, dtype=torch.float64, generator=g),
            torch.rand(E, dtype=torch.float64, generator=g).requires_grad_())


def run(model, fn, x, w, **kw):
    """(output, gradients of a weighted loss for w and every parameter)."""
    model.zero_grad(set_to_none=True)
    w.grad = None
    y = fn(x, w, **kw)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    return y.detach(), [w.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def assert_same(got, want):
    torch.testing.assert_close(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)


def recording(backend):
    """A torch.compile backend that keeps the Dynamo graphs and then runs `backend`."""
    graphs = []

    def compile_fn(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    return compile_fn, graphs


def tiga_ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and "tiga.call" in str(n.target))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_model_matches_eager_and_torch(backend):
    model = Model()
    x, w = inputs()
    eager = run(model, model, x, w)
    assert_same(eager, run(model, model, x, w, reference=True))   # the model is right
    torch._dynamo.reset()
    counters.clear()
    compile_fn, graphs = recording(backend)
    compiled = torch.compile(model, backend=compile_fn, fullgraph=True)
    assert_same(run(model, compiled, x, w), eager)
    x2, w2 = inputs(2)     # new values, same shapes: the same graph, no recompile
    assert_same(run(model, compiled, x2, w2), run(model, model, x2, w2, reference=True))
    assert len(graphs) == 1 and counters["stats"]["unique_graphs"] == 1
    assert tiga_ops(graphs[0]) == 2      # one opaque op per Tiga layer


def test_inductor_matches_eager():
    model = Model()
    x, w = inputs(3)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    assert_same(run(model, compiled, x, w), run(model, model, x, w))


def test_eager_calls_are_unchanged_after_compiling():
    """The compile path is only taken while Dynamo traces: eager calls afterwards keep
    torch.autograd through Tiga's VJP (grad_fn of the bridge, not of a torch op)."""
    model = Model()
    x, w = inputs(4)
    torch._dynamo.reset()
    torch.compile(model, backend="eager", fullgraph=True)(x, w)
    y = model.weighted(graph=GRAPH, src={"x": x}, edge={"w": w[:, None]})
    assert type(y.grad_fn).__name__ == "_PropagateFunctionBackward"


def test_layer_zoo_model_compiles_in_one_graph():
    """tg.nn layers taking a PyG edge_index: each layer's relation work (it reads
    edge_index's values) is one opaque tiga::layer op, so the model is one graph
    (fullgraph=True), with outputs and gradients equal to the eager model's (the layers
    against PyG and the other backends: tests/nn/test_compile_layers.py)."""
    torch.manual_seed(0)
    edge_index = torch.randint(0, N, (2, 3 * N))

    class Zoo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gcn, self.sage = tg.nn.GCNConv(F, 4), tg.nn.SAGEConv(4, 2, aggr="max")

        def forward(self, x, w):
            return self.sage(torch.relu(self.gcn(x, edge_index)), edge_index) * w.mean()

    model = Zoo().double()
    x, w = inputs(5)
    torch._dynamo.reset()
    compile_fn, graphs = recording("aot_eager")
    got = run(model, torch.compile(model, backend=compile_fn, fullgraph=True), x, w)
    want = run(model, model, x, w)
    torch.testing.assert_close(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)
    assert len(graphs) == 1
    assert sum(1 for n in graphs[0].graph.nodes if "tiga.layer" in str(n.target)) == 2
