"""tg.nn layers against a dense-torch oracle that needs no PyG (issue 41): every other test in
tests/nn compares with PyG's layer and skips (saying so) without torch_geometric; these
compare with the layer's formula written in plain torch over a dense adjacency (counts of
the edges j -> i, so duplicates weigh twice), forward and every gradient (inputs and
parameters, by torch autograd through the dense formula), float64, on PyG's test graph and on
isolated nodes, existing self loops, duplicate edges and no edges. The formulas are PyG's
documented ones, read off its docs rather than its code; see each oracle."""
from __future__ import annotations

import pytest

import tiga as tg

torch = pytest.importorskip("torch")

# as tests/nn/_pyg.py (which needs PyG to import): PyG's layer-test graph and what it misses
_BASE = [[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]
CASES = {
    "pyg": (_BASE, 4),
    "isolated": (_BASE, 6),
    "self_loops": ([_BASE[0] + [1, 3, 3], _BASE[1] + [1, 3, 3]], 4),
    "duplicates": ([_BASE[0] + [0, 0, 2, 2], _BASE[1] + [1, 1, 2, 2]], 5),
    "no_edges": ([[], []], 3),
}
F_IN, F_OUT = 5, 3


def case(name):
    edges, n = CASES[name]
    return torch.tensor(edges, dtype=torch.int64).view(2, -1), n


def counts(ei, n, loops=None):
    """A[i, j] = number of edges j -> i. loops="one": existing self loops dropped and one
    added per node (PyG's add_remaining_self_loops / add_self_loops after remove)."""
    a = torch.zeros(n, n, dtype=torch.float64)
    for j, i in ei.t().tolist():
        if loops == "one" and i == j:
            continue
        a[i, j] += 1.0
    if loops == "one":
        a += torch.eye(n, dtype=torch.float64)
    return a


def randomized(layer, seed=0):
    """The layer in float64 with every floating parameter and buffer redrawn (biases and eps
    non-zero, so that their gradients mean something)."""
    layer = layer.double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in list(layer.parameters()) + list(layer.buffers()):
            if p.is_floating_point():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def assert_matches(layer, oracle, ei, n, *, rtol=1e-10, atol=1e-12, extra=()):
    """layer(x, ei, *extra) == oracle(params, x, *extra) and the gradients of <out, c>
    with respect to x, the extra inputs and every parameter agree."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, F_IN, dtype=torch.float64, generator=gen)
    names = sorted(n for n, p in layer.named_parameters())
    params = dict(layer.named_parameters())

    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, *extra)]
        out = fn(*leaves)
        cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
        wrt = leaves + [params[k] for k in names]
        grads = torch.autograd.grad((out * cot).sum(), wrt, allow_unused=True,
                                    materialize_grads=True)
        return out.detach(), grads

    got, got_g = run(lambda x, *e: layer(x, ei, *e))
    want, want_g = run(lambda x, *e: oracle(params, x, *e))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    labels = ["x"] + [f"input {k}" for k in range(len(extra))] + names
    for label, g, w in zip(labels, got_g, want_g):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, s=label: f"{s}: {m}")


def lin(params, prefix, v):
    w, b = params[f"{prefix}.weight"], params.get(f"{prefix}.bias")
    return v @ w.t() + (0 if b is None else b)


# ---- GCN: D^-1/2 (A + I) D^-1/2 X W^T + b, deg = row sums (in-degree with the loop) -----


GCN_CONFIGS = {"default": {}, "no_loops": {"add_self_loops": False},
               "unnormalized": {"normalize": False}, "no_bias": {"bias": False}}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("config", sorted(GCN_CONFIGS))
def test_gcn(name, config):
    kw = GCN_CONFIGS[config]
    ei, n = case(name)
    layer = randomized(tg.nn.GCNConv(F_IN, F_OUT, **kw))
    loops = "one" if kw.get("add_self_loops", True) and kw.get("normalize", True) else None

    def oracle(p, x):
        a = counts(ei, n, loops)
        if kw.get("normalize", True):
            deg = a.sum(1)
            d = torch.where(deg > 0, deg.clamp(min=1e-300).rsqrt(), torch.zeros_like(deg))
            a = d[:, None] * a * d[None, :]
        out = a @ lin(p, "lin", x)
        return out + p["bias"] if "bias" in p else out
    assert_matches(layer, oracle, ei, n)


# ---- SAGE: lin_l(mean_{j -> i} x_j) + lin_r(x_i) (mean 0 without edges) ---------------


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
def test_sage(name, aggr):
    ei, n = case(name)
    layer = randomized(tg.nn.SAGEConv(F_IN, F_OUT, aggr=aggr))

    def oracle(p, x):
        a = counts(ei, n)
        if aggr == "max":
            big = torch.where(a[:, :, None] > 0, x[None, :, :],
                              torch.full_like(x[None, :, :], -torch.inf))
            h = big.max(1).values
            h = torch.where(torch.isinf(h), torch.zeros_like(h), h)
        else:
            h = a @ x
            if aggr == "mean":
                h = h / a.sum(1, keepdim=True).clamp(min=1)
        return lin(p, "lin_l", h) + lin(p, "lin_r", x)
    assert_matches(layer, oracle, ei, n)


# ---- GraphConv: lin_rel(sum_{j -> i} x_j) + lin_root(x_i) ------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_conv(name):
    ei, n = case(name)
    layer = randomized(tg.nn.GraphConv(F_IN, F_OUT))
    assert_matches(layer, lambda p, x: lin(p, "lin_rel", counts(ei, n) @ x) +
                   lin(p, "lin_root", x), ei, n)


# ---- GIN / GINE: nn((1 + eps) x_i + sum_{j -> i} m_ji) ---------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("train_eps", [False, True])
def test_gin(name, train_eps):
    ei, n = case(name)
    layer = randomized(tg.nn.GINConv(torch.nn.Linear(F_IN, F_OUT), eps=0.25,
                                     train_eps=train_eps))
    eps = dict(layer.named_buffers()).get("eps")

    def oracle(p, x):
        e = p["eps"] if "eps" in p else eps
        return lin(p, "nn", (1 + e) * x + counts(ei, n) @ x)
    assert_matches(layer, oracle, ei, n)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gine(name):
    ei, n = case(name)
    layer = randomized(tg.nn.GINEConv(torch.nn.Linear(F_IN, F_OUT), edge_dim=2,
                                      train_eps=True))
    ea = torch.randn(ei.size(1), 2, dtype=torch.float64,
                     generator=torch.Generator().manual_seed(3))

    def oracle(p, x, ea):
        msg = torch.relu(x[ei[0]] + lin(p, "lin", ea))
        agg = torch.zeros_like(x).index_add(0, ei[1], msg)
        return lin(p, "nn", (1 + p["eps"]) * x + agg)

    def call(x, ea):
        return layer(x, ei, ea)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, F_IN, dtype=torch.float64, generator=gen)
    _compare(layer, call, oracle, (x, ea))


def _compare(layer, call, oracle, inputs, rtol=1e-10, atol=1e-12):
    params = dict(layer.named_parameters())
    names = sorted(params)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*leaves)
        cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
        grads = torch.autograd.grad((out * cot).sum(), leaves + [params[k] for k in names],
                                    allow_unused=True, materialize_grads=True)
        return out.detach(), grads
    got, got_g = run(call)
    want, want_g = run(lambda *v: oracle(params, *v))
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    for label, g, w in zip([f"input {k}" for k in range(len(inputs))] + names, got_g, want_g):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, s=label: f"{s}: {m}")


# ---- GAT / GATv2: softmax over i's in-edges (one self loop per node) of the scores --------


def _softmax_rows(a, scores):
    """alpha[i, j, h] = a_ij exp(s_ijh) / sum_j a_ij exp(s_ijh) (0 where a row is empty)."""
    s = torch.where(a[:, :, None] > 0, scores, torch.full_like(scores, -torch.inf))
    top = s.max(1, keepdim=True).values
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = a[:, :, None] * torch.exp(s - top)
    return w / w.sum(1, keepdim=True).clamp(min=1e-300)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("heads,concat", [(1, True), (2, True), (2, False)])
def test_gat(name, heads, concat):
    ei, n = case(name)
    layer = randomized(tg.nn.GATConv(F_IN, F_OUT, heads=heads, concat=concat))

    def oracle(p, x):
        h = lin(p, "lin", x).view(n, heads, F_OUT)
        a_src, a_dst = (h * p["att_src"]).sum(-1), (h * p["att_dst"]).sum(-1)
        scores = torch.nn.functional.leaky_relu(a_dst[:, None, :] + a_src[None, :, :], 0.2)
        alpha = _softmax_rows(counts(ei, n, "one"), scores)               # (i, j, H)
        out = torch.einsum("ijh,jhc->ihc", alpha, h)
        out = out.reshape(n, heads * F_OUT) if concat else out.mean(1)
        return out + p["bias"]
    assert_matches(layer, oracle, ei, n)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("heads", [1, 2])
def test_gatv2(name, heads):
    ei, n = case(name)
    layer = randomized(tg.nn.GATv2Conv(F_IN, F_OUT, heads=heads))

    def oracle(p, x):
        xl = lin(p, "lin_l", x).view(n, heads, F_OUT)
        xr = lin(p, "lin_r", x).view(n, heads, F_OUT)
        z = torch.nn.functional.leaky_relu(xr[:, None] + xl[None, :], 0.2)   # (i, j, H, C)
        scores = (z * p["att"][0]).sum(-1)
        alpha = _softmax_rows(counts(ei, n, "one"), scores)
        out = torch.einsum("ijh,jhc->ihc", alpha, xl).reshape(n, heads * F_OUT)
        return out + p["bias"]
    assert_matches(layer, oracle, ei, n)


# ---- EdgeConv: max_{j -> i} nn([x_i, x_j - x_i]) (0 without edges) ---------------------


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("aggr", ["max", "mean", "add"])
def test_edge_conv(name, aggr):
    ei, n = case(name)
    layer = randomized(tg.nn.EdgeConv(torch.nn.Linear(2 * F_IN, F_OUT), aggr=aggr))

    def oracle(p, x):
        a = counts(ei, n)
        pair = torch.cat([x[:, None].expand(n, n, F_IN),
                          x[None, :] - x[:, None]], -1)                      # (i, j, 2F)
        m = lin(p, "nn", pair)                                               # (i, j, F_OUT)
        if aggr == "max":
            big = torch.where(a[:, :, None] > 0, m, torch.full_like(m, -torch.inf))
            out = big.max(1).values
            return torch.where(torch.isinf(out), torch.zeros_like(out), out)
        out = (a[:, :, None] * m).sum(1)
        return out / a.sum(1, keepdim=True).clamp(min=1) if aggr == "mean" else out
    assert_matches(layer, oracle, ei, n)


def test_the_oracle_can_fail():
    """A wrong oracle (GCN without the self loop) is told apart: the comparison is live."""
    ei, n = case("pyg")
    layer = randomized(tg.nn.GCNConv(F_IN, F_OUT))

    def wrong(p, x):
        a = counts(ei, n)
        d = a.sum(1).clamp(min=1).rsqrt()
        return (d[:, None] * a * d[None, :]) @ lin(p, "lin", x) + p["bias"]
    with pytest.raises(AssertionError):
        assert_matches(layer, wrong, ei, n)
