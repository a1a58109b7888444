"""Issue 40's thirteen more layers, each two ways over random hostile graphs (isolated
nodes, duplicate edges, existing and doubled self loops, no edges, int32 indices):

- against a dense-torch oracle written here from the layer's formula over a dense
  adjacency (needs no PyG, so the file checks something without it);
- against PyG with its state dict loaded, float32: outputs and the gradients of inputs
  (edge weights included) and parameters;

and against PyG on random bipartite relations (sources and destinations of their own
widths and counts, x_dst None with size=), with flow="target_to_source", with a tg.Graph
for the relation, and TransformerConv's attention weights and RGCNConv's featureless input
and typed-relation memo.

Where PyG's gradient is not the derivative it is not the reference: for the GCN-normalised
layers a node's doubled self loop keeps only its last copy's weight (as PyG), so the other
copies' weights do not reach the output and their gradient is 0; PyG's backward hands them
the kept copy's gradient. Those entries are checked to be 0 here (the output does not
read them, so 0 is the derivative) and left out of the comparison with PyG.
"""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

torch = pytest.importorskip("torch")

SEEDS = range(8)   # every feature of hostile() below (no edges: seed 3); issue 40 asks 20
RTOL, ATOL = 1e-4, 1e-5       # float32


def hostile(seed: int) -> tuple:
    """(edge_index, num_nodes) of a random hostile graph: no edges on seed 3, doubled self
    loops on multiples of 3, duplicate edges on even seeds, an extra isolated node on
    seeds 1 mod 4, int32 indices on odd seeds."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    e = 0 if seed % 7 == 3 else int(rng.integers(1, 3 * n + 1))
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if e and seed % 3 == 0:
        loop = int(rng.integers(0, n))
        src, dst = np.concatenate([src, [loop, loop]]), np.concatenate([dst, [loop, loop]])
    if e and seed % 2 == 0:
        src, dst = np.concatenate([src, src[:2]]), np.concatenate([dst, dst[:2]])
    dtype = torch.int32 if seed % 2 else torch.int64
    return torch.tensor(np.stack([src, dst]), dtype=dtype), n + int(seed % 4 == 1)


def _t(*shape, seed: int = 1, dtype=torch.float64, positive: bool = False):
    t = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return t.abs() + 0.1 if positive else t


# ---- dense oracles ----------------------------------------------------------------------------

def dense(ei, n: int, w=None) -> torch.Tensor:
    """A[i, j] = sum of the weights of the edges j -> i (duplicates add)."""
    w = torch.ones(ei.size(1), dtype=torch.float64) if w is None else w
    a = torch.zeros(n, n, dtype=w.dtype)
    return a.index_put((ei[1].long(), ei[0].long()), w, accumulate=True)


def gcn_dense(ei, n: int, w=None, loops: bool = True, fill: float = 1.0) -> torch.Tensor:
    """PyG's gcn_norm as a dense matrix: D^-1/2 (A + remaining loops) D^-1/2, a node's
    existing loop keeping its last copy's weight, D the weighted in-degree."""
    w = torch.ones(ei.size(1), dtype=torch.float64) if w is None else w
    src, dst = ei[0].long(), ei[1].long()
    if loops:
        diag = torch.full((n,), fill, dtype=w.dtype)
        for k in range(ei.size(1)):       # edge order: the last copy wins
            if src[k] == dst[k]:
                diag = diag.index_put((src[k:k + 1],), w[k:k + 1])
        keep = src != dst
        a = dense(ei[:, keep], n, w[keep]) + torch.diag(diag)
    else:
        a = dense(ei, n, w)
    dis = a.sum(1).pow(-0.5)
    dis = dis.masked_fill(torch.isinf(dis), 0.0)
    return dis[:, None] * a * dis[None, :]


def dropped_loops(ei) -> torch.Tensor:
    """Mask of the self-loop copies that PyG's remaining-loops edit drops (all but the
    last per node)."""
    src, dst = ei[0].long(), ei[1].long()
    out = torch.zeros(ei.size(1), dtype=torch.bool)
    seen = set()
    for k in reversed(range(ei.size(1))):
        if src[k] == dst[k]:
            out[k] = int(src[k]) in seen
            seen.add(int(src[k]))
    return out


# ---- the layers: tg.nn and PyG built alike, a call, inputs, and a dense formula ----------------

def _sg(lib):
    return lib.SGConv(4, 3, K=2)


def _sg_dense(m, x, ei, w):
    a = gcn_dense(ei, x.size(0), w)
    return m.lin(a @ (a @ x))


