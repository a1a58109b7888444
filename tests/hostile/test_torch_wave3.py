"""Hostile torch transforms (issue 27 item 5, issue 26 item 6): forward-mode AD never drops a
tangent silently, torch.func reverse mode works, vmap names its alternative, torch.compile
runs a module holding Tiga layers. Oracles: the same message passing written in torch
(index_add over the explicit edge list) under the same transform. One subprocess per group
(see _run.py); nothing here is skipped where torch is installed."""
from __future__ import annotations

import pytest

from ._run import check_cases

pytest.importorskip("torch")

COMMON = '''
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap
warnings.simplefilter("ignore")

ROW_PTR, COL = np.array([0, 2, 3, 3]), np.array([0, 1, 1])
g = tg.Graph.from_csr(ROW_PTR, COL, num_src=2)
SRC, DST = torch.as_tensor(COL), torch.tensor([0, 0, 1])
UE = tg.UnsupportedError

class Square(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, scale):
        return src.x * src.x * scale

def call(x, scale=1.5):
    return Square()(graph=g, src={"x": x}, scale=scale)

def oracle(x, scale=1.5):
    return torch.zeros(3, dtype=x.dtype).index_add(0, DST, x[SRC] * x[SRC] * scale)

x0 = torch.tensor([2.0, -3.0], dtype=torch.float64)
'''


FORWARD_MODE_IS_REFUSED = COMMON + '''
@case
def dual_field_raises_instead_of_a_none_tangent():
    with fwAD.dual_level():
        raises(UE, lambda: call(fwAD.make_dual(x0, torch.ones(2, dtype=torch.float64))),
               "src.x: carries a forward-mode tangent")

@case
def dual_keyword_param_is_named():
    s = torch.tensor(1.5, dtype=torch.float64)
    with fwAD.dual_level():
        raises(UE, lambda: call(x0, fwAD.make_dual(s, torch.tensor(1.0, dtype=s.dtype))),
               "scale: carries a forward-mode tangent")

@case
def dual_level_without_duals_still_runs():
    with fwAD.dual_level():
        same(call(x0).numpy(), oracle(x0).numpy())

@case
def func_jvp_and_jacfwd_raise():
    raises(UE, lambda: jvp(call, (x0,), (torch.ones(2, dtype=torch.float64),)),
           "forward-mode", "not supported")
    raises(UE, lambda: jacfwd(call)(x0), "forward-mode")

@case
def hessian_raises_at_its_forward_mode_half():
    err = raises(UE, lambda: hessian(lambda x: call(x).sum())(x0), "forward-mode")
    assert "jacrev" in err.hint

def _with_weight(lin, w, fn):
    from torch.nn.utils.stateless import _reparametrize_module
    with _reparametrize_module(lin, {"weight": w}):
        return fn()

@case
def captured_parameter_with_a_tangent_is_named():
    lin = torch.nn.Linear(1, 1).double()
    mlp = tg.nn.trace(lin)
    h = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    f = lambda w: _with_weight(lin, w, lambda: tg.propagate(
        g, lambda s, d, e: mlp(s.h), tg.sum(), src={"h": h}))
    w = lin.weight.detach()
    raises(UE, lambda: jvp(f, (w,), (torch.ones_like(w),)), "captured value 0",
           "forward-mode")
'''


