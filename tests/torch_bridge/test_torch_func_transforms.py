"""torch.func over a Tiga call runs Tiga's own rules (issue 38 item 4).

torch.func.vmap runs Tiga's batched program (one run, one propagate, not B), forward mode
(torch.func.jvp, jacfwd, torch.autograd.forward_ad) Tiga's JVP program, and second
derivatives (hessian, grad of grad, create_graph) Tiga's VJP / JVP programs of derived
programs. Oracles: the same functions of the same message passing written in torch
(index_add / scatter_reduce over the explicit edge list, or a dense adjacency matmul for
GCNConv), under the same torch.func transform, in float64. Every test runs in strict mode:
no derived program may fall back to the reference interpreter.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch.func import (  # noqa: E402
    functional_call,
    grad,
    hessian,
    jacfwd,
    jacrev,
    jvp,
    vjp,
    vmap,
)
from torch.utils._pytree import tree_leaves  # noqa: E402

import tiga as tg  # noqa: E402
from tiga.core.prims.graph import propagate_p  # noqa: E402
from tiga.torch_bridge import autograd  # noqa: E402
from tiga.torch_bridge import program_node as bridge  # noqa: E402

N, E, F, B = 5, 11, 3, 4


@pytest.fixture(autouse=True)
def strict():
    old = tg.config.strict
    tg.config.strict = True
    yield
    tg.config.strict = old


def relation(seed=0):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, N - 1, E))          # destination N-1 has no edges
    src = rng.integers(0, N, E)
    src[:2], dst[:2] = 1, 0                            # a duplicate edge
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))])
    return (tg.Graph.from_csr(row_ptr, src, num_src=N), torch.as_tensor(src),
            torch.as_tensor(dst))


GRAPH, SRC, DST = relation()
REDUCERS = ("sum", "mean", "max", "online_softmax")


def reducer_layer(name):
    class Layer(tg.MessagePassing):
        reducer = getattr(tg, name)()

        def edge(self, src, dst, edge, scale):
            if name == "online_softmax":
                return self.reducer(tg.math.sum(src.x * dst.h, axis=-1),
                                    src.x * edge.w * scale)
            return src.x * edge.w * scale + dst.h * src.x
    layer = Layer()
    return lambda x, h, w, scale=1.5: layer(graph=GRAPH, src={"x": x}, dst={"h": h},
                                            edge={"w": w}, scale=scale)


def reducer_torch(name):
    def f(x, h, w, scale=1.5):
        if name == "online_softmax":
            score, value = (x[SRC] * h[DST]).sum(-1), x[SRC] * w * scale
            top = torch.full((N,), -torch.inf, dtype=score.dtype).scatter_reduce(
                0, DST, score, "amax")
            p = torch.exp(score - top[DST])
            mass = torch.zeros(N, dtype=p.dtype).index_add(0, DST, p)
            acc = torch.zeros(N, F, dtype=p.dtype).index_add(0, DST, p[:, None] * value)
            return acc / torch.where(mass > 0, mass, torch.ones_like(mass))[:, None]
        msg = x[SRC] * w * scale + h[DST] * x[SRC]
        total = torch.zeros(N, F, dtype=msg.dtype).index_add(0, DST, msg)
        if name == "sum":
            return total
        if name == "mean":
            count = torch.zeros(N, dtype=msg.dtype).index_add(0, DST, torch.ones_like(w[:, 0]))
            return total / count.clamp(min=1)[:, None]
        return torch.zeros(N, F, dtype=msg.dtype).scatter_reduce(
            0, DST[:, None].expand_as(msg), msg, "amax", include_self=False)
    return f


def inputs(seed=1, batch=()):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, F, dtype=torch.float64, generator=g)
                 for n in (N, N, E))


def close(got, want):
    got, want = tree_leaves(got), tree_leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def loss(f):
    weights = torch.linspace(-1.0, 2.0, N * F, dtype=torch.float64).reshape(N, F)
    return lambda *a: (torch.tanh(f(*a)) * weights).sum()


# ---- vmap: Tiga's batching rules, one run of one batched program ----------------------------

@pytest.mark.parametrize("name", REDUCERS)
def test_vmap_matches_torch(name):
    xs, hs, ws = inputs(2, batch=(B,))
    close(vmap(reducer_layer(name))(xs, hs, ws), vmap(reducer_torch(name))(xs, hs, ws))


@pytest.mark.parametrize("in_dims", [(0, None, None), (None, 1, None), (None, None, 2),
                                     (1, 0, None), (None, None, None, 0)])
def test_vmap_in_dims_match_torch(in_dims):
    x, h, w = inputs(3)
    args = [x, h, w, torch.tensor(1.5, dtype=torch.float64)]
    for k, d in enumerate(in_dims):
        if d is not None:
            stacked = torch.stack([args[k] * (1 + 0.5 * i) for i in range(B)])
            args[k] = stacked.movedim(0, d)
    args = args[:len(in_dims)]
    close(vmap(reducer_layer("sum"), in_dims=in_dims)(*args),
          vmap(reducer_torch("sum"), in_dims=in_dims)(*args))


def test_vmap_runs_one_batched_program_with_one_propagate(monkeypatch):
    """A batch over fields folds into the feature axis: one run, one propagate (not B)."""
    runs = []
    original = bridge.Node.run

    def counting(node, tensors):
        runs.append(node.program)
        return original(node, tensors)
    monkeypatch.setattr(bridge.Node, "run", counting)
    xs, hs, ws = inputs(4, batch=(B,))
    close(vmap(reducer_layer("sum"))(xs, hs, ws), vmap(reducer_torch("sum"))(xs, hs, ws))
    assert len(runs) == 1
    assert sum(e.primitive is propagate_p for e in runs[0].eqns) == 1


def test_nested_vmap_matches_torch():
    x, h, w = inputs(5)
    xs = torch.stack([torch.stack([x * (i + j) for j in range(3)]) for i in range(2)])
    f = reducer_layer("max")
    close(vmap(vmap(lambda x: f(x, h, w)))(xs),
          vmap(vmap(lambda x: reducer_torch("max")(x, h, w)))(xs))


def test_vmap_of_grad_is_per_sample_gradients():
    xs, _, _ = inputs(6, batch=(B,))
    _, h, w = inputs(7)
    got = vmap(grad(lambda x: loss(reducer_layer("online_softmax"))(x, h, w)))(xs)
    want = vmap(grad(lambda x: loss(reducer_torch("online_softmax"))(x, h, w)))(xs)
    close(got, want)


def test_vmap_over_a_vjp_function_is_one_batched_vjp():
    args = inputs(8)
    _, fn = vjp(reducer_layer("mean"), *args)
    _, ref = vjp(reducer_torch("mean"), *args)
    cts = torch.randn(B, N, F, dtype=torch.float64)
    close(vmap(fn)(cts), vmap(ref)(cts))


# ---- forward mode: Tiga's JVP program -------------------------------------------------------

def test_jvp_runs_tiga_jvp_program_not_a_transposed_vjp(monkeypatch):
    """Forward mode derives Tiga's JVP program; no VJP program is derived for it."""
    def refuse(*a, **k):
        raise AssertionError("forward mode derived a VJP program")
    monkeypatch.setattr(bridge, "vjp_program", refuse)
    monkeypatch.setattr(autograd, "vjp_program", refuse)

    class Fresh(tg.MessagePassing):       # a structure no earlier test derived
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return tg.math.sin(src.x) * edge.w - dst.h

    def f(x, h, w):
        return Fresh()(graph=GRAPH, src={"x": x}, dst={"h": h}, edge={"w": w})

    def ref(x, h, w):
        msg = torch.sin(x[SRC]) * w - h[DST]
        return torch.zeros(N, F, dtype=msg.dtype).index_add(0, DST, msg)
    args, ts = inputs(9), inputs(10)
    close(jvp(f, args, ts), jvp(ref, args, ts))
    with fwAD.dual_level():
        duals = [fwAD.make_dual(a, t) for a, t in zip(args, ts)]
        got = fwAD.unpack_dual(f(*duals)).tangent
        want = fwAD.unpack_dual(ref(*duals)).tangent
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", ["func.jvp", "forward_ad"])
def test_forward_mode_is_one_run_of_the_jvp_program(monkeypatch, mode):
    """Plain tangents: the forward runs Tiga's JVP program once (primal and tangent
    messages in one walk), and the jvp rule hands over its tangents (no second run)."""
    runs = []
    original = bridge.Node.run

    def counting(node, tensors):
        runs.append(len(tensors))
        return original(node, tensors)
    monkeypatch.setattr(bridge.Node, "run", counting)
    args, ts = inputs(27), inputs(28)
    f, ref = reducer_layer("online_softmax"), reducer_torch("online_softmax")
    if mode == "func.jvp":
        close(jvp(lambda x, w: f(x, args[1], w), (args[0], args[2]), (ts[0], ts[2])),
              jvp(lambda x, w: ref(x, args[1], w), (args[0], args[2]), (ts[0], ts[2])))
    else:
        with fwAD.dual_level():
            got = f(fwAD.make_dual(args[0], ts[0]), args[1], fwAD.make_dual(args[2], ts[2]))
            want = ref(fwAD.make_dual(args[0], ts[0]), args[1],
                       fwAD.make_dual(args[2], ts[2]))
            close(fwAD.unpack_dual(got), fwAD.unpack_dual(want))
    assert runs == [5]    # x, h, w and the tangents of x and w


