"""tg.nn.NeighborLoader (issue 40 item 5, API.md section 12): PyG's batch semantics (seeds
first, n_id, e_id, per-hop sizes), the sampling rules (edges exist, fan-out bounds, no
duplicates without replacement, every edge of a small row, uniform draws), seeds and epochs,
a paged store sampled without reading it whole and giving the in-memory batches, PyG Data
input, and a GraphSAGE epoch on the batches.

PyG's own NeighborLoader is not run here: its sampler needs pyg-lib or torch-sparse, which
have no wheel for this torch (it raises ImportError without them)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tiga as tg

torch = pytest.importorskip("torch")

from tiga.torch_bridge.layers.loader import sample_rows  # noqa: E402  (needs torch)


def _edge_index(num_nodes: int = 300, num_edges: int = 2400, seed: int = 0):
    """A random graph with what sampling must survive: isolated nodes (the last 20),
    duplicate edges, self loops, and a few hubs of high in-degree."""
    rng = np.random.default_rng(seed)
    live = num_nodes - 20
    src = rng.integers(0, live, num_edges)
    dst = np.where(rng.random(num_edges) < 0.2, rng.integers(0, 5, num_edges),
                   rng.integers(0, live, num_edges))
    src[:30], dst[:30] = np.arange(30), np.arange(30)            # self loops
    src[30:60], dst[30:60] = src[60:90], dst[60:90]              # duplicate edges
    return torch.from_numpy(np.stack([src, dst])), num_nodes


def _loader(graph, **kw):
    kw = {"num_neighbors": [4, 3], "batch_size": 16, "shuffle": True, "seed": 0} | kw
    return tg.nn.NeighborLoader(graph, **kw)


def _check_batch(sub, ei, num_nodes, fanouts, replace=False):
    """Every rule one batch must keep, against the full edge_index `ei`."""
    n_id, e_id, local = sub.n_id, sub.e_id, sub.edge_index
    bs = sub.batch_size
    assert local.dtype == torch.int64 and local.shape == (2, len(e_id))
    assert sub.num_sampled_nodes[0] == bs and sum(sub.num_sampled_nodes) == len(n_id)
    assert len(sub.num_sampled_nodes) == len(fanouts) + 1
    assert len(sub.num_sampled_edges) == len(fanouts)
    assert sum(sub.num_sampled_edges) == len(e_id)
    # every sampled edge exists: its global ends are edge e_id's ends
    assert torch.equal(n_id[local[0]], ei[0, e_id]) and torch.equal(n_id[local[1]], ei[1, e_id])
    assert len(torch.unique(n_id)) == len(n_id)                  # each node once
    if not replace:
        assert len(torch.unique(e_id)) == len(e_id)              # each edge once
    in_deg = torch.bincount(ei[1], minlength=num_nodes)
    lo_n, lo_e = 0, 0
    for hop, fanout in enumerate(fanouts):
        width = sub.num_sampled_nodes[hop]
        frontier = torch.arange(lo_n, lo_n + width)
        hop_edges = local[:, lo_e:lo_e + sub.num_sampled_edges[hop]]
        # a hop expands exactly the nodes the previous one added
        assert bool(torch.isin(hop_edges[1], frontier).all())
        counts = torch.bincount(hop_edges[1] - lo_n, minlength=width)
        deg = in_deg[n_id[frontier]]
        if fanout < 0:                                           # -1: every edge
            assert torch.equal(counts, deg)
        elif replace:
            assert torch.equal(counts, torch.where(deg > 0, fanout, 0))
        else:       # all of a row within its fan-out, else exactly the fan-out
            assert torch.equal(counts, torch.minimum(deg, torch.tensor(fanout)))
        lo_n, lo_e = lo_n + width, lo_e + sub.num_sampled_edges[hop]


def test_batches_keep_pyg_semantics():
    ei, n = _edge_index()
    x = torch.randn(n, 5)
    y = torch.arange(n) % 3
    loader = _loader(tg.Graph.from_edge_index(ei, num_nodes=n), x=x, y=y,
                     edge_attr=torch.arange(ei.shape[1]) * 2)
    assert len(loader) == -(-n // 16)
    batches = list(loader)
    assert len(batches) == len(loader)
    for sub in batches:
        _check_batch(sub, ei, n, [4, 3])
        assert torch.equal(sub.n_id[:sub.batch_size], sub.input_id)   # seeds first
        assert torch.equal(sub.x, x[sub.n_id]) and torch.equal(sub.y, y[sub.n_id])
        assert torch.equal(sub.edge_attr, sub.e_id * 2)
        g = sub.graph
        assert (g.num_dst, g.num_edges) == (sub.num_nodes, sub.num_edges)
    assert [b.batch_size for b in batches] == [16] * (n // 16) + [n % 16]
    seeds = torch.cat([b.n_id[:b.batch_size] for b in batches])
    assert torch.equal(torch.sort(seeds).values, torch.arange(n))    # the epoch covers all


def test_csr_positions_are_edge_ids_of_a_csr_graph():
    ei, n = _edge_index(seed=1)
    rp, ci = tg.Graph.from_edge_index(ei, num_nodes=n).resolve_csr()
    graph = tg.Graph.from_csr(rp, ci, num_src=n)
    rp, ci = torch.from_numpy(np.array(rp)), torch.from_numpy(np.array(ci, np.int64))
    dst = torch.repeat_interleave(torch.arange(n), rp[1:] - rp[:-1])
    for sub in _loader(graph):
        _check_batch(sub, torch.stack([ci, dst]), n, [4, 3])


@pytest.mark.parametrize("fanouts", [[1], [2, 2, 2], [-1, 2], [0, 5]])
def test_fanouts_and_all_neighbours(fanouts):
    ei, n = _edge_index(seed=2)
    loader = _loader(tg.Graph.from_edge_index(ei, num_nodes=n), num_neighbors=fanouts,
                     batch_size=40)
    for sub in loader:
        _check_batch(sub, ei, n, fanouts)


def test_sampling_with_replacement():
    ei, n = _edge_index(seed=3)
    for sub in _loader(tg.Graph.from_edge_index(ei, num_nodes=n), replace=True,
                       num_neighbors=[6, 2]):
        _check_batch(sub, ei, n, [6, 2], replace=True)


def test_draws_are_uniform_without_replacement():
    """Rows of degree 10 keeping 3: each offset is picked with probability 3/10, pairs with
    probability 3/10 * 2/9 (a uniform subset), within 5 standard deviations."""
    rows, trials = 2000, 3
    rng = np.random.default_rng(7)
    hits = np.zeros(10)
    pair = 0
    for _ in range(trials):
        seg, off = sample_rows(np.full(rows, 10), 3, False, rng)
        assert np.array_equal(np.bincount(seg, minlength=rows), np.full(rows, 3))
        key = seg * 16 + off
        assert len(np.unique(key)) == len(key) and np.all(np.diff(key) > 0)
        hits += np.bincount(off, minlength=10)
        chosen = np.zeros((rows, 10), bool)
        chosen[seg, off] = True
        pair += int((chosen[:, 0] & chosen[:, 1]).sum())
    total = rows * trials
    p = 0.3
    assert np.all(np.abs(hits - total * p) < 5 * np.sqrt(total * p * (1 - p)))
    q = 0.3 * 2 / 9
    assert abs(pair - total * q) < 5 * np.sqrt(total * q * (1 - q))


def _ids(loader):
    return [(b.n_id.tolist(), b.e_id.tolist()) for b in loader]


def test_seed_reproduces_and_epochs_differ():
    ei, n = _edge_index(seed=4)
    g = tg.Graph.from_edge_index(ei, num_nodes=n)
    a, b = _loader(g, seed=5), _loader(g, seed=5)
    first = _ids(a)
    assert first == _ids(b)                       # one seed, one sequence
    assert first != _ids(_loader(g, seed=6))      # another seed, other batches
    assert first != _ids(a)                       # the next epoch is another draw
    torch.manual_seed(11)
    c = _ids(_loader(g, seed=None))
    torch.manual_seed(11)
    assert c == _ids(_loader(g, seed=None))       # torch's global seed, as in PyG
    gen = torch.Generator().manual_seed(3)
    d = _ids(_loader(g, seed=None, generator=gen))
    assert d == _ids(_loader(g, seed=None, generator=torch.Generator().manual_seed(3)))
    # without shuffle the seeds come in input order
    plain = list(_loader(g, shuffle=False, batch_size=50))
    assert torch.equal(torch.cat([s.n_id[:s.batch_size] for s in plain]), torch.arange(n))


def test_input_nodes_mask_ids_and_drop_last():
    ei, n = _edge_index(seed=5)
    g = tg.Graph.from_edge_index(ei, num_nodes=n)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[::7] = True
    want = torch.nonzero(mask).view(-1)
    for nodes in (mask, want, want.numpy()):
        batches = list(_loader(g, input_nodes=nodes, batch_size=10))
        seeds = torch.cat([b.n_id[:b.batch_size] for b in batches])
        assert torch.equal(torch.sort(seeds).values, want)
        for b in batches:
            assert torch.equal(b.n_id[:b.batch_size], want[b.input_id])
    dropped = _loader(g, input_nodes=want, batch_size=10, drop_last=True)
    assert len(dropped) == len(want) // 10 and all(b.batch_size == 10 for b in dropped)
    one = _loader(g).sample([3, 290, 3], rng=0)   # duplicate seeds kept, isolated 290
    assert one.n_id[:3].tolist() == [3, 290, 3] and one.batch_size == 3
    assert not bool(torch.isin(one.n_id[3:], torch.tensor([3, 290])).any())


def test_arguments_are_checked():
    ei, n = _edge_index(seed=6)
    g = tg.Graph.from_edge_index(ei, num_nodes=n)
    err = tg.nn.LayerArgumentError if hasattr(tg.nn, "LayerArgumentError") else ValueError
    for bad in ([], [-2], ["a"], {"x": [1]}):
        with pytest.raises(err, match="num_neighbors"):
            tg.nn.NeighborLoader(g, num_neighbors=bad)
    with pytest.raises(err, match="batch_size"):
        tg.nn.NeighborLoader(g, [2], batch_size=0)
    with pytest.raises(err, match="input_nodes"):
        tg.nn.NeighborLoader(g, [2], input_nodes=[n])
    with pytest.raises(err, match="rows"):
        tg.nn.NeighborLoader(g, [2], x=torch.zeros(n + 1, 2))
    with pytest.raises(err, match="num_src == num_dst"):
        tg.nn.NeighborLoader(tg.Graph.from_csr(np.array([0, 1]), np.array([2])), [2])  # 3 x 1


def _paged(tmp_path, ei, n, x, chunk=64):
    """The graph of `ei` written to a store in chunks of rows, with node field x."""
    rp, ci = tg.Graph.from_edge_index(ei, num_nodes=n).resolve_csr()
    rp, ci = np.asarray(rp), np.asarray(ci)
    path = tmp_path / "store"
    with tg.store.create(path, num_src=n, num_dst=n, index_dtype="int32") as w:
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            w.append_csr_chunk(rp[a:b + 1] - rp[a], ci[rp[a]:rp[b]])
        w.append_field("x", x, role="src")
    return tg.Graph.open(path), tg.Graph.from_csr(rp, ci, num_src=n)


def test_paged_store_gives_the_in_memory_batches_without_reading_it_whole(tmp_path):
    ei, n = _edge_index(num_nodes=3000, num_edges=30000, seed=8)
    x = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    paged, memory = _paged(tmp_path, ei, n, x)
    assert paged.kind == "paged"
    on_disk = _loader(paged, num_neighbors=[5, 3], batch_size=32, seed=2)
    in_memory = _loader(memory, num_neighbors=[5, 3], batch_size=32, seed=2,
                        x=torch.from_numpy(x))
    for k, (a, b) in enumerate(zip(on_disk, in_memory)):
        for key in ("n_id", "e_id", "edge_index", "x"):
            assert torch.equal(a[key], b[key]), key
        assert a.num_sampled_nodes == b.num_sampled_nodes
        assert a.num_sampled_edges == b.num_sampled_edges
        if k == 4:
            break
    assert paged._csr is None                     # the CSR was never resolved whole
    read = on_disk.rows.entries_read
    assert 0 < read < (n + 1 + int(paged.num_edges)) // 2
    # the store itself (tg.store.open) is accepted too
    store = tg.nn.NeighborLoader(tg.store.open(tmp_path / "store"), [5, 3], batch_size=32,
                                 shuffle=True, seed=2)
    assert _ids(store)[:5] == _ids(_loader(memory, num_neighbors=[5, 3], batch_size=32,
                                           seed=2))[:5]


def test_pyg_data_is_sampled_into_pyg_batches():
    data = pytest.importorskip("torch_geometric.data")
    ei, n = _edge_index(seed=9)
    d = data.Data(x=torch.randn(n, 4), y=torch.arange(n), edge_index=ei,
                  edge_attr=torch.randn(ei.shape[1], 2), train_mask=torch.arange(n) % 2 == 0)
    loader = tg.nn.NeighborLoader(d, num_neighbors=[3, 2], batch_size=25,
                                  input_nodes=d.train_mask, seed=1)
    seen = []
    for sub in loader:
        assert isinstance(sub, data.Data) and sub.num_nodes == len(sub.n_id)
        _check_batch(sub, ei, n, [3, 2])
        assert torch.equal(sub.x, d.x[sub.n_id]) and torch.equal(sub.y, sub.n_id)
        assert torch.equal(sub.edge_attr, d.edge_attr[sub.e_id])
        assert torch.equal(sub.train_mask, d.train_mask[sub.n_id])
        seen.append(sub.n_id[:sub.batch_size])
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(0, n, 2))


def test_graphsage_epoch_trains_on_the_batches():
    """Two-layer GraphSAGE (tg.nn.SAGEConv) over NeighborLoader batches: a node's label is
    its first feature's sign spread by one hop, learnable from the sampled neighbourhood."""
    ei, n = _edge_index(num_nodes=400, num_edges=3000, seed=10)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=gen)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    conv1, conv2 = tg.nn.SAGEConv(8, 16), tg.nn.SAGEConv(16, 2)
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.02)
    loader = tg.nn.NeighborLoader(tg.Graph.from_edge_index(ei, num_nodes=n), [10, 5],
                                  batch_size=64, shuffle=True, seed=0, x=x, y=y)
    losses = []
    for _ in range(3):
        total = 0.0
        for sub in loader:
            opt.zero_grad()
            h = conv1(sub.x, sub.edge_index).relu()
            out = conv2(h, sub.edge_index)[:sub.batch_size]
            loss = torch.nn.functional.cross_entropy(out, sub.y[:sub.batch_size])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * sub.batch_size
        losses.append(total / n)
    assert all(np.isfinite(losses)) and all(p.grad is not None for p in params)
    assert losses[-1] < losses[0]
    # the sampled relation as a tg.Graph works the same
    sub = next(iter(loader))
    with torch.no_grad():
        a = conv2(conv1(sub.x, sub.edge_index).relu(), sub.edge_index)
        b = conv2(conv1(sub.x, sub.graph).relu(), sub.graph)
    assert torch.allclose(a, b, atol=1e-5)


