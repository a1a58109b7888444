"""The row-tiled CSR gather kernels (lower/triton/row_tiles.py) compiled for the CUDA device,
forward and torch-autograd backward on device tensors against the numpy reference
interpreter: every reducer at the widths the schedule tiles differently (32 features: 8
rows x 16 neighbours per program and 128-bit row loads; 20 padded to 32; 8; 16 with a
float32 online_softmax), float64, float32 and float16 fields, int32 and int64 relations of
3000 rows spanning hundreds of programs with empty rows, duplicates and hubs above the split
degree, an update, argmin/argmax ids, NaN through max. Strict: nothing falls back.

Marked gpu; skipped without CUDA and in a process whose triton was imported for the
interpreter (as tests/gpu/test_cuda_kernels.py); TIGA_GPU_TESTS_ON_CPU=1 runs them on CPU
tensors through triton-interpreter (300 rows; minutes)."""

import numpy as np
import pytest
from gpu_env import BACKEND, DEVICE, MARKS, ON_CPU, WHY, torch  # noqa: E402,F401  (before tiga)

import tiga as tg  # noqa: E402
from tiga.testing import reference_grad  # noqa: E402

pytestmark = MARKS
TILED = "BLOCK_R * BLOCK_N"


ROWS = 300 if ON_CPU else 3000   # (the interpreter: a tenth, still ~40 programs)


def graph(index, seed: int = 0, rows: int = ROWS):
    """Degrees 0..40 (a fifth of the rows empty), three hubs of 200..500 (split path)."""
    rng = np.random.default_rng(seed)
    deg = np.where(rng.random(rows) < 0.2, 0, rng.integers(1, 41, rows))
    deg[rng.choice(rows, 3, replace=False)] = rng.integers(200, 500, 3)
    row_ptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    n_src = 700
    return tg.Graph.from_csr(row_ptr, rng.integers(0, n_src, int(row_ptr[-1])).astype(index),
                             num_src=n_src)


def layer_for(reducer: str, with_update: bool = False):
    class Layer(tg.MessagePassing):
        def edge(self, src, dst, edge):
            m = tg.math.tanh(src.x) * edge.w + dst.h * 0.5
            if reducer == "online_softmax":
                return self.reducer((src.x * dst.h).sum(axis=-1) * edge.w, m)
            if reducer == "prod":
                return 1.0 + 0.01 * m
            return m

        if with_update:
            def update(self, dst, aggregated):
                return aggregated * 2.0 - dst.h
    Layer.reducer = getattr(tg, reducer)()
    return Layer()


def fields(g, feat: int, dtype, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"src": {"x": rng.normal(size=(g.num_src, feat)).astype(dtype)},
            "dst": {"h": rng.normal(size=(g.num_dst, feat)).astype(dtype)},
            "edge": {"w": rng.uniform(0.5, 1.5, size=(g.num_edges,)).astype(dtype)}}


def run(layer, g, f: dict, *, rtol, atol, backward=True) -> None:
    assert TILED in layer.ir("triton", graph=g, **f)
    names = [(role, k) for role, d in f.items() for k in d]
    dev = {role: {k: torch.tensor(v, device=DEVICE, requires_grad=backward)
                  for k, v in d.items()} for role, d in f.items()}
    y = layer(graph=g, **dev)
    assert isinstance(y, torch.Tensor) and y.device.type == DEVICE
    want = np.asarray(layer.reference(graph=g, **f))
    got = y.detach().cpu().numpy()
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol)
    if not backward:
        return
    weights = np.random.default_rng(1).normal(size=want.shape)
    (y * torch.tensor(weights, device=DEVICE, dtype=y.dtype)).sum().backward()

    def loss(*arrays):
        out = {role: {} for role in f}
        for (role, k), a in zip(names, arrays):
            out[role][k] = a
        return (layer.reference(graph=g, **out) * weights).sum()

    grads = reference_grad(loss, argnums=tuple(range(len(names))))(
        *[f[r][k] for r, k in names])
    for (role, k), ref in zip(names, grads):
        np.testing.assert_allclose(dev[role][k].grad.cpu().numpy(), np.asarray(ref),
                                   rtol=rtol, atol=atol, err_msg=f"d {role}.{k}")


@pytest.mark.parametrize("reducer,feat,index", [
    ("sum", 32, np.int32), ("mean", 32, np.int64), ("max", 20, np.int32),
    ("min", 20, np.int64), ("prod", 8, np.int64), ("online_softmax", 16, np.int32)])
def test_every_reducer_float64(reducer, feat, index):
    g = graph(index)
    run(layer_for(reducer), g, fields(g, feat, np.float64, 2), rtol=1e-9, atol=1e-10)


def test_float32_row_gather_and_update():
    g = graph(np.int32, seed=3)
    run(layer_for("sum", with_update=True), g, fields(g, 32, np.float32, 4), rtol=2e-5,
        atol=2e-4)


def test_float16_sum_accumulates_in_float32():
    g = graph(np.int64, seed=5)
    run(layer_for("sum"), g, fields(g, 32, np.float16, 6), rtol=2e-3, atol=5e-2,
        backward=False)


@pytest.mark.parametrize("reducer", ["argmin", "argmax"])
def test_arg_reducers_pick_the_reference_ids(reducer):
    g = graph(np.int64, seed=7)
    f = fields(g, 32, np.float64, 8)
    f["src"]["x"] = np.round(f["src"]["x"], 1)   # ties: the smallest id wins
    run(layer_for(reducer), g, f, rtol=0, atol=0, backward=False)


def test_nan_wins_in_max():
    g = graph(np.int32, seed=9)
    f = fields(g, 32, np.float64, 10)
    f["src"]["x"][::97, 5] = np.nan
    layer = layer_for("max")
    y = layer(graph=g, **{r: {k: torch.tensor(v, device=DEVICE) for k, v in d.items()}
                          for r, d in f.items()})
    want = np.asarray(layer.reference(graph=g, **f))
    assert np.isnan(want).any()
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-12, atol=1e-12)   # NaN at NaN
