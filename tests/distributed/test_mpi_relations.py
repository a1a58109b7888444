"""Under mpiexec (2, 3 or 4 ranks): torch autograd on distributed programs, a radius relation
over a spatial partition (gradients through displacement/distance), and store-backed
partitions that read only their own rows. The oracle is the same program in one process
(torch autograd on the global tensors for gradients)."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from ._mpi import needs_mpiexec
from .test_mpi_equivalence import REDUCERS, _call, _dist, _layer, _problem

torch = pytest.importorskip("torch")
pytestmark = [needs_mpiexec, pytest.mark.mpi]


def _leaf(a):
    return torch.tensor(np.asarray(a), requires_grad=True)


@pytest.mark.parametrize("method", ["rows", "spatial"])
def test_torch_autograd_matches_one_process(method):
    g, d = _problem(seed=8)
    dg = _dist(g, d, method)
    for reducer in REDUCERS:
        layer = _layer(reducer)
        x, h, w, s = (_leaf(dg.local(d["x"])), _leaf(dg.local(d["h"])),
                      _leaf(dg.local_edges(d["w"])), _leaf(np.float64(1.5)))
        (_call(layer, dg, x, h, w, s) ** 2).sum().backward()
        gx, gh, gw, gs = _leaf(d["x"]), _leaf(d["h"]), _leaf(d["w"]), _leaf(np.float64(1.5))
        want = _call(layer, g, gx, gh, gw, gs)
        (want ** 2).sum().backward()
        for mine, full in ((x, gx), (h, gh)):       # ghost cotangents came home
            np.testing.assert_allclose(dg.gather(mine.grad.numpy()), full.grad.numpy(),
                                       rtol=1e-9, atol=1e-12, err_msg=reducer)
        np.testing.assert_allclose(w.grad.numpy(), gw.grad.numpy()[dg.plan.edge_ids],
                                   rtol=1e-9, atol=1e-12, err_msg=reducer)
        # a replicated parameter's gradient is this rank's part: the parts add up
        np.testing.assert_allclose(dg.comm.sum(s.grad.numpy(), "test"), gs.grad.numpy(),
                                   rtol=1e-9, err_msg=reducer)


def test_torch_module_parameters_sum_to_one_process():
    g, d = _problem(seed=9)
    dg = _dist(g, d, "edges")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                              torch.nn.Linear(5, 3)).double()

    class Apply(tg.MessagePassing):
        reducer = tg.sum()

        def __init__(self):
            super().__init__()
            self.mlp = tg.nn.trace(mlp)

        def edge(self, src, dst, edge):
            return self.mlp(src.x - dst.x)

    def grads(graph, x):
        mlp.zero_grad()
        xt = _leaf(x)
        (Apply()(graph=graph, src={"x": xt}, dst={"x": xt}) ** 2).sum().backward()
        return xt.grad.numpy(), [p.grad.numpy().copy() for p in mlp.parameters()]

    gx, gp = grads(dg, dg.local(d["x"]))
    wx, wp = grads(g, d["x"])
    np.testing.assert_allclose(dg.gather(gx), wx, rtol=1e-9, atol=1e-12)
    for mine, full in zip(gp, wp):
        np.testing.assert_allclose(dg.comm.sum(mine, "test"), full, rtol=1e-9, atol=1e-12)


class Radial(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        r = edge.distance[..., None]
        return src.x * tg.math.exp(-r) * edge.w + 0.1 * edge.displacement.sum(-1, keepdims=True)


def _points(n=150, seed=10):
    rng = np.random.default_rng(seed)
    pos = rng.random((n, 3))
    pos[:5] = pos[5]               # coincident points: distance 0, loop dropped by index
    return pos, rng.standard_normal((n, 4))


@pytest.mark.parametrize("loop", [False, True])
def test_radius_over_spatial_boxes_matches_one_process(loop):
    pos, x = _points()
    g = tg.Graph.radius(pos, 0.22, loop=loop)
    dg = tg.distributed.partition(g, method="spatial")
    w = np.random.default_rng(11).standard_normal((len(g.resolve_csr()[1]), 1))
    assert dg.global_type.num_edges == len(w)
    y = Radial()(graph=dg, src={"x": dg.local(x)}, edge={"w": dg.local_edges(w)})
    want = Radial()(graph=g, src={"x": x}, edge={"w": w})
    np.testing.assert_allclose(dg.gather(np.asarray(y)), np.asarray(want), rtol=1e-12,
                               atol=1e-12)
    # ghosts are exactly the foreign points within the cutoff of this rank's box
    mine = pos[dg.owned]
    if len(mine):
        lo, hi = mine.min(axis=0), mine.max(axis=0)
        gap = np.maximum(np.maximum(lo - pos, pos - hi), 0.0)
        near = np.flatnonzero((np.sqrt((gap ** 2).sum(1)) <= 0.22) &
                              ~np.isin(np.arange(len(pos)), dg.owned))
        assert sorted(dg.plan.ghosts.tolist()) == near.tolist()


def test_radius_gradients_through_displacement_and_distance():
    pos, x = _points(seed=12)
    g = tg.Graph.radius(pos, 0.25)
    dg = tg.distributed.partition(g, method="spatial")
    w = np.random.default_rng(13).standard_normal((len(g.resolve_csr()[1]), 1))
    wl = dg.local_edges(w)
    gp_all, gx_all = _leaf(pos), _leaf(x)       # oracle: torch on the global relation
    (Radial()(graph=tg.Graph.radius(gp_all, 0.25), src={"x": gx_all}, edge={"w": w}) ** 2
     ).sum().backward()
    p, xt = _leaf(dg.positions), _leaf(dg.local(x))
    (Radial()(graph=dg.at(p), src={"x": xt}, edge={"w": wl}) ** 2).sum().backward()
    np.testing.assert_allclose(dg.gather(p.grad.numpy()), gp_all.grad.numpy(), rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(dg.gather(xt.grad.numpy()), gx_all.grad.numpy(), rtol=1e-9,
                               atol=1e-12)

    def loss(pp, xx):      # tg.grad: coordinates traced, exchanged with the values
        return (Radial()(graph=dg.at(pp), src={"x": xx}, edge={"w": wl}) ** 2).sum()

    got = tg.grad(loss, argnums=(0, 1))(dg.positions, dg.local(x))
    np.testing.assert_allclose(dg.gather(np.asarray(got[0])), gp_all.grad.numpy(),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dg.gather(np.asarray(got[1])), gx_all.grad.numpy(),
                               rtol=1e-9, atol=1e-12)


def test_radius_partition_arguments_are_checked():
    pos, _ = _points()
    with pytest.raises(tg.UnsupportedError, match="method='spatial'"):
        tg.distributed.partition(tg.Graph.radius(pos, 0.2), method="rows")
    with pytest.raises(tg.UnsupportedError, match="max_neighbors"):
        tg.distributed.partition(tg.Graph.radius(pos, 0.2, max_neighbors=3),
                                 method="spatial")


def _store(tmp_path, g, d):
    row_ptr, col = g.resolve_csr()
    n = g.num_dst
    with tg.store.create(tmp_path / "s", num_src=n, num_dst=n, overwrite=True) as w:
        for a in range(0, n, 10):     # several chunks
            b = min(a + 10, n)
            w.append_csr_chunk(row_ptr[a:b + 1] - row_ptr[a], col[row_ptr[a]:row_ptr[b]])
        w.append_field("x", d["x"], role="src")
    return tg.Graph.open(tmp_path / "s"), tg.store.open(tmp_path / "s")


@pytest.mark.parametrize("method", ["rows", "edges"])
def test_store_backed_partition_reads_only_its_rows(tmp_path, method):
    g, d = _problem(seed=14)
    row_ptr, col = g.resolve_csr()
    g = tg.Graph.from_csr(row_ptr, col, num_src=g.num_src)    # storage order = edge order
    paged, store = _store(tmp_path, g, d)
    reader = paged.params["reader"]
    reads = []
    original = reader.read_rows
    reader.read_rows = lambda a, b: reads.append((a, b)) or original(a, b)
    reader.read_csr = lambda: pytest.fail("a rank read the whole CSR")
    dg = tg.distributed.partition(paged, method=method)
    ref = tg.distributed.partition(g, method=method)            # in-memory oracle plan
    assert np.array_equal(np.sort(dg.owned), np.sort(ref.owned))
    assert sorted(dg.plan.ghosts.tolist()) == sorted(ref.plan.ghosts.tolist())
    if dg.plan.n_owned:
        assert reads == [(int(dg.owned.min()), int(dg.owned.max()) + 1)]
    _check_stored(dg, g, d, store, "max", seed=15)


def _check_stored(dg, g, d, store, reducer: str, seed: int) -> None:
    """A store-backed partition's forward and source-field gradient equal one process's;
    the stored field is read by its owned rows."""
    xl = dg.local(store["x"])                      # the field's own rows, from disk
    np.testing.assert_array_equal(xl, d["x"][dg.owned])
    w = np.random.default_rng(seed).standard_normal((g.num_edges, 1))
    layer = _layer(reducer)
    y = _call(layer, dg, xl, dg.local(d["h"]), dg.local_edges(w))
    want = _call(layer, g, d["x"], d["h"], w)
    np.testing.assert_allclose(dg.gather(np.asarray(y)), np.asarray(want), rtol=1e-12)
    gx = tg.grad(lambda x, gr, ww: (_call(layer, gr, x, x, ww) ** 2).sum())
    np.testing.assert_allclose(dg.gather(np.asarray(gx(xl, dg, dg.local_edges(w)))),
                               gx(d["x"], g, w), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("positions", ["pos", "array"])
def test_store_backed_spatial_partition_reads_only_its_rows(tmp_path, positions):
    g, d = _problem(seed=16)
    row_ptr, col = g.resolve_csr()
    g = tg.Graph.from_csr(row_ptr, col, num_src=g.num_src)    # storage order = edge order
    path = tmp_path / "s"
    n = g.num_dst
    with tg.store.create(path, num_src=n, num_dst=n, overwrite=True) as w:
        for a in range(0, n, 10):
            b = min(a + 10, n)
            w.append_csr_chunk(row_ptr[a:b + 1] - row_ptr[a], col[row_ptr[a]:row_ptr[b]])
        w.append_field("x", d["x"], role="src")
        w.append_field("pos", d["pos"], role="dst")
    paged, store = tg.Graph.open(path), tg.store.open(path)
    reader = paged.params["reader"]
    reads = []
    original = reader.read_rows
    reader.read_rows = lambda a, b: reads.append((a, b)) or original(a, b)
    reader.read_csr = lambda: pytest.fail("a rank read the whole CSR")
    dg = tg.distributed.partition(paged, method="spatial",
                                  positions="pos" if positions == "pos" else d["pos"])
    ref = tg.distributed.partition(g, method="spatial", positions=d["pos"])
    assert np.array_equal(np.sort(dg.owned), np.sort(ref.owned))
    assert sorted(dg.plan.ghosts.tolist()) == sorted(ref.plan.ghosts.tolist())
    # its own rows only, each once, as runs of consecutive ids
    got = np.concatenate([np.arange(a, b) for a, b in reads] + [np.zeros(0, np.int64)])
    assert got.tolist() == np.sort(dg.owned).tolist()
    _check_stored(dg, g, d, store, "mean", seed=17)