@pytest.mark.parametrize("name", REDUCERS)
def test_forward_ad_tangents_match_torch(name):
    args, ts = inputs(11), inputs(12)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(reducer_layer(name)(
            *[fwAD.make_dual(a, t) for a, t in zip(args, ts)])).tangent
        want = fwAD.unpack_dual(reducer_torch(name)(
            *[fwAD.make_dual(a, t) for a, t in zip(args, ts)])).tangent
    assert got is not None
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", REDUCERS)
def test_jacfwd_and_jacrev_match_torch(name):
    args = inputs(13)
    want = jacrev(reducer_torch(name), argnums=(0, 1, 2))(*args)
    close(jacfwd(reducer_layer(name), argnums=(0, 1, 2))(*args), want)
    close(jacrev(reducer_layer(name), argnums=(0, 1, 2))(*args), want)


# ---- second derivatives ---------------------------------------------------------------------

@pytest.mark.parametrize("name", REDUCERS)
def test_hessian_matches_torch(name):
    x, h, w = inputs(14)
    got = hessian(lambda x, w: loss(reducer_layer(name))(x, h, w), argnums=(0, 1))(x, w)
    want = hessian(lambda x, w: loss(reducer_torch(name))(x, h, w), argnums=(0, 1))(x, w)
    close(got, want)