def _appnp(lib):
    return lib.APPNP(K=3, alpha=0.2)


def _appnp_dense(m, x, ei, w):
    a, h = gcn_dense(ei, x.size(0), w), x
    for _ in range(3):
        h = 0.8 * (a @ h) + 0.2 * x
    return h


def _tag(lib):
    return lib.TAGConv(4, 3, K=2)


def _tag_dense(m, x, ei, w):
    a = gcn_dense(ei, x.size(0), w, loops=False)
    return m.lins[0](x) + m.lins[1](a @ x) + m.lins[2](a @ (a @ x)) + m.bias


def _gcn2(lib):
    return lib.GCN2Conv(4, alpha=0.3, theta=0.5, layer=2, shared_weights=False)


def _gcn2_dense(m, x, ei, w):
    h = 0.7 * (gcn_dense(ei, x.size(0), w) @ x)
    x0 = 0.3 * x.flip(0)
    b = float(np.log(0.5 / 2 + 1))
    return (1 - b) * h + b * h @ m.weight1 + (1 - b) * x0 + b * x0 @ m.weight2


def _gcn2_shared(lib):
    return lib.GCN2Conv(4, alpha=0.1)


def _gcn2_shared_dense(m, x, ei, w):
    """beta = 1 (no theta, layer): x' = ((1 - alpha) A_hat x + alpha x_0) W1."""
    p = 0.9 * (gcn_dense(ei, x.size(0), w) @ x) + 0.1 * x.flip(0)
    return p @ m.weight1


def _gcn2_call(m, x, ei, w):
    return m(x, x.flip(0), ei, w)


def _plain_call(m, x, ei, w):
    return m(x, ei, w)


def _graph(lib, aggr="add"):
    return lib.GraphConv(4, 3, aggr=aggr)


def _graph_dense(m, x, ei, w):
    return m.lin_rel(dense(ei, x.size(0), w) @ x) + m.lin_root(x)


def _graph_mean_dense(m, x, ei, w):
    count = dense(ei, x.size(0)).sum(1, keepdim=True).clamp(min=1)
    return m.lin_rel(dense(ei, x.size(0), w) @ x / count) + m.lin_root(x)


def _graph_max_dense(m, x, ei, w):
    src, dst = ei[0].long(), ei[1].long()
    w = torch.ones(ei.size(1), dtype=x.dtype) if w is None else w
    msg = w[:, None] * x[src]
    agg = _per_dst(x.size(0), dst, lambda k: msg[k].max(0).values, 4, x.dtype)
    return m.lin_rel(agg) + m.lin_root(x)


def _cheb(lib):
    return lib.ChebConv(4, 3, K=3)


def _cheb_call(m, x, ei, w):
    return m(x, ei, w, lambda_max=3.0)


def _cheb_dense(m, x, ei, w):
    """L_hat = 2 L / 3 - I, L = I - D^-1/2 A D^-1/2 without loops, D by source."""
    w = torch.ones(ei.size(1), dtype=x.dtype) if w is None else w
    keep = ei[0] != ei[1]
    a = dense(ei[:, keep], x.size(0), w[keep])
    dis = a.sum(0).pow(-0.5)
    dis = dis.masked_fill(torch.isinf(dis), 0.0)
    eye = torch.eye(x.size(0), dtype=x.dtype)
    lap = eye - dis[:, None] * a * dis[None, :]
    l_hat = 2.0 * lap / 3.0 - eye
    t0, t1 = x, l_hat @ x
    t2 = 2.0 * l_hat @ t1 - t0
    return m.lins[0](t0) + m.lins[1](t1) + m.lins[2](t2) + m.bias


def _gated(lib):
    return lib.ResGatedGraphConv(4, 3, edge_dim=2)


def _gated_call(m, x, ei, e):
    return m(x, ei, e)


def _gated_dense(m, x, ei, e):
    """Per edge in plain torch: sigmoid(lin_key([x_i, e]) + lin_query([x_j, e]))
    * lin_value([x_j, e]), summed into i."""
    src, dst = ei[0].long(), ei[1].long()
    gate = torch.sigmoid(m.lin_key(torch.cat([x[dst], e], -1)) +
                         m.lin_query(torch.cat([x[src], e], -1)))
    msg = gate * m.lin_value(torch.cat([x[src], e], -1))
    out = torch.zeros(x.size(0), msg.size(1), dtype=x.dtype).index_add(0, dst, msg)
    return out + m.lin_skip(x) + m.bias


