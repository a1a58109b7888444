"""torch.func and forward-mode AD through a Tiga call (issue 27 item 5).

Reverse mode (torch.func.grad, vjp, jacrev; functional_call over a module whose Tiga layer
captures an MLP) and forward mode (torch.autograd.forward_ad dual tensors, torch.func.jvp,
jacfwd) are compared with the same message passing written in torch (index_add /
scatter_reduce over an explicit edge list) under the same transform, in float64. vmap,
second derivatives and GCNConv: test_torch_func_transforms.py.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, vjp  # noqa: E402

import tiga as tg  # noqa: E402

N, E, F = 5, 11, 3


def relation(seed=0):
    rng = np.random.default_rng(seed)
    dst = np.sort(rng.integers(0, N - 1, E))          # destination N-1 has no edges
    src = rng.integers(0, N, E)
    src[:2], dst[:2] = 1, 0                            # a duplicate edge
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))])
    return (tg.Graph.from_csr(row_ptr, src, num_src=N), torch.as_tensor(src),
            torch.as_tensor(dst))


GRAPH, SRC, DST = relation()


class Affine(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w + dst.h * src.x


class EdgeMLP(tg.MessagePassing):
    reducer = tg.max()

    def __init__(self, mlp):
        self.mlp = tg.nn.trace(mlp)

    def edge(self, src, dst, edge):
        return self.mlp(src.x, dst.h)


def affine_tiga(x, h, w):
    return Affine()(graph=GRAPH, src={"x": x}, dst={"h": h}, edge={"w": w})


def affine_torch(x, h, w):
    msg = x[SRC] * w + h[DST] * x[SRC]
    return torch.zeros(N, F, dtype=msg.dtype).index_add(0, DST, msg)


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, F, dtype=torch.float64, generator=g),
            torch.randn(N, F, dtype=torch.float64, generator=g),
            torch.randn(E, F, dtype=torch.float64, generator=g))


def loss(f):
    weights = torch.linspace(-1.0, 2.0, N * F, dtype=torch.float64).reshape(N, F)
    return lambda *a: (torch.tanh(f(*a)) * weights).sum()


@pytest.mark.parametrize("argnums", [0, (0, 1, 2)])
def test_func_grad_matches_torch(argnums):
    args = inputs()
    got = grad(loss(affine_tiga), argnums=argnums)(*args)
    want = grad(loss(affine_torch), argnums=argnums)(*args)
    for a, b in zip(torch.utils._pytree.tree_leaves(got),
                    torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(a, b)


def test_func_vjp_matches_torch():
    args = inputs(2)
    ct = torch.randn(N, F, dtype=torch.float64)
    out, fn = vjp(affine_tiga, *args)
    ref_out, ref_fn = vjp(affine_torch, *args)
    torch.testing.assert_close(out, ref_out)
    for a, b in zip(fn(ct), ref_fn(ct)):
        torch.testing.assert_close(a, b)


def test_jacrev_matches_torch_jacobian():
    args = inputs(3)
    got = jacrev(affine_tiga, argnums=(0, 2))(*args)
    want = jacrev(affine_torch, argnums=(0, 2))(*args)
    assert got[0].shape == (N, F, N, F) and got[1].shape == (N, F, E, F)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


class Net(torch.nn.Module):
    """An edge MLP held by a Tiga layer; functional_call swaps its parameters."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * F, 4), torch.nn.Tanh(),
                                       torch.nn.Linear(4, F)).double()
        self.layer = EdgeMLP(self.mlp)

    def forward(self, x, h, reference=False):
        if not reference:
            return self.layer(graph=GRAPH, src={"x": x}, dst={"h": h})
        msg = self.mlp(torch.cat([x[SRC], h[DST]], -1))
        return torch.zeros(N, F, dtype=msg.dtype).scatter_reduce(
            0, DST[:, None].expand_as(msg), msg, "amax", include_self=False)


def test_grad_of_functional_call_reaches_captured_mlp_parameters():
    """The parameters an edge MLP captures (tg.nn.trace) get their torch.func gradients."""
    torch.manual_seed(0)
    net = Net()
    x, h, _ = inputs(4)
    params = {k: v.detach() for k, v in net.named_parameters()}

    def tiga_loss(p):
        return loss(lambda: functional_call(net, p, (x, h)))()

    def torch_loss(p):
        return loss(lambda: functional_call(net, p, (x, h), {"reference": True}))()

    got, want = grad(tiga_loss)(params), grad(torch_loss)(params)
    assert set(got) == set(want) == set(params)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