def test_grad_of_grad_matches_torch():
    x, h, w = inputs(15)

    def second(f):
        return grad(lambda w: grad(lambda x: loss(f)(x, h, w))(x).pow(2).sum())(w)
    close(second(reducer_layer("sum")), second(reducer_torch("sum")))


def test_hessian_vector_product_by_jvp_of_grad():
    x, h, w = inputs(16)
    v = torch.randn(N, F, dtype=torch.float64)

    def hvp(f):
        return jvp(grad(lambda x: loss(f)(x, h, w)), (x,), (v,))[1]
    close(hvp(reducer_layer("max")), hvp(reducer_torch("max")))


def test_grad_over_a_vjp_functions_cotangent_matches_torch():
    """The pullback is differentiated in its cotangent, at another torch.func level than
    the one the call was recorded at."""
    args = inputs(30)
    ct = torch.randn(N, F, dtype=torch.float64)

    def through(f):
        _, fn = vjp(f, *args)
        return grad(lambda c: torch.tanh(fn(c)[2]).sum())(ct)
    close(through(reducer_layer("max")), through(reducer_torch("max")))


def test_one_torch_func_grad_level_reuses_the_forward(monkeypatch):
    """torch.func.grad / vjp (one level) keep the eager node, whose backward reads the
    forward's residuals: no ProgramFunction node runs."""
    runs = []
    monkeypatch.setattr(bridge.Node, "run", lambda node, tensors: runs.append(node))
    args = inputs(31)
    close(grad(loss(reducer_layer("online_softmax")), argnums=(0, 1, 2))(*args),
          grad(loss(reducer_torch("online_softmax")), argnums=(0, 1, 2))(*args))
    _, fn = vjp(reducer_layer("max"), *args)
    _, ref = vjp(reducer_torch("max"), *args)
    ct = torch.randn(N, F, dtype=torch.float64)
    close(fn(ct), ref(ct))
    assert runs == []


