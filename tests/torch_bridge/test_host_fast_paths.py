"""The torch bridge's warm-call shortcuts take only what the general route would give the
same answer for: host_view (plain CPU tensors: the same read-only zero-copy view as
to_numpy's general route, None for anything else) and the host-only backend check
(call_backend's answer on CPU operands). Oracles: data pointers, numpy's flags, the
general route's own results."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402
from tiga.torch_bridge.autograd import _backend  # noqa: E402
from tiga.torch_bridge.dlpack import _host_view, host_view, to_numpy  # noqa: E402
from tiga.torch_bridge.layers.common import source_reducer  # noqa: E402
from tiga.xla_free_runtime.backends.triton.launch import call_backend  # noqa: E402


@pytest.mark.parametrize("make", [
    lambda: torch.randn(4, 3, requires_grad=True),
    lambda: torch.nn.Parameter(torch.randn(4, 3)),
    lambda: torch.arange(12, dtype=torch.int32).reshape(3, 4).T,     # strided
    lambda: torch.zeros(5, dtype=torch.bool),
    lambda: torch.randn(2, 3).to(torch.float16),
])
def test_host_view_is_the_general_routes_view(make):
    t = make()
    fast, general = host_view(t), _host_view(t, "t")
    assert fast is not None and not fast.flags.writeable
    assert fast.ctypes.data == t.data_ptr() == general.ctypes.data
    assert fast.strides == general.strides and fast.dtype == general.dtype
    np.testing.assert_array_equal(fast, general)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, dtype=torch.complex64).conj(),
    lambda: torch.randn(3).to(torch.bfloat16),
    lambda: torch.randn(3).to_sparse(),
    lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
    lambda: torch.randn(3, device="meta"),
])
def test_host_view_declines_what_it_does_not_read(make):
    assert host_view(make()) is None


def test_host_view_declines_under_torch_func():
    seen = []

    def f(x):
        seen.append(host_view(x))
        return x.sum()

    torch.func.grad(f)(torch.randn(3))
    assert seen == [None]
    assert not to_numpy(torch.randn(3)).flags.writeable


def test_host_only_backend_check_agrees_with_call_backend():
    g = tg.Graph.from_coo([0, 1, 2], [1, 2, 0], num_src=3, num_dst=3)
    calls = []
    layer = source_reducer("sum")
    for x in (torch.randn(3, 2), np.ones((3, 2), np.float32)):
        calls.append(layer._call(g, {"x": x}, None, None, {}))
    for call in calls:
        assert _backend(call) is None and call_backend(call) is None


def test_outputs_and_gradients_of_the_fast_route_are_writeable_torch_tensors():
    g = tg.Graph.from_coo([0, 1, 2, 2], [1, 2, 0, 0], num_src=3, num_dst=3)
    x = torch.randn(3, 2, requires_grad=True)
    y = source_reducer("sum")(graph=g, src={"x": x})
    want = torch.zeros(3, 2).index_add(0, torch.tensor([1, 2, 0, 0]),
                                       x.detach()[torch.tensor([0, 1, 2, 2])])
    torch.testing.assert_close(y, want)
    y.mul_(2.0)          # an output the VJP of a sum does not read may change in place
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[2.0, 2.0], [2.0, 2.0], [4.0, 4.0]]))