# ---- forward mode: Tiga's JVP program ---------------------------

REDUCERS = ("sum", "mean", "max", "online_softmax")


def reducer_layer(name):
    class Layer(tg.MessagePassing):
        reducer = getattr(tg, name)()

        def edge(self, src, dst, edge):
            if name == "online_softmax":
                return self.reducer(tg.math.sum(src.x * dst.h, axis=-1), src.x * edge.w)
            return src.x * edge.w + dst.h
    return lambda x, h, w: Layer()(graph=GRAPH, src={"x": x}, dst={"h": h}, edge={"w": w})


def reducer_torch(name):
    def f(x, h, w):
        if name == "online_softmax":
            score, value = (x[SRC] * h[DST]).sum(-1), x[SRC] * w
            top = torch.full((N,), -torch.inf, dtype=score.dtype).scatter_reduce(
                0, DST, score, "amax")
            p = torch.exp(score - top[DST])
            mass = torch.zeros(N, dtype=p.dtype).index_add(0, DST, p)
            acc = torch.zeros(N, F, dtype=p.dtype).index_add(0, DST, p[:, None] * value)
            return acc / torch.where(mass > 0, mass, torch.ones_like(mass))[:, None]
        msg = x[SRC] * w + h[DST]
        total = torch.zeros(N, F, dtype=msg.dtype).index_add(0, DST, msg)
        if name == "sum":
            return total
        if name == "mean":
            count = torch.zeros(N, dtype=msg.dtype).index_add(0, DST, torch.ones_like(w[:, 0]))
            return total / count.clamp(min=1)[:, None]
        return torch.zeros(N, F, dtype=msg.dtype).scatter_reduce(
            0, DST[:, None].expand_as(msg), msg, "amax", include_self=False)
    return f


@pytest.mark.parametrize("name", REDUCERS)
def test_func_jvp_matches_torch(name):
    args = inputs(6)
    tangents = inputs(7)
    out, tangent = jvp(reducer_layer(name), args, tangents)
    ref_out, ref_tangent = jvp(reducer_torch(name), args, tangents)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(tangent, ref_tangent)


def test_jacfwd_matches_torch_jacobian():
    args = inputs(8)
    got = jacfwd(reducer_layer("max"), argnums=(0, 2))(*args)
    want = jacrev(reducer_torch("max"), argnums=(0, 2))(*args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_forward_ad_dual_tensor_gets_its_tangent():
    x, h, w = inputs()
    tx = torch.randn(N, F, dtype=torch.float64)
    with fwAD.dual_level():
        y = affine_tiga(fwAD.make_dual(x, tx), h, w)
        got = fwAD.unpack_dual(y).tangent
        ref = fwAD.unpack_dual(affine_torch(fwAD.make_dual(x, tx), h, w)).tangent
        assert got is not None      # the defect: a None tangent, silently
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(affine_tiga(x, h, w), affine_torch(x, h, w))  # no duals


def test_forward_and_reverse_mode_together():
    """A dual tensor that also requires grad: the tangent and the gradient both arrive."""
    x, h, w = inputs(9)
    w.requires_grad_()
    tx = torch.randn(N, F, dtype=torch.float64)
    with fwAD.dual_level():
        y = affine_tiga(fwAD.make_dual(x, tx), h, w)
        ref = affine_torch(fwAD.make_dual(x, tx), h, w)
        torch.testing.assert_close(fwAD.unpack_dual(y).tangent, fwAD.unpack_dual(ref).tangent)
        torch.testing.assert_close(torch.autograd.grad(y.sum(), w)[0],
                                   torch.autograd.grad(ref.sum(), w)[0])


# (second derivatives and vmap of the forward run Tiga's rules: test_torch_func_transforms.py)


def test_eager_autograd_unchanged_next_to_the_transforms():
    x, h, w = (t.requires_grad_() for t in inputs(5))
    gx = torch.autograd.grad(loss(affine_tiga)(x, h, w), (x, h, w))
    rx = torch.autograd.grad(loss(affine_torch)(x, h, w), (x, h, w))
    for a, b in zip(gx, rx):
        torch.testing.assert_close(a, b)