def _per_dst(n: int, dst, fn, width: int, dtype):
    """Rows i = fn(mask of i's incoming edges), stacked; zeros without edges."""
    rows = [fn(dst == i) if bool((dst == i).any()) else torch.zeros(width, dtype=dtype)
            for i in range(n)]
    return torch.stack(rows) if rows else torch.zeros(0, width, dtype=dtype)


def _transformer(lib):
    return lib.TransformerConv(4, 3, heads=2, beta=True, edge_dim=2)


def _transformer_dense(m, x, ei, e):
    """Per edge and per destination in plain torch: scaled dot-product softmax."""
    src, dst = ei[0].long(), ei[1].long()
    q = m.lin_query(x).view(-1, 2, 3)
    ee = m.lin_edge(e).view(-1, 2, 3)
    k, v = m.lin_key(x).view(-1, 2, 3)[src] + ee, m.lin_value(x).view(-1, 2, 3)[src] + ee
    score = (q[dst] * k).sum(-1) / 3 ** 0.5

    def attend(mask):
        alpha = torch.softmax(score[mask], dim=0)
        return (alpha[:, :, None] * v[mask]).sum(0).reshape(-1)

    out = _per_dst(x.size(0), dst, attend, 6, x.dtype)
    skip = m.lin_skip(x)
    b = torch.sigmoid(m.lin_beta(torch.cat([out, skip, out - skip], -1)))
    return b * skip + (1 - b) * out


def _nn(lib):
    return lib.NNConv(4, 3, torch.nn.Linear(2, 12), aggr="add")


def _nn_dense(m, x, ei, e):
    src, dst = ei[0].long(), ei[1].long()
    msg = torch.einsum("ef,efo->eo", x[src], m.nn(e).view(-1, 4, 3))
    out = torch.zeros(x.size(0), 3, dtype=x.dtype).index_add(0, dst, msg)
    return out + m.lin(x) + m.bias


def _point(lib):
    return lib.PointNetConv(torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(),
                                                torch.nn.Linear(5, 3)),
                            torch.nn.Linear(3, 3))


def _point_call(m, x, ei, w):
    return m(x, x[:, :3].flip(-1), ei)


def _point_dense(m, x, ei, w):
    """Self loops replaced by one per node, then the max of local_nn's messages."""
    pos = x[:, :3].flip(-1)
    keep = ei[0] != ei[1]
    loops = torch.arange(x.size(0)).expand(2, -1)
    src, dst = torch.cat([ei[:, keep].long(), loops], dim=1)
    msg = m.local_nn(torch.cat([x[src], pos[src] - pos[dst]], -1))
    return m.global_nn(_per_dst(x.size(0), dst, lambda k: msg[k].max(0).values, 3, x.dtype))


# ---- PNAConv ----------------------------------------------------------------------------------

PNA_AGGRS = ["sum", "mean", "min", "max", "var", "std"]
PNA_SCALERS = ["identity", "amplification", "attenuation", "linear", "inverse_linear"]
PNA_DEG = torch.tensor([1, 2, 4, 1])


def _pna(lib):
    return lib.PNAConv(4, 6, PNA_AGGRS, PNA_SCALERS, deg=PNA_DEG, edge_dim=2, towers=2,
                       pre_layers=2, post_layers=2, divide_input=True)


def _pna_dense(m, x, ei, e):
    """Per destination in plain torch: the six aggregators of the tower messages, scaled
    by the in-degree against the histogram's means."""
    src, dst = ei[0].long(), ei[1].long()
    n = x.size(0)
    h = x.view(n, 2, 2)
    enc = m.edge_encoder(e).view(-1, 1, 2).expand(-1, 2, 2)
    z = torch.cat([h[dst], h[src], enc], -1)
    msg = torch.stack([nn(z[:, i]) for i, nn in enumerate(m.pre_nns)], 1)
    bins = torch.arange(4, dtype=x.dtype)
    avg_lin, avg_log = m.aggr_module.avg_deg_lin, m.aggr_module.avg_deg_log   # (float32)
    assert abs(float(avg_lin) - float((bins * PNA_DEG).sum() / PNA_DEG.sum())) < 1e-7
    mean_log = ((bins + 1).log() * PNA_DEG).sum() / PNA_DEG.sum()
    assert abs(float(avg_log) - float(mean_log)) < 1e-7

    def aggregate(mask):
        g = msg[mask]
        var = (g * g).mean(0) - g.mean(0) ** 2
        std = var.clamp(min=1e-5).sqrt()
        std = std.masked_fill(std <= 1e-5 ** 0.5, 0.0)
        return torch.cat([g.sum(0), g.mean(0), g.min(0).values, g.max(0).values, var, std],
                         -1).reshape(-1)

    agg = _per_dst(n, dst, aggregate, 2 * 12, x.dtype).view(n, 2, 12)
    d = torch.bincount(dst, minlength=n).to(x.dtype).clamp(min=1).view(-1, 1, 1)
    lg = (d + 1).log()
    scaled = torch.cat([agg, agg * lg / avg_log, agg * avg_log / lg, agg * d / avg_lin,
                        agg * avg_lin / d], -1)
    out = torch.cat([h, scaled], -1)
    return m.lin(torch.cat([nn(out[:, i]) for i, nn in enumerate(m.post_nns)], 1))