def test_create_graph_double_backward_matches_torch():
    x, h, w = (t.requires_grad_() for t in inputs(17))
    xr, hr, wr = (t.detach().requires_grad_() for t in (x, h, w))
    (gx,) = torch.autograd.grad(loss(reducer_layer("mean"))(x, h, w), x, create_graph=True)
    (gxr,) = torch.autograd.grad(loss(reducer_torch("mean"))(xr, hr, wr), xr,
                                 create_graph=True)
    close(torch.autograd.grad(gx.square().sum(), (x, h, w)),
          torch.autograd.grad(gxr.square().sum(), (xr, hr, wr)))


# ---- tg.nn.GCNConv, directly and through functional_call -----------------------------------

EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 4, 0, 2, 4],
                           [1, 0, 2, 3, 4, 0, 3, 0, 2]])   # no self loops, no duplicates
IN, OUT = 3, 2


def gcn():
    torch.manual_seed(0)
    conv = tg.nn.GCNConv(IN, OUT).double()
    with torch.no_grad():
        conv.bias.copy_(torch.linspace(-0.5, 0.5, OUT))
    return conv


def dense_gcn(x, weight, bias):
    """D^-1/2 (A + I) D^-1/2 (x W^T) + b with a dense adjacency (rows: targets)."""
    a = torch.zeros(N, N, dtype=x.dtype)
    a[EDGE_INDEX[1], EDGE_INDEX[0]] = 1.0
    a = a + torch.eye(N, dtype=x.dtype)
    dis = a.sum(1).pow(-0.5)
    return (dis[:, None] * a * dis[None, :]) @ (x @ weight.T) + bias


def gcn_pair():
    conv = gcn()
    params = {k: v.detach() for k, v in conv.named_parameters()}
    tiga_fn = lambda x, p=params: functional_call(conv, p, (x, EDGE_INDEX))  # noqa: E731
    torch_fn = lambda x, p=params: dense_gcn(x, p["lin.weight"], p["bias"])  # noqa: E731
    return conv, params, tiga_fn, torch_fn


def test_gcn_forward_matches_dense():
    conv, params, f, ref = gcn_pair()
    x = inputs(18)[0]
    close(conv(x, EDGE_INDEX), ref(x))


@pytest.mark.parametrize("transform", ["vmap", "jvp", "jacrev", "jacfwd", "hessian"])
def test_gcn_transforms_of_x_match_dense(transform):
    _, _, f, ref = gcn_pair()
    x = inputs(19)[0]
    if transform == "vmap":
        xs = torch.randn(B, N, IN, dtype=torch.float64)
        close(vmap(f)(xs), vmap(ref)(xs))
    elif transform == "jvp":
        t = torch.randn(N, IN, dtype=torch.float64)
        close(jvp(f, (x,), (t,)), jvp(ref, (x,), (t,)))
    elif transform in ("jacrev", "jacfwd"):
        jac = jacrev if transform == "jacrev" else jacfwd
        close(jac(f)(x), jacrev(ref)(x))
    else:
        close(hessian(lambda x: torch.tanh(f(x)).sum())(x),
              hessian(lambda x: torch.tanh(ref(x)).sum())(x))