def test_dense_and_sorted_node_maps_agree(monkeypatch):
    """Graphs up to DENSE_MAP_NODES nodes map ids through a reused array, larger ones through
    sorted arrays: the batches are the same, and the array is left all -1 after each batch."""
    from tiga.torch_bridge.layers import loader as module
    ei, n = _edge_index(seed=12)
    g = tg.Graph.from_edge_index(ei, num_nodes=n)
    dense = _loader(g, replace=True, seed=4)
    want = _ids(dense)
    assert dense._table is not None and bool(np.all(dense._table == -1))
    monkeypatch.setattr(module, "DENSE_MAP_NODES", 0)
    sorted_ = _loader(g, replace=True, seed=4)
    assert _ids(sorted_) == want and sorted_._table is None
    one = _loader(g).sample([5, 5, 7], rng=1)
    monkeypatch.undo()
    assert one.n_id.tolist() == _loader(g).sample([5, 5, 7], rng=1).n_id.tolist()


def test_store_fields_can_be_left_out(tmp_path):
    ei, n = _edge_index(num_nodes=200, num_edges=1000, seed=13)
    x = np.ones((n, 2), np.float32)
    paged, _ = _paged(tmp_path, ei, n, x)
    sub = next(iter(_loader(paged)))
    assert torch.equal(sub.x, torch.ones(sub.num_nodes, 2))
    bare = next(iter(_loader(paged, store_fields=False)))
    assert "x" not in bare and torch.equal(bare.n_id, sub.n_id)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), e=st.integers(0, 160), seed=st.integers(0, 2 ** 16),
       fanouts=st.lists(st.integers(-1, 4), min_size=1, max_size=3),
       batch=st.integers(1, 12), replace=st.booleans(), int32=st.booleans())