def _gen_softmax(lib):
    return lib.GENConv(4, 3, aggr="softmax", t=0.7, learn_t=True, msg_norm=True,
                       learn_msg_scale=True, norm="layer", bias=True, edge_dim=2)


def _gen_power(lib):
    return lib.GENConv(4, 3, aggr="powermean", p=1.5, learn_p=True, norm="layer",
                       num_layers=3)


def _gen_power_call(m, x, ei, w):
    return m(x, ei)


def _gen_dense(m, x, ei, e):
    """Per destination in plain torch: messages relu(x_j W_src + e_ji W_edge) + eps, the
    softmax (temperature t) or power-mean (power p) aggregate, message norm, root, MLP."""
    src, dst = ei[0].long(), ei[1].long()
    h = m.lin_src(x)
    msg = h[src] if e is None else h[src] + m.lin_edge(e)
    msg = msg.relu() + 1e-7
    if hasattr(m.aggr_module, "t"):
        t = m.aggr_module.t

        def aggregate(mask):
            return (torch.softmax(t * msg[mask], dim=0) * msg[mask]).sum(0)
    else:
        p = m.aggr_module.p

        def aggregate(mask):
            mean = msg[mask].clamp(1e-4, 100).pow(p).mean(0)
            return mean.clamp(1e-4, 100).pow(1 / p)

    out = _per_dst(x.size(0), dst, aggregate, 3, x.dtype)
    if not hasattr(m.aggr_module, "t"):     # no messages: mean 0, clamped, then the root
        empty = torch.bincount(dst, minlength=x.size(0)) == 0
        out[empty] = 1e-4 ** (1 / m.aggr_module.p)
    if hasattr(m, "msg_norm"):
        scale = x.norm(dim=-1, keepdim=True) * m.msg_norm.scale
        out = torch.nn.functional.normalize(out, dim=-1) * scale
    return m.mlp(out + m.lin_dst(x))


# name: (constructor, call, dense formula, whether a doubled loop's copies are dropped,
# edge feature width: 0 for (E,) weights)
LAYERS = {
    "SGConv": (_sg, _plain_call, _sg_dense, True, 0),
    "APPNP": (_appnp, _plain_call, _appnp_dense, True, 0),
    "TAGConv": (_tag, _plain_call, _tag_dense, False, 0),
    "GCN2Conv": (_gcn2, _gcn2_call, _gcn2_dense, True, 0),
    "GCN2Conv-shared": (_gcn2_shared, _gcn2_call, _gcn2_shared_dense, True, 0),
    "GraphConv": (_graph, _plain_call, _graph_dense, False, 0),
    "GraphConv-mean": (lambda lib: _graph(lib, "mean"), _plain_call, _graph_mean_dense,
                       False, 0),
    "GraphConv-max": (lambda lib: _graph(lib, "max"), _plain_call, _graph_max_dense, False,
                      0),
    "ChebConv": (_cheb, _cheb_call, _cheb_dense, False, 0),
    "ResGatedGraphConv": (_gated, _gated_call, _gated_dense, False, 2),
    "TransformerConv": (_transformer, _gated_call, _transformer_dense, False, 2),
    "NNConv": (_nn, _gated_call, _nn_dense, False, 2),
    "PointNetConv": (_point, _point_call, _point_dense, False, 0),
    "PNAConv": (_pna, _gated_call, _pna_dense, False, 2),
    "GENConv-softmax": (_gen_softmax, _gated_call, _gen_dense, False, 2),
    "GENConv-powermean": (_gen_power, _gen_power_call,
                          lambda m, x, ei, w: _gen_dense(m, x, ei, None), False, 0),
}