def test_gcn_grad_and_hessian_of_functional_call_over_parameters():
    """torch.func.grad with functional_call over a layer (issue 41: it blamed edge_index)."""
    _, params, f, ref = gcn_pair()
    x = inputs(20)[0]

    def tiga_loss(p):
        return torch.tanh(f(x, p)).sum()

    def torch_loss(p):
        return torch.tanh(ref(x, p)).sum()
    close(grad(tiga_loss)(params), grad(torch_loss)(params))
    close(jacrev(tiga_loss)(params), jacrev(torch_loss)(params))
    close(hessian(tiga_loss)(params), hessian(torch_loss)(params))


def test_gcn_ensemble_by_vmap_over_stacked_parameters():
    """Model ensembling: vmap over stacked parameters through functional_call."""
    _, params, f, ref = gcn_pair()
    x = inputs(21)[0]
    stacked = {k: torch.stack([v * (1 + 0.25 * i) for i in range(B)])
               for k, v in params.items()}
    close(vmap(lambda p: f(x, p))(stacked), vmap(lambda p: ref(x, p))(stacked))
    close(vmap(grad(lambda p: f(x, p).square().sum()))(stacked),
          vmap(grad(lambda p: ref(x, p).square().sum()))(stacked))


def test_gcn_forward_ad_tangent_matches_dense():
    conv, params, _, ref = gcn_pair()
    x, t = inputs(22)[0], inputs(23)[0]
    with fwAD.dual_level():
        got = fwAD.unpack_dual(conv(fwAD.make_dual(x, t), EDGE_INDEX)).tangent
        want = fwAD.unpack_dual(ref(fwAD.make_dual(x, t))).tangent
    torch.testing.assert_close(got, want)


def test_vmap_over_edge_index_says_what_to_batch():
    conv = gcn()
    x = inputs(24)[0]
    with pytest.raises(tg.UnsupportedError, match="edge_index: is batched by torch.func.vmap") \
            as err:
        vmap(lambda ei: conv(x, ei))(torch.stack([EDGE_INDEX, EDGE_INDEX]))
    assert "never batched" in err.value.hint and "tg.Graph.batch" in err.value.hint


# ---- other tg.nn layers and relation forms: oracles outside torch.func ----------------------

LAYERS = {
    "GATConv": lambda: tg.nn.GATConv(IN, 2, heads=2),
    "SAGEConv-max": lambda: tg.nn.SAGEConv(IN, 2, aggr="max"),
    "GINConv": lambda: tg.nn.GINConv(torch.nn.Sequential(
        torch.nn.Linear(IN, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))),
    "EdgeConv": lambda: tg.nn.EdgeConv(torch.nn.Sequential(torch.nn.Linear(2 * IN, 2),
                                                           torch.nn.Tanh())),
    "GCNConv-flow": lambda: tg.nn.GCNConv(IN, 2, flow="target_to_source"),
    "GCNConv-sparse": lambda: tg.nn.GCNConv(IN, 2),
}