def test_any_graph_keeps_the_rules(n, e, seed, fanouts, batch, replace, int32):
    """Random small graphs (isolated nodes, duplicates, self loops; int32 or int64 ids),
    fan-outs (-1, 0 included), batch sizes, with and without replacement."""
    rng = np.random.default_rng(seed)
    ei = torch.from_numpy(rng.integers(0, n, (2, e)))
    g = tg.Graph.from_edge_index(ei.int() if int32 else ei, num_nodes=n)
    loader = _loader(g, num_neighbors=fanouts, batch_size=batch, replace=replace, seed=seed)
    seeds = []
    for sub in loader:
        _check_batch(sub, ei, n, fanouts, replace=replace)
        seeds.append(sub.n_id[:sub.batch_size])
    assert torch.equal(torch.sort(torch.cat(seeds)).values, torch.arange(n))


def test_graph_without_edges_and_empty_inputs():
    g = tg.Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.int64), num_nodes=5)
    subs = list(_loader(g, batch_size=2))
    assert [s.batch_size for s in subs] == [2, 2, 1]
    assert all(s.num_edges == 0 and s.num_sampled_nodes == [s.batch_size, 0, 0] for s in subs)
    assert list(_loader(g, input_nodes=torch.zeros(0, dtype=torch.int64))) == []