def _inputs(seed: int, dtype, width: int = 0):
    ei, n = hostile(seed)
    x = _t(n, 4, seed=seed, dtype=dtype)
    shape = (ei.size(1), width) if width else (ei.size(1),)
    w = _t(*shape, seed=seed + 100, dtype=dtype, positive=not width)
    return ei, x, w


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_dense_oracle(name, seed):
    """tg.nn's layer (its own initialisation, float64) against the dense formula."""
    make, call, formula, _, width = LAYERS[name]
    ei, x, w = _inputs(seed, torch.float64, width)
    torch.manual_seed(seed)
    layer = make(tg.nn).double()
    for weights in ((w,) if width else (None, w)):
        got = call(layer, x, ei, weights)
        want = formula(layer, x, ei, weights)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def _grads(layer, call, x, ei, w, cot):
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    out = call(layer, leaves[0], ei, leaves[1])
    names = sorted(n for n, _ in layer.named_parameters())
    params = [dict(layer.named_parameters())[n] for n in names]
    grads = torch.autograd.grad((out * cot).sum(), leaves + params, allow_unused=True,
                                materialize_grads=True)
    return out.detach(), grads


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_matches_pyg(name, seed):
    """PyG's state dict loaded; outputs and gradients equal at float32 tolerance (int32
    edge_index to tg.nn as it is, to PyG as int64)."""
    pyg = pytest.importorskip("torch_geometric.nn")
    make, call, _, drops, width = LAYERS[name]
    ei, x, w = _inputs(seed, torch.float32, width)
    torch.manual_seed(seed)
    theirs = make(pyg)
    with torch.no_grad():
        for key, p in theirs.named_parameters():
            # (a power mean's p near 0 overflows both layers to inf and nan alike)
            p.copy_(1.3 + 0.1 * torch.randn(p.shape) if key == "aggr_module.p" else
                    0.5 * torch.randn(p.shape))
    ours = make(tg.nn)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    out = call(theirs, x, ei.long(), w)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    want, want_g = _grads(theirs, call, x, ei.long(), w, cot)
    got, got_g = _grads(ours, call, x, ei, w, cot)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    dropped = dropped_loops(ei) if drops else torch.zeros(ei.size(1), dtype=torch.bool)
    assert torch.all(got_g[1][dropped] == 0)
    torch.testing.assert_close(got_g[1][~dropped], want_g[1][~dropped], rtol=RTOL, atol=ATOL)
    for i, (g, v) in enumerate(zip(got_g, want_g)):
        if i != 1:
            torch.testing.assert_close(g, v, rtol=RTOL, atol=ATOL,
                                       msg=lambda m, i=i: f"grad {i}: {m}")