REVERSE_TRANSFORMS_WORK = COMMON + '''
@case
def func_grad_equals_torch():
    same(grad(lambda x: call(x).sum())(x0).numpy(), grad(lambda x: oracle(x).sum())(x0).numpy())

@case
def func_grad_of_a_keyword_tensor_param():
    s = torch.tensor(1.5, dtype=torch.float64)
    same(grad(lambda s: call(x0, s).sum())(s).numpy(),
         grad(lambda s: oracle(x0, s).sum())(s).numpy())

@case
def jacrev_equals_torch():
    same(jacrev(call)(x0).numpy(), jacrev(oracle)(x0).numpy())

@case
def vmap_over_a_vjp_function_runs_one_vjp_per_cotangent():
    _, fn = vjp(call, x0)
    _, ref = vjp(oracle, x0)
    cts = torch.eye(3, dtype=torch.float64)
    same(vmap(fn)(cts)[0].numpy(), vmap(ref)(cts)[0].numpy())

@case
def grad_of_grad_is_refused_not_wrong():
    raises(UE, lambda: grad(lambda x: grad(lambda x: call(x).sum())(x).sum())(x0),
           "double backward")

@case
def vmap_of_the_forward_names_the_alternative():
    err = raises(UE, lambda: vmap(call)(torch.stack([x0, x0])),
                 "src.x: is batched by torch.func.vmap")
    assert "disjoint union" in err.hint

@case
def vmap_over_a_param_only():
    raises(UE, lambda: vmap(lambda s: call(x0, s))(torch.tensor([1.0, 2.0],
                                                                dtype=torch.float64)),
           "scale: is batched by torch.func.vmap")
'''


COMPILE_RUNS = COMMON + '''
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1).double()
        self.layer = Square()

    def forward(self, x):
        return torch.tanh(self.layer(graph=g, src={"x": self.lin(x[:, None])[:, 0]},
                                     scale=1.5)).sum()

@case
def compile_of_a_module_holding_a_tiga_layer():
    net = Net()
    x = x0.clone().requires_grad_()
    want = net(x)
    gw = torch.autograd.grad(want, (x, net.lin.weight))
    torch._dynamo.reset()
    got = torch.compile(net, backend="eager", fullgraph=True)(x)
    gg = torch.autograd.grad(got, (x, net.lin.weight))
    same(got.detach().numpy(), want.detach().numpy())
    for a, b in zip(gg, gw):
        same(a.numpy(), b.numpy())

@case
def compile_of_functional_propagate_with_a_reducer_made_inside():
    f = lambda x: tg.propagate(g, lambda s, d, e: s.x * 3.0, tg.max(empty=-1.0),
                               src={"x": x})
    torch._dynamo.reset()
    same(torch.compile(f, backend="aot_eager", fullgraph=True)(x0).numpy(), f(x0).numpy())
W = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)

class GlobalWeight(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * W          # a module-level tensor the edge function reads

class DerivedWeight(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * (W * 2)    # a tensor computed from W while Tiga traces

@case
def compile_captured_global_tensor_gets_its_gradient():
    layer, x = GlobalWeight(), x0.clone().requires_grad_()
    torch._dynamo.reset()
    got = torch.compile(lambda x: layer(graph=g, src={"x": x}), backend="aot_eager",
                        fullgraph=True)(x)
    gg = torch.autograd.grad(got.sum(), (x, W))
    want = torch.zeros(3, dtype=x.dtype).index_add(0, DST, x[SRC] * W)
    gw = torch.autograd.grad(want.sum(), (x, W))
    same(got.detach().numpy(), want.detach().numpy())
    for a, b in zip(gg, gw):
        same(a.numpy(), b.numpy())

@case
def compile_of_a_tensor_computed_while_tracing_falls_back_or_names_why():
    layer = DerivedWeight()
    f = lambda x: layer(graph=g, src={"x": x})
    want = torch.zeros(3, dtype=x0.dtype).index_add(0, DST, x0[SRC] * 4.0).numpy()
    torch._dynamo.reset()
    try:
        torch.compile(f, backend="eager", fullgraph=True)(x0)
    except torch._dynamo.exc.Unsupported as exc:    # fullgraph: Dynamo names Tiga's reason
        assert "captured value 0" in str(exc) and "w * 2" in str(exc), exc
    else:
        raise AssertionError("compiled a tensor computed while tracing into one graph")
    torch._dynamo.reset()      # without fullgraph: that frame runs eagerly, and is right
    same(torch.compile(f, backend="eager")(x0).detach().numpy(), want)
'''


def test_forward_mode_is_refused():
    check_cases(FORWARD_MODE_IS_REFUSED)


def test_reverse_transforms_work():
    check_cases(REVERSE_TRANSFORMS_WORK)


def test_compile_runs():
    check_cases(COMPILE_RUNS)
