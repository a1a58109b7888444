"""The cell-tiled radius body (lower/triton/cell_tiles.py) and the kNN lists' knn_tiles
(lower/triton/knn_tiles.py) compiled for the CUDA device over point sets spanning many
programs and cells (8,000 points on the GPU): radius propagates forward and
torch-autograd backward, and kNN lists with and without a query set, against the reference
interpreter. Strict: nothing falls back.

Marked gpu; skipped without CUDA and in a process whose triton was imported for the
interpreter (as tests/gpu/test_cuda_kernels.py); TIGA_GPU_TESTS_ON_CPU=1 runs them on CPU
tensors through triton-interpreter (600 points)."""

import numpy as np
import pytest
from gpu_env import BACKEND, DEVICE, MARKS, ON_CPU, WHY, torch  # noqa: E402,F401  (before tiga)

import tiga as tg  # noqa: E402
from tiga.core import graph_generated as geo  # noqa: E402
from tiga.testing import reference_grad  # noqa: E402
from tiga.xla_free_runtime.backends.triton import generated as triton_generated  # noqa: E402

N = 600 if ON_CPU else 8000
pytestmark = MARKS


class Near(tg.MessagePassing):
    reducer = tg.mean()

    def edge(self, src, dst, edge):
        return src.x * 2.0 - dst.h


@pytest.mark.parametrize("dims", [2, 3])
def test_radius_cell_tiles(dims):
    rng = np.random.default_rng(dims)
    pos = rng.random((N, dims))
    cutoff = (12.0 / N) ** (1.0 / dims)            # about a dozen neighbours
    fields = {"src": {"x": rng.normal(size=(N, 4))}, "dst": {"h": rng.normal(size=(N, 4))}}
    dev = {r: {k: torch.tensor(v, device=DEVICE, requires_grad=True) for k, v in d.items()}
           for r, d in fields.items()}
    g = tg.Graph.radius(torch.tensor(pos, device=DEVICE), cutoff)
    host = tg.Graph.radius(pos, cutoff)
    y = Near()(graph=g, **dev)
    want = np.asarray(Near().reference(graph=host, **fields))
    np.testing.assert_allclose(y.detach().cpu().numpy(), want, rtol=1e-10, atol=1e-12)
    y.sum().backward()
    gx, gh = reference_grad(lambda x, h: Near().reference(
        graph=host, src={"x": x}, dst={"h": h}).sum(), argnums=(0, 1))(
        fields["src"]["x"], fields["dst"]["h"])
    np.testing.assert_allclose(dev["src"]["x"].grad.cpu().numpy(), np.asarray(gx), rtol=1e-9,
                               atol=1e-10)
    np.testing.assert_allclose(dev["dst"]["h"].grad.cpu().numpy(), np.asarray(gh), rtol=1e-9,
                               atol=1e-10)


@pytest.mark.parametrize("dims,queries", [(3, None), (2, 500)])
def test_knn_tiles_lists(dims, queries):
    rng = np.random.default_rng(10 + dims)
    pos = rng.random((N, dims)).astype(np.float32)
    pos[:5] = pos[5]                                # ties by index
    query = None if queries is None else rng.random((queries, dims)).astype(np.float32)
    g = tg.Graph.knn(pos, 12, query=query)
    walk = triton_generated.generated_walk(g, ("csr",), DEVICE)
    _, want = geo.knn_csr(pos, query, 12, False)
    np.testing.assert_array_equal(walk["col_idx"].cpu().numpy()[:len(want)], want)