@pytest.mark.parametrize("seed", [0, 3, 4])
def test_transformer_attention_weights(seed):
    """return_attention_weights=True: PyG's (edge_index, alpha), and `out` the plain
    forward's bit for bit."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, e = _inputs(seed, torch.float32, 2)
    theirs = _transformer(pyg)
    ours = _transformer(tg.nn)
    ours.load_state_dict(theirs.state_dict())
    out, (where, alpha) = ours(x, ei, e, return_attention_weights=True)
    want, (want_where, want_alpha) = theirs(x, ei.long(), e, return_attention_weights=True)
    assert torch.equal(out, ours(x, ei, e))
    torch.testing.assert_close(out, want, rtol=RTOL, atol=ATOL)
    assert torch.equal(where, want_where)
    torch.testing.assert_close(alpha, want_alpha, rtol=RTOL, atol=ATOL)


# ---- RGCNConv: typed edges ---------------------------------------------------------------------

RGCN = {"plain": {}, "bases": {"num_bases": 2}, "blocks": {"num_blocks": 2},
        "sum": {"aggr": "sum"}}


def _rgcn_dense(m, x, ei, types):
    """sum_r mean_{j -> i of type r} x_j W_r + x_i Root + bias, dense per relation."""
    weight = m.weight
    if m.num_bases is not None:
        weight = torch.einsum("rb,bio->rio", m.comp, m.weight)
    elif m.num_blocks is not None:
        weight = torch.stack([torch.block_diag(*w) for w in m.weight])
    n = x.size(0)
    out = x @ m.root + m.bias
    for r in range(m.num_relations):
        a = dense(ei[:, types == r], n)
        if m.aggr == "mean":
            a = a / a.sum(1, keepdim=True).clamp(min=1)
        out = out + a @ x @ weight[r]
    return out


def _rgcn_inputs(seed, dtype):
    ei, x, _ = _inputs(seed, dtype)
    types = torch.randint(0, 3, (ei.size(1),), generator=torch.Generator().manual_seed(seed))
    return ei, x, types


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", sorted(RGCN))
def test_rgcn_dense_oracle(config, seed):
    ei, x, types = _rgcn_inputs(seed, torch.float64)
    torch.manual_seed(seed)
    layer = tg.nn.RGCNConv(4, 6, 3, **RGCN[config]).double()
    with torch.no_grad():
        layer.bias.normal_()
    torch.testing.assert_close(layer(x, ei, types), _rgcn_dense(layer, x, ei, types),
                               rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", sorted(RGCN))
def test_rgcn_matches_pyg(config, seed):
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, types = _rgcn_inputs(seed, torch.float32)
    torch.manual_seed(seed)
    theirs = pyg.RGCNConv(4, 6, 3, **RGCN[config])
    with torch.no_grad():
        theirs.bias.normal_()
    ours = tg.nn.RGCNConv(4, 6, 3, **RGCN[config])
    ours.load_state_dict(theirs.state_dict())
    cot = torch.randn(x.size(0), 6, generator=torch.Generator().manual_seed(seed))

    def call(m, x, ei, w):
        return m(x, ei, types)

    want, want_g = _grads(theirs, call, x, ei.long(), x.new_zeros(1), cot)
    got, got_g = _grads(ours, call, x, ei, x.new_zeros(1), cot)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    for i, (g, v) in enumerate(zip(got_g, want_g)):
        torch.testing.assert_close(g, v, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, i=i: f"grad {i}: {m}")


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_rgcn_featureless_matches_pyg(seed):
    """x None (node indices): x_j W_r is row j of W_r."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, types = _rgcn_inputs(seed, torch.float32)
    n = x.size(0)
    theirs = pyg.RGCNConv(n, 5, 3, num_bases=2)
    ours = tg.nn.RGCNConv(n, 5, 3, num_bases=2)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(None, ei, types), theirs(None, ei.long(), types),
                               rtol=RTOL, atol=ATOL)
    idx = torch.arange(n)
    torch.testing.assert_close(ours(idx, ei, types), theirs(idx, ei.long(), types),
                               rtol=RTOL, atol=ATOL)



# ---- bipartite inputs, flow, a tg.Graph relation ---------------------------------------------

def _bipartite(seed: int) -> tuple:
    """(edge_index, sources, destinations) of a random bipartite relation with duplicate
    edges, sources without edges and destinations without edges (int32 on odd seeds)."""
    rng = np.random.default_rng(seed)
    s, n = int(rng.integers(1, 9)), int(rng.integers(1, 7))
    e = 0 if seed == 3 else int(rng.integers(1, 3 * max(s, n)))
    src, dst = rng.integers(0, s, e), rng.integers(0, n, e)
    src, dst = np.concatenate([src, src[:2]]), np.concatenate([dst, dst[:2]])
    dtype = torch.int32 if seed % 2 else torch.int64
    return torch.tensor(np.stack([src, dst]), dtype=dtype), s, n