def eager_grad(f, x):
    """The gradient by eager torch.autograd (the bridge's first-order backward)."""
    x = x.detach().requires_grad_()
    return torch.autograd.grad(f(x), x)[0]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_transforms_match_loops_and_eager_derivatives(name):
    torch.manual_seed(1)
    conv = LAYERS[name]().double()
    rel = EDGE_INDEX
    if name.endswith("sparse"):
        rel = torch.sparse_coo_tensor(EDGE_INDEX.flip(0), torch.ones(EDGE_INDEX.size(1),
                                                                     dtype=torch.float64),
                                      (N, N)).coalesce()
    f = lambda x: conv(x, rel)  # noqa: E731
    x, t = inputs(25)[0], inputs(26)[0]
    xs = torch.randn(B, N, IN, dtype=torch.float64)
    close(vmap(f)(xs), torch.stack([f(a) for a in xs]))
    jac = torch.autograd.functional.jacobian(f, x)        # eager reverse mode, row by row
    close(jvp(f, (x,), (t,))[1], torch.einsum("nkij,ij->nk", jac, t))
    close(jacfwd(f)(x), jac)

    def scalar(x):
        return torch.tanh(f(x)).sum()
    eps, fd = 1e-6, torch.empty(N, IN, N, IN, dtype=torch.float64)
    for i in range(N):
        for j in range(IN):
            d = torch.zeros_like(x)
            d[i, j] = eps
            fd[:, :, i, j] = (eager_grad(scalar, x + d) - eager_grad(scalar, x - d)) / (2 * eps)
    torch.testing.assert_close(hessian(scalar)(x), fd, rtol=1e-5, atol=1e-6)


# ---- custom rules inside an edge function are the ones torch.func runs ----------------------

@tg.custom_vjp
def clipped(x):
    return x


clipped.defvjp(lambda x: (x, None),
               lambda _, ct: (tg.math.minimum(tg.math.maximum(ct, -0.1), 0.1),))


@tg.custom_jvp
def doubled(x):
    return x * 2.0


doubled.defjvp(lambda p, t: (doubled(p[0]), t[0] * 5.0))   # a rule no derivative gives


def test_custom_rules_in_an_edge_function_are_used_by_torch_func():
    x = inputs(29)[0]

    def clip_call(x):
        return tg.propagate(GRAPH, lambda s, d, e: clipped(s.x), tg.sum(), src={"x": x})

    def double_call(x):
        return tg.propagate(GRAPH, lambda s, d, e: doubled(s.x), tg.sum(), src={"x": x})
    ones = torch.ones(N, F, dtype=torch.float64)
    out_degree = torch.zeros(N, dtype=torch.float64).index_add(0, SRC, torch.ones(E,
                                                               dtype=torch.float64))
    # d/dx of 10 * sum(y) is 10 * out-degree per source row, clipped to 0.1 per edge
    want = torch.minimum(10 * ones, 0.1 * ones) * out_degree[:, None]
    close(grad(lambda x: 10 * clip_call(x).sum())(x), want)
    close(vmap(grad(lambda x: 10 * clip_call(x).sum()))(torch.stack([x, -x])),
          torch.stack([want, want]))
    y_dot = jvp(double_call, (x,), (ones,))[1]
    in_degree = torch.zeros(N, dtype=torch.float64).index_add(0, DST, torch.ones(
        E, dtype=torch.float64))
    close(y_dot, 5.0 * in_degree[:, None].expand(N, F))


def test_rgcn_typed_relation_under_torch_func():
    torch.manual_seed(2)
    conv = tg.nn.RGCNConv(IN, 2, num_relations=2).double()
    types = torch.arange(EDGE_INDEX.size(1)) % 2
    f = lambda x: conv(x, EDGE_INDEX, types)  # noqa: E731
    x, t = inputs(32)[0], inputs(33)[0]
    xs = torch.randn(B, N, IN, dtype=torch.float64)
    close(vmap(f)(xs), torch.stack([f(a) for a in xs]))
    jac = torch.autograd.functional.jacobian(f, x)
    close(jvp(f, (x,), (t,))[1], torch.einsum("nkij,ij->nk", jac, t))
    params = {k: v.detach() for k, v in conv.named_parameters()}
    got = grad(lambda p: functional_call(conv, p, (x, EDGE_INDEX, types)).tanh().sum())(params)
    for k, v in conv.named_parameters():
        (want,) = torch.autograd.grad(f(x).tanh().sum(), v)
        torch.testing.assert_close(got[k], want)
    with pytest.raises(tg.UnsupportedError, match="RGCNConv: edge_type: is batched"):
        vmap(lambda ty: conv(x, EDGE_INDEX, ty))(torch.stack([types, 1 - types]))
