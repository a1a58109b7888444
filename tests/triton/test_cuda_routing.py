"""CUDA input routing (API.md section 11) without a GPU: the decision function with stub
device descriptions, the error path with producers whose `__dlpack_device__` says CUDA
(kDLCUDA = 2), and the triton route end to end with the GPU backend's launch swapped for
the interpreter (the kernels then run on CPU)."""
import numpy as np
import pytest
import torch

import tiga as tg
from tiga.lower import backends
from tiga.lower.backends import BACKENDS, route_for_devices, selected_backend
from tiga.testing import reference_grad
from tiga.torch_bridge import autograd

G = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)
X = np.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
W = np.array([4.0, 5.0, 2.0])
OK, NO_GPU = (True, ""), (False, "no CUDA device (no nvidia-smi, no /dev/nvidia0)")


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


class FakeCuda:
    """A DLPack producer that says it lives on cuda:0 and records any attempt to read it."""

    def __init__(self, data):
        self.data, self.read = np.asarray(data), []
        self.dtype, self.shape = self.data.dtype, self.data.shape

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        self.read.append("__dlpack__")
        raise AssertionError("CUDA data must not be read on the host")

    def cpu(self):
        self.read.append("cpu")
        raise AssertionError("CUDA data must not be copied to the host")


class CudaLooking(torch.Tensor):
    """A CPU torch tensor whose DLPack device says cuda:0 (a CUDA input, faked)."""

    def __dlpack_device__(self):
        return (2, 0)


def test_decision_host_inputs_keep_the_selected_backend():
    devices = {"graph": "cpu", "src.x": "cpu"}
    assert route_for_devices(devices, "auto", strict=True, gpu=NO_GPU) is None


@pytest.mark.parametrize("selected", ["auto", "triton"])
def test_decision_cuda_inputs_run_on_triton(selected):
    devices = {"graph": "cpu", "src.x": "cuda:0"}
    assert route_for_devices(devices, selected, strict=True, gpu=OK) == "triton"
    with pytest.raises(tg.UnsupportedError, match=r"src\.x: lives on cuda:0, so the call runs "
                                                  r"on the triton backend, which is "
                                                  r"unavailable: no CUDA device"):
        route_for_devices(devices, selected, strict=False, gpu=NO_GPU)


def test_decision_cpu_backend_for_cuda_inputs():
    devices = {"graph": "cpu", "edge.w": "cuda:1"}
    with pytest.raises(tg.UnsupportedError, match=r"edge\.w: lives on cuda:1, but the selected "
                                                  r"backend 'cpu-llvm' runs on the CPU; strict "
                                                  r"mode refuses a CPU fallback"):
        route_for_devices(devices, "cpu-llvm", strict=True, gpu=OK)
    # not strict: the caller chose the CPU backend explicitly
    assert route_for_devices(devices, "cpu-llvm", strict=False, gpu=OK) == "cpu-llvm"
    with pytest.raises(tg.UnsupportedError, match=r"graph: lives on rocm:0"):
        route_for_devices({"graph": "rocm:0"}, "auto", strict=False, gpu=OK)


def test_dlpack_producer_on_cuda_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: NO_GPU)
    x = FakeCuda(X)
    with pytest.raises(tg.UnsupportedError, match=r"src\.x: lives on cuda:0, so the call runs "
                                                  r"on the triton backend, which is "
                                                  r"unavailable: no CUDA device"):
        WeightedSum()(graph=G, src={"x": x}, dst={}, edge={"w": W})
    assert x.read == []           # never copied to the host


def test_torch_cuda_tensor_without_gpu_is_refused_before_any_copy(monkeypatch):
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: NO_GPU)

    def no_copy(*a, **k):
        raise AssertionError("a CUDA tensor was copied to the host")

    monkeypatch.setattr(autograd, "to_numpy", no_copy)
    w = torch.tensor(W).as_subclass(CudaLooking)
    with pytest.raises(tg.UnsupportedError, match=r"edge\.w: lives on cuda:0.*unavailable"):
        WeightedSum()(graph=G, src={"x": torch.tensor(X)}, dst={}, edge={"w": w})


def test_cuda_inputs_route_to_triton_forward_and_backward(monkeypatch):
    """With the GPU backend 'available' and launching through the interpreter, a CUDA-looking
    torch input runs every propagate (forward and VJP) on the triton backend, strictly."""
    seen = []
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: OK)
    monkeypatch.setattr(BACKENDS["triton"], "interpreter", True)
    real = backends.selected_backend

    def spy():
        seen.append(real())
        return seen[-1]

    from tiga.xla_free_runtime.backends.triton import launch as triton_launch
    monkeypatch.setattr(triton_launch, "selected_backend", spy)
    old = tg.config.strict
    tg.config.strict = True
    try:
        x = torch.tensor(X).as_subclass(CudaLooking).requires_grad_()
        w = torch.tensor(W, requires_grad=True)
        y = WeightedSum()(graph=G, src={"x": x}, dst={}, edge={"w": w})
        y.sum().backward()
    finally:
        tg.config.strict = old
    assert seen and set(seen) == {"triton"}
    want = WeightedSum().reference(graph=G, src={"x": X}, dst={}, edge={"w": W})
    np.testing.assert_allclose(y.detach().numpy(), np.asarray(want))
    dx, dw = reference_grad(lambda a, b: WeightedSum().reference(
        graph=G, src={"x": a}, dst={}, edge={"w": b}).sum(), argnums=(0, 1))(X, W)
    np.testing.assert_allclose(x.grad.numpy(), np.asarray(dx))
    np.testing.assert_allclose(w.grad.numpy(), np.asarray(dw))
    assert selected_backend() != "triton"    # the choice was the call's only


def test_explain_for_cuda_inputs_reports_triton_and_schedule(monkeypatch):
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: OK)
    monkeypatch.setattr(BACKENDS["triton"], "interpreter", False)   # explained, never run
    x = torch.tensor(X).as_subclass(CudaLooking)
    text = str(WeightedSum().explain(graph=G, src={"x": x}, dst={}, edge={"w": torch.tensor(W)}))
    assert "route:      triton (fused Triton kernels (CUDA))" in text
    assert "schedule:   triton: block_rows=" in text and "num_stages=" in text
    assert selected_backend() != "triton"
    monkeypatch.setattr(BACKENDS["triton"], "availability", lambda: NO_GPU)
    with pytest.raises(tg.UnsupportedError, match=r"src\.x: lives on cuda:0.*unavailable"):
        WeightedSum().explain(graph=G, src={"x": x}, dst={}, edge={"w": torch.tensor(W)})
