"""DLPack between torch and Tiga: zero-copy both ways, strided inputs, what explain() says.

Oracle: memory identity (writes through one side are seen by the other, equal data
pointers) and torch's own values.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402
from tiga.torch_bridge import to_numpy, to_torch  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_from_dlpack_aliases_torch_storage(dtype):
    t = torch.arange(12, dtype=dtype).reshape(3, 4)
    a = tg.from_dlpack(t)
    assert a.shape == (3, 4) and a.numpy().ctypes.data == t.data_ptr()
    t[1, 2] = 99
    assert a.numpy()[1, 2] == 99


def test_from_dlpack_keeps_strides_of_non_contiguous_tensors():
    base = torch.arange(24.0).reshape(4, 6)
    for view in (base.T, base[:, ::2], base[1:3, 2:5]):
        a = tg.from_dlpack(view)
        np.testing.assert_array_equal(a.numpy(), view.numpy())
        assert np.shares_memory(a.numpy(), base.numpy())


def test_from_dlpack_detaches_tensors_that_require_grad():
    t = torch.ones(3, requires_grad=True)
    a = tg.from_dlpack(t)
    assert a.numpy().ctypes.data == t.data_ptr()


def test_torch_from_dlpack_aliases_tiga_tensor():
    a = tg.asarray(np.zeros((2, 3), np.float32))
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.numpy().ctypes.data
    t[0, 1] = 5.0
    assert a.numpy()[0, 1] == 5.0


def test_bridge_conversions_are_zero_copy():
    t = torch.randn(5, 3)
    view = to_numpy(t)
    assert view.ctypes.data == t.data_ptr() and not view.flags.writeable
    arr = np.ones((4, 2))
    assert to_torch(arr).data_ptr() == arr.ctypes.data
    bf = torch.randn(4, dtype=torch.bfloat16)
    assert to_numpy(bf).ctypes.data == bf.data_ptr()


def test_propagate_results_are_torch_tensors_owning_tiga_outputs():
    graph = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 1, 1]), num_src=2)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    y = tg.propagate(graph, lambda s, d, e: s.x, tg.sum(), src={"x": x})
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.tensor([[4.0, 6.0], [3.0, 4.0]]))


def test_non_contiguous_field_is_correct_and_its_copy_is_explained():
    graph = tg.Graph.from_csr(np.array([0, 2, 3, 3]), np.array([0, 2, 1]), num_src=3)
    base = torch.randn(2, 3, requires_grad=True)
    x = base.T  # (3, 2), strides (1, 3)
    assert not x.is_contiguous()

    def edge(s, d, e):
        return s.x * 2.0

    y = tg.propagate(graph, edge, tg.sum(), src={"x": x})
    src, dst = torch.tensor([0, 2, 1]), torch.tensor([0, 0, 1])
    ref = torch.zeros(3, 2).index_add(0, dst, x[src] * 2.0)
    torch.testing.assert_close(y, ref)
    (g,) = torch.autograd.grad(y.sum(), (base,))
    (g_ref,) = torch.autograd.grad(ref.sum(), (base,))
    torch.testing.assert_close(g, g_ref)

    class Double(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * 2.0

    text = str(Double().explain(graph=graph, src={"x": x}))
    assert "contiguous copy of src.x" in text and "(1, 3)" in text
    text = str(Double().explain(graph=graph, src={"x": x.contiguous()}))
    assert "contiguous copy" not in text


def test_from_dlpack_imports_bfloat16_without_a_copy():
    pytest.importorskip("ml_dtypes")
    base = torch.randn(4, 6).to(torch.bfloat16)
    for t in (base, base.T, base[:, 1::2]):
        a = tg.from_dlpack(t)
        assert a.dtype == tg.bfloat16 and a.shape == tuple(t.shape)
        # same bits as torch's own float32 rounding of them (the oracle: torch)
        np.testing.assert_array_equal(a.numpy().astype(np.float32), t.float().numpy())
        assert np.shares_memory(a.numpy().view(np.int16), base.view(torch.int16).numpy())
    base[0, 0] = 3.0
    assert float(tg.from_dlpack(base).numpy()[0, 0]) == 3.0