BIPARTITE = {
    "GraphConv": (lambda lib: lib.GraphConv((4, 3), 5, aggr="mean"),
                  lambda m, a, b, ei, e: m((a, b), ei, e[:, 0])),
    "GraphConv-no-dst": (lambda lib: lib.GraphConv((4, 3), 5),
                         lambda m, a, b, ei, e: m((a, None), ei, e[:, 0],
                                                  size=(a.size(0), b.size(0)))),
    "ResGatedGraphConv": (lambda lib: lib.ResGatedGraphConv((4, 3), 5, edge_dim=2),
                          lambda m, a, b, ei, e: m((a, b), ei, e)),
    "TransformerConv": (lambda lib: lib.TransformerConv((4, 3), 5, heads=2, edge_dim=2,
                                                        concat=False, beta=True),
                        lambda m, a, b, ei, e: m((a, b), ei, e)),
    "NNConv": (lambda lib: lib.NNConv((4, 3), 5, torch.nn.Linear(2, 20), aggr="max"),
               lambda m, a, b, ei, e: m((a, b), ei, e)),
    "GENConv": (lambda lib: lib.GENConv((4, 3), 5, edge_dim=2, norm="layer",
                                        msg_norm=True),
                lambda m, a, b, ei, e: m((a, b), ei, e)),
    "RGCNConv": (lambda lib: lib.RGCNConv((4, 3), 5, 2),
                 lambda m, a, b, ei, e: m((a, b), ei, (e[:, 0] > 0).long())),
    "PointNetConv": (lambda lib: lib.PointNetConv(torch.nn.Linear(7, 5)),
                     lambda m, a, b, ei, e: m(a, (a[:, 1:], b), ei)),
}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", sorted(BIPARTITE))
def test_bipartite_matches_pyg(name, seed):
    """(x_src, x_dst) of their own widths and counts: outputs and the gradients of both
    inputs, the edge features and the parameters."""
    pyg = pytest.importorskip("torch_geometric.nn")
    make, call = BIPARTITE[name]
    ei, s, n = _bipartite(seed)
    a, b = _t(s, 4, seed=seed, dtype=torch.float32), _t(n, 3, seed=seed + 1,
                                                         dtype=torch.float32)
    e = _t(ei.size(1), 2, seed=seed + 2, dtype=torch.float32)
    torch.manual_seed(seed)
    theirs = make(pyg)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.5 * torch.randn(p.shape))
    ours = make(tg.nn)
    ours.load_state_dict(theirs.state_dict())

    def run(layer, edges):
        leaves = [t.clone().requires_grad_() for t in (a, b, e)]
        out = call(layer, *leaves[:2], edges, leaves[2])
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        params = [p for _, p in sorted(layer.named_parameters()) if p.requires_grad]
        return out, torch.autograd.grad((out * cot).sum(), leaves + params,
                                        allow_unused=True, materialize_grads=True)

    got, got_g = run(ours, ei)
    want, want_g = run(theirs, ei.long())
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    for i, (g, v) in enumerate(zip(got_g, want_g)):
        torch.testing.assert_close(g, v, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, i=i: f"grad {i}: {m}")


FLOW = {
    "GraphConv": lambda lib: lib.GraphConv(4, 3, flow="target_to_source"),
    "SGConv": lambda lib: lib.SGConv(4, 3, K=2, flow="target_to_source"),
    "APPNP": lambda lib: lib.APPNP(2, 0.3, flow="target_to_source"),
    "TAGConv": lambda lib: lib.TAGConv(4, 3, K=2, flow="target_to_source"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(FLOW))
def test_flow_target_to_source_matches_pyg(name, seed):
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, w = _inputs(seed, torch.float32)
    torch.manual_seed(seed)
    theirs = FLOW[name](pyg)
    ours = FLOW[name](tg.nn)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x, ei, w), theirs(x, ei.long(), w), rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_tg_graph_relation_is_the_edge_index(name):
    """A tg.Graph built from the edge_index gives the edge_index's outputs."""
    make, call, _, _, width = LAYERS[name]
    ei, x, w = _inputs(4, torch.float64, width)
    graph = tg.Graph.from_edge_index(ei.numpy(), num_nodes=x.size(0))
    torch.manual_seed(0)
    layer = make(tg.nn).double()
    torch.testing.assert_close(call(layer, x, graph, w), call(layer, x, ei, w), rtol=1e-12,
                               atol=1e-12)


def test_rgcn_edge_type_edited_in_place_is_not_served_stale():
    """The typed relation is memoised per edge_type tensor; an edit through .data (which
    keeps the version counter) builds it anew."""
    ei, x, types = _rgcn_inputs(0, torch.float64)
    layer = tg.nn.RGCNConv(4, 6, 3).double()
    first = layer(x, ei, types)
    assert torch.equal(layer(x, ei, types), first)
    types.data[:] = (types.data + 1) % 3
    torch.testing.assert_close(layer(x, ei, types), _rgcn_dense(layer, x, ei, types),
                               rtol=1e-9, atol=1e-11)
    assert not torch.allclose(layer(x, ei, types), first)


