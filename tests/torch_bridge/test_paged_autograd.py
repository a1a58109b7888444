"""torch.autograd through paged programs (API.md section 7, issue 15): a layer called on a
stored relation with torch tensors that require grad runs page by page forward and backward,
never reads the stored CSR whole, and its gradients equal the same layer's on the relation
held in memory (Graph.from_csr), whose torch gradients test_torch_autograd checks against
torch's own scatter ops."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zarr", minversion="3.1")

import tiga as tg  # noqa: E402
from tiga.xla_free_runtime.store import stores as store_mod  # noqa: E402

REDUCERS = {"sum": tg.sum, "mean": tg.mean, "max": tg.max, "min": tg.min, "prod": tg.prod}
N_SRC, N_DST = 40, 53


class Layer(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.b


def relation(seed=0):
    """Skewed random CSR: empty rows, duplicate and repeated sources."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 6, N_DST)
    deg[[0, 17, 40]] = 0
    rp = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    ci = rng.integers(0, N_SRC, rp[-1]).astype(np.int32)
    return rp, ci


@pytest.fixture
def paged(tmp_path, monkeypatch):
    rp, ci = relation()
    with tg.store.create(tmp_path / "s", num_src=N_SRC, num_dst=N_DST) as w:
        half = N_DST // 2
        w.append_csr_chunk(rp[:half + 1], ci[:rp[half]])
        w.append_csr_chunk(rp[half:] - rp[half], ci[rp[half]:])
    real = tg.Graph.resolve_csr

    def resolve(self):
        assert self.kind != "paged", "the stored CSR was read whole"
        return real(self)
    monkeypatch.setattr(tg.Graph, "resolve_csr", resolve)
    monkeypatch.setattr(store_mod.Store, "read_csr", lambda self: pytest.fail("read_csr"))
    return tmp_path / "s", rp, ci


def _fields(seed=1):
    rng = np.random.default_rng(seed)
    rp, ci = relation()
    return (rng.random((N_SRC, 3)) + 0.5, rng.random((len(ci), 1)) + 0.5,
            rng.random((N_DST, 3)))


def _grads(call, graph, arrays):
    """(output, grads of x, w and b) of sum(y * y) through torch.autograd."""
    x, w, b = (torch.tensor(a, requires_grad=True) for a in arrays)
    y = call(graph, x, w, b)
    assert isinstance(y, torch.Tensor) and y.requires_grad
    (y * y).sum().backward()
    return [y.detach().numpy()] + [t.grad.numpy() for t in (x, w, b)]


@pytest.mark.parametrize("reducer", sorted(REDUCERS))
def test_layer_grads_on_a_paged_relation_equal_in_memory(paged, reducer):
    path, rp, ci = paged
    layer = Layer()
    layer.reducer = REDUCERS[reducer]()

    def call(graph, x, w, b):
        return layer(graph=graph, src={"x": x}, dst={"b": b}, edge={"w": w})
    arrays = _fields()
    g = tg.Graph.open(path)
    with tg.scope(page_rows=16), tg.profile() as prof:
        got = _grads(call, g, arrays)
    stats = prof.measured("paged")[-1]
    assert stats.pages == 4 and stats.page_rows == 16       # 53 destination rows / 16
    assert tg.store.open(path).transposed is not None       # x's cotangent walked it
    want = _grads(call, tg.Graph.from_csr(rp, ci, num_src=N_SRC), arrays)
    for name, a, e in zip(("y", "x", "w", "b"), got, want):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12, err_msg=name)


def test_functional_propagate_grads_on_a_paged_relation(paged):
    path, rp, ci = paged

    def call(graph, x, w, b):
        return tg.propagate(graph, lambda s, d, e: tg.math.tanh(s.x * e.w) * d.b, tg.mean(),
                            src={"x": x}, dst={"b": b}, edge={"w": w})
    arrays = _fields(seed=2)
    with tg.scope(page_rows=16):
        got = _grads(call, tg.Graph.open(path), arrays)
    want = _grads(call, tg.Graph.from_csr(rp, ci, num_src=N_SRC), arrays)
    for name, a, e in zip(("y", "x", "w", "b"), got, want):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12, err_msg=name)
