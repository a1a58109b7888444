"""tg.nn.trace on subclasses of supported modules, PyG's Linear, and the new activation
modules (LeakyReLU, ELU, Softplus). Oracle: torch itself on an explicit edge list (gather ->
module -> index_add) and torch.autograd; errors name the module and the attribute."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tiga as tg  # noqa: E402

N, F = 12, 4


class MyLinear(nn.Linear):
    """A subclass that keeps Linear.forward (custom init only)."""

    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        with torch.no_grad():
            self.weight.mul_(2.0)


class MySequential(nn.Sequential):
    pass


class MyLeaky(nn.LeakyReLU):
    pass


class Doubled(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


class Broken(nn.Linear):
    @property
    def out_features(self):
        raise RuntimeError("not today")

    @out_features.setter
    def out_features(self, value):
        pass


class Apply(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self, module):
        super().__init__()
        self.mlp = tg.nn.trace(module)

    def edge(self, src, dst, edge):
        return self.mlp(src.x - dst.x)


def _edges(seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, N, 40), rng.integers(0, N, 40)
    return tg.Graph.from_coo(src, dst, num_src=N, num_dst=N), torch.as_tensor(src), \
        torch.as_tensor(dst)


def _check_against_torch(module, width=F):
    g, src, dst = _edges()
    x = torch.randn(N, width, dtype=torch.float64, requires_grad=True)
    module = module.double()
    got = Apply(module)(graph=g, src={"x": x}, dst={"x": x})
    msg = module(x[src] - x[dst])
    want = torch.zeros((N,) + msg.shape[1:], dtype=msg.dtype).index_add(0, dst, msg)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    cot = torch.randn_like(want)
    params = [x] + list(module.parameters())
    g_got = torch.autograd.grad((got * cot).sum(), params)
    g_want = torch.autograd.grad((want * cot).sum(), params)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


MODULES = {
    "subclasses": lambda: MySequential(MyLinear(F, 6), MyLeaky(0.3), nn.Linear(6, 3)),
    "leaky_elu_softplus": lambda: nn.Sequential(
        nn.Linear(F, 8), nn.LeakyReLU(0.1), nn.Linear(8, 8), nn.ELU(0.7), nn.Linear(8, 5),
        nn.Softplus(beta=2.0, threshold=1.5)),
    "defaults": lambda: nn.Sequential(nn.Linear(F, 8), nn.LeakyReLU(), nn.ELU(),
                                      nn.Softplus()),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_forward_and_gradients_match_torch(name):
    torch.manual_seed(0)
    _check_against_torch(MODULES[name]())


def test_overridden_forward_is_refused_naming_the_module():
    with pytest.raises(tg.UnsupportedError, match=r"Sequential\.1 is a Doubled, a subclass "
                                                  r"of Linear that overrides forward"):
        tg.nn.trace(nn.Sequential(nn.ReLU(), Doubled(3, 3)))


def test_unreadable_attribute_is_named():
    with pytest.raises(tg.UnsupportedError,
                       match=r"module Broken \(Broken\): cannot read attribute 'out_features' "
                             r"\(RuntimeError: not today\)"):
        tg.nn.trace(Broken(3, 3))


def test_unsupported_module_still_named():
    with pytest.raises(tg.UnsupportedError, match=r"Sequential\.0 is a Conv1d, which cannot "
                                                  r"be captured"):
        tg.nn.trace(nn.Sequential(nn.Conv1d(1, 1, 1)))


def test_wrong_weight_shape_is_named():
    lin = nn.Linear(3, 2)
    lin.weight = nn.Parameter(torch.zeros(5, 5))
    with pytest.raises(tg.UnsupportedError, match=r"attribute 'weight' is \(5, 5\), expected "
                                                  r"a tensor of shape \(2, 3\)"):
        tg.nn.trace(lin)


# ---- PyG's Linear --------------------------------------------------------------------------


def _pyg_linear():
    pyg = pytest.importorskip("torch_geometric")
    return pyg.nn.Linear


@pytest.mark.parametrize("bias", [True, False])
def test_pyg_linear_matches_pyg(bias):
    linear = _pyg_linear()
    torch.manual_seed(1)
    _check_against_torch(nn.Sequential(linear(F, 6, bias=bias), nn.ReLU(), linear(6, 2)))
    _check_against_torch(linear(F, 3, weight_initializer="glorot", bias=bias))


def test_pyg_lazy_linear_errors_until_initialized():
    lazy = _pyg_linear()(-1, 3)
    with pytest.raises(tg.UnsupportedError, match=r"module Linear \(Linear\): attribute "
                                                  r"'weight' is uninitialized"):
        tg.nn.trace(lazy)
    lazy(torch.zeros(2, F))   # one forward pass materialises the weight
    _check_against_torch(lazy)


def test_pyg_gcnconv_lin_traces():
    pyg = pytest.importorskip("torch_geometric")
    conv = pyg.nn.GCNConv(F, 3)
    traced = tg.nn.trace(conv.lin)   # the call the issue reported failing
    assert traced.in_features == F