@pytest.mark.parametrize("name", ["APPNP", "TransformerConv"])
def test_training_dropout_draws_pyg_mask(name):
    """dropout > 0 in training: F.dropout's draw on the same edges in the same order, so
    the same torch seed gives PyG's mask and PyG's outputs (and gradients)."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, e = _inputs(0, torch.float32, 2)

    def make(lib):
        if name == "APPNP":
            return lib.APPNP(3, 0.1, dropout=0.5)
        return lib.TransformerConv(4, 3, heads=2, dropout=0.5, edge_dim=2)

    theirs, ours = make(pyg), make(tg.nn)
    ours.load_state_dict(theirs.state_dict())
    outs = []
    for layer, edges in ((ours, ei), (theirs, ei.long())):
        torch.manual_seed(4)
        leaf = x.clone().requires_grad_()
        out = layer(leaf, edges) if name == "APPNP" else layer(leaf, edges, e)
        out.sum().backward()
        outs.append((out.detach(), leaf.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_graph_without_nodes(name):
    """x (0, F) and no edges: a (0, C) output, PyG's shape where PyG is installed."""
    make, call, _, _, width = LAYERS[name]
    ei = torch.zeros(2, 0, dtype=torch.int64)
    x = torch.zeros(0, 4)
    w = torch.zeros(0, width) if width else torch.zeros(0)
    out = call(make(tg.nn), x, ei, w)
    assert out.size(0) == 0
    try:
        import torch_geometric.nn as pyg
    except ImportError:
        return
    assert out.shape == call(make(pyg), x, ei, w).shape


@pytest.mark.parametrize("config", sorted(RGCN))
def test_rgcn_graph_without_nodes(config):
    layer = tg.nn.RGCNConv(4, 6, 3, **RGCN[config])
    out = layer(torch.zeros(0, 4), torch.zeros(2, 0, dtype=torch.int64),
                torch.zeros(0, dtype=torch.int64))
    assert out.shape == (0, 6)


@pytest.mark.parametrize("how", ["data", "numpy", "index_put"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_in_place_edge_index_edits_are_seen(name, how):
    """An edge_index changed in place between calls (issue 40 item 6: through .data or
    .numpy(), which keep the version counter, or index_put_) is never served stale from
    a memo (relations, PNAConv's and GENConv's edges -> destinations relation)."""
    make, call, _, _, width = LAYERS[name]
    torch.manual_seed(0)
    layer = make(tg.nn).eval()
    x = torch.randn(5, 4)
    ei = torch.tensor([[0, 2, 3, 4], [1, 1, 0, 2]])
    w = torch.rand(4, width) if width else torch.rand(4)
    before = call(layer, x, ei, w)
    if how == "data":
        ei.data[1, 0] = 3
    elif how == "numpy":
        ei.numpy()[1, 0] = 3
    else:
        ei.index_put_((torch.tensor([1]), torch.tensor([0])), torch.tensor(3))
    got = call(layer, x, ei, w)
    assert torch.equal(got, call(layer, x, ei.clone(), w))
    assert not torch.equal(got, before)


@pytest.mark.parametrize("normalization", ["sym", "rw", None])
@pytest.mark.parametrize("seed", [0, 2, 4])
def test_cheb_batched_lambda_matches_pyg(normalization, seed):
    """ChebConv over a batch of graphs with one lambda_max per graph, every normalization:
    outputs and the gradients of x and the edge weights."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, w = _inputs(seed, torch.float32)
    n = x.size(0)
    batch = (torch.arange(n) >= n // 2).long()
    lam = torch.tensor([1.5, 2.5])
    torch.manual_seed(seed)
    theirs = pyg.ChebConv(4, 3, K=3, normalization=normalization)
    ours = tg.nn.ChebConv(4, 3, K=3, normalization=normalization)
    ours.load_state_dict(theirs.state_dict())
    outs = []
    for layer, edges in ((ours, ei), (theirs, ei.long())):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        out = layer(leaves[0], edges, leaves[1], batch, lam)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        outs.append((out, torch.autograd.grad((out * cot).sum(), leaves)))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=RTOL, atol=ATOL)
    for g, v in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(g, v, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_gen_softmax_semi_grad_matches_pyg(seed):
    """aggr="softmax_sg": the softmax weights get no gradient (PyG's semi_grad), so x's
    gradient comes through the weighted messages alone."""
    pyg = pytest.importorskip("torch_geometric.nn")
    ei, x, e = _inputs(seed, torch.float32, 2)

    def make(lib):
        return lib.GENConv(4, 3, aggr="softmax_sg", t=0.6, edge_dim=2, norm="layer")

    theirs, ours = make(pyg), make(tg.nn)
    ours.load_state_dict(theirs.state_dict())
    grads = []
    for layer, edges in ((ours, ei), (theirs, ei.long())):
        leaves = [x.clone().requires_grad_(), e.clone().requires_grad_()]
        out = layer(leaves[0], edges, leaves[1])
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        grads.append((out, *torch.autograd.grad((out * cot).sum(), leaves)))
    for g, v in zip(*grads):
        torch.testing.assert_close(g, v, rtol=RTOL, atol=ATOL)
