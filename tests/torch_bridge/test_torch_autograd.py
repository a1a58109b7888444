"""torch bridge: propagate calls on torch tensors, torch.autograd through Tiga's VJP, DLPack.

Oracles are independent of Tiga: torch's own scatter_reduce / index_add (and its autograd)
over an explicit edge list, torch.autograd.gradcheck (finite differences in float64), and the
report's documented numbers for its WeightedSum listing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402
from tiga.torch_bridge import run_call_torch, to_numpy, to_torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REDUCERS = ("sum", "mean", "max", "min", "prod", "online_softmax")
NUM_SRC, NUM_DST, FEAT = 5, 4, 3
# destination 2 has no edges; the sources repeat (duplicate edges) and include self ids
DEGREES = np.array([3, 2, 0, 4])


class WeightedSum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge):
        return src.x * edge.w


def report_graph(index=torch.tensor):
    return tg.Graph.from_csr(index([0, 2, 3, 3]), index([0, 1, 1]), num_src=2,
                             validate="full")


# ---- a small random relation and its explicit edge list ------------------------------------

def random_relation(seed=0):
    rng = np.random.default_rng(seed)
    row_ptr = np.concatenate([[0], np.cumsum(DEGREES)])
    col = rng.integers(0, NUM_SRC, int(DEGREES.sum()))
    col[:2] = 1  # a duplicate edge into destination 0
    graph = tg.Graph.from_csr(row_ptr, col, num_src=NUM_SRC)
    dst = np.repeat(np.arange(NUM_DST), DEGREES)
    return graph, torch.as_tensor(col), torch.as_tensor(dst)


def message_torch(x, h, a, scale, src, dst):
    """The per-edge message of `Layer` below, computed by torch on the edge list."""
    return x[src] * a + h[dst] * scale


def torch_oracle(name, x, h, a, b, scale, src, dst):
    """API.md section 3 semantics with torch ops; empty rows finalize to the identity."""
    if name == "online_softmax":
        score = (x[src] * h[dst]).sum(-1) * scale + b
        value = x[src] + a
        top = torch.zeros(NUM_DST, dtype=score.dtype).scatter_reduce(
            0, dst, score, "amax", include_self=False)
        p = torch.exp(score - top[dst])
        mass = torch.zeros(NUM_DST, dtype=p.dtype).index_add(0, dst, p)
        acc = torch.zeros(NUM_DST, FEAT, dtype=p.dtype).index_add(0, dst, p[:, None] * value)
        return acc / torch.where(mass > 0, mass, torch.ones_like(mass))[:, None]
    msg = message_torch(x, h, a, scale, src, dst)
    mode = {"max": "amax", "min": "amin"}.get(name, name)
    init = torch.ones if name == "prod" else torch.zeros
    index = dst[:, None].expand_as(msg)
    return init(NUM_DST, FEAT, dtype=msg.dtype).scatter_reduce(0, index, msg, mode,
                                                               include_self=False)


def make_layer(name):
    reducer = getattr(tg, name)()

    class Layer(tg.MessagePassing):
        def edge(self, src, dst, edge, scale):
            if name == "online_softmax":
                score = tg.math.sum(src.x * dst.h, axis=-1) * scale + edge.b
                return self.reducer(score, src.x + edge.a)
            return src.x * edge.a + dst.h * scale

    Layer.reducer = reducer
    return Layer()


def well_separated_inputs(name, src, dst):
    """float64 inputs whose competing max/min messages differ by at least 0.05, so that
    finite differences never cross a tie (a kink of max/min)."""
    for seed in range(100):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(NUM_SRC, FEAT, dtype=torch.float64, generator=g)
        h = torch.randn(NUM_DST, FEAT, dtype=torch.float64, generator=g)
        a = torch.randn(int(DEGREES.sum()), FEAT, dtype=torch.float64, generator=g)
        b = torch.randn(int(DEGREES.sum()), dtype=torch.float64, generator=g)
        scale = torch.tensor(0.7, dtype=torch.float64)
        if name not in ("max", "min") or _min_gap(message_torch(x, h, a, scale, src, dst),
                                                  dst) > 0.05:
            return [t.requires_grad_() for t in (x, h, a, b, scale)]
    raise AssertionError("no well-separated inputs found")


def _min_gap(msg, dst):
    gaps = [np.inf]
    for i in range(NUM_DST):
        rows = np.sort(msg[dst == i].detach().numpy(), axis=0)
        if len(rows) > 1:
            gaps.append(np.diff(rows, axis=0).min())
    return min(gaps)


def call_layer(layer, graph, x, h, a, b, scale, name):
    edge = {"a": a, "b": b} if name == "online_softmax" else {"a": a}
    return layer(graph=graph, src={"x": x}, dst={"h": h}, edge=edge, scale=scale)


# ---- the report's listing -------------------------------------------------------------------

def test_report_listing_with_torch_autograd():
    graph = report_graph()
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], requires_grad=True)
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert y.grad_fn is not None
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    # the report's documented result: y=[23,6,0], dx=[4,7], dw=[2,3,3]
    assert y.tolist() == [23.0, 6.0, 0.0]
    assert dx.tolist() == [4.0, 7.0]
    assert dw.tolist() == [2.0, 3.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_and_gradient_dtypes_follow_the_inputs(dtype):
    graph, src, dst = random_relation(1)
    x = torch.randn(NUM_SRC, dtype=dtype, requires_grad=True)
    w = torch.randn(len(src), dtype=dtype, requires_grad=True)
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    assert y.dtype == dtype and y.device.type == "cpu"
    ref = torch.zeros(NUM_DST, dtype=dtype).index_add(0, dst, x[src] * w)
    torch.testing.assert_close(y, ref)
    ct = torch.randn(NUM_DST, dtype=dtype)
    got = torch.autograd.grad(y, (x, w), ct)
    want = torch.autograd.grad(ref, (x, w), ct)
    for g, r in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g, r)


# ---- every built-in reducer: torch oracle and gradcheck ------------------------------------

@pytest.mark.parametrize("name", REDUCERS)
def test_reducer_matches_torch_oracle(name):
    graph, src, dst = random_relation()
    x, h, a, b, scale = well_separated_inputs(name, src, dst)
    y = call_layer(make_layer(name), graph, x, h, a, b, scale, name)
    ref = torch_oracle(name, x, h, a, b, scale, src, dst)
    torch.testing.assert_close(y, ref)
    ct = torch.randn(NUM_DST, FEAT, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    inputs = (x, h, a, b, scale) if name == "online_softmax" else (x, h, a, scale)
    got = torch.autograd.grad(y, inputs, ct)
    want = torch.autograd.grad(ref, inputs, ct)
    for g, r, what in zip(got, want, ("x", "h", "a", "b", "scale")):
        torch.testing.assert_close(g, r, msg=lambda m, what=what: f"d{what}: {m}")


@pytest.mark.parametrize("name", REDUCERS)
def test_gradcheck_float64(name):
    graph, src, dst = random_relation()
    x, h, a, b, scale = well_separated_inputs(name, src, dst)
    layer = make_layer(name)
    if name == "online_softmax":
        fn = lambda x, h, a, b, s: call_layer(layer, graph, x, h, a, b, s, name)  # noqa: E731
        inputs = (x, h, a, b, scale)
    else:
        fn = lambda x, h, a, s: call_layer(layer, graph, x, h, a, None, s, name)  # noqa: E731
        inputs = (x, h, a, scale)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


# ---- requires_grad, no_grad, double backward, in-place ---------------------------------------

def test_mixed_requires_grad():
    graph, src, dst = random_relation(2)
    x = torch.randn(NUM_SRC, dtype=torch.float64, requires_grad=True)
    w = torch.randn(len(src), dtype=torch.float64)  # a constant
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    assert y.requires_grad
    y.square().sum().backward()
    ref_x = x.detach().clone().requires_grad_()
    torch.zeros(NUM_DST, dtype=torch.float64).index_add(0, dst, ref_x[src] * w) \
        .square().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    assert w.grad is None


def test_no_grad_and_constant_inputs_give_plain_tensors():
    graph = report_graph()
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], requires_grad=True)
    with torch.no_grad():
        y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    assert y.grad_fn is None and not y.requires_grad
    ref = torch.zeros(3).index_add(0, torch.tensor([0, 0, 1]), x.detach()[[0, 1, 1]] * w.detach())
    torch.testing.assert_close(y, ref)
    y2 = WeightedSum()(graph=graph, src={"x": x.detach()}, dst={}, edge={"w": w.detach()})
    assert y2.grad_fn is None and not y2.requires_grad
    torch.testing.assert_close(y2, ref)


def test_double_backward_is_the_second_derivative():
    """create_graph=True: the backward is Tiga's VJP program as a node of its own, so a
    second derivative reaches it (it raised before issue 38)."""
    graph = report_graph()
    x = torch.tensor([2.0, 3.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    (dx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    # the first derivative itself is right (2 * y[dst] * w, summed per source)
    torch.testing.assert_close(dx.detach(), torch.tensor([2 * 23.0 * 4, 2 * 23.0 * 5 + 2 * 6.0 * 2],
                                                         dtype=torch.float64))
    # the same in torch: edges (src 0 -> dst 0, src 1 -> dst 0, src 1 -> dst 1)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    yr = torch.zeros(3, dtype=torch.float64).index_add(
        0, torch.tensor([0, 0, 1]), xr[torch.tensor([0, 1, 1])] * wr)
    (dxr,) = torch.autograd.grad(yr.square().sum(), xr, create_graph=True)
    torch.testing.assert_close(torch.autograd.grad(dx.sum(), w)[0],
                               torch.autograd.grad(dxr.sum(), wr)[0])


def test_in_place_change_before_backward_is_detected():
    graph = report_graph()
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], requires_grad=True)
    y = WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    with torch.no_grad():
        w.mul_(2.0)  # the saved forward operands no longer hold
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_several_outputs():
    graph, src, dst = random_relation(4)
    x = torch.randn(NUM_SRC, FEAT, dtype=torch.float64, requires_grad=True)
    h = torch.randn(NUM_DST, FEAT, dtype=torch.float64, requires_grad=True)

    def edge(s, d, e):
        return s.x * d.h, tg.math.tanh(s.x - d.h)

    y1, y2 = tg.propagate(graph, edge, tg.sum(), src={"x": x}, dst={"h": h})
    r1 = torch.zeros(NUM_DST, FEAT, dtype=torch.float64).index_add(0, dst, x[src] * h[dst])
    r2 = torch.zeros(NUM_DST, FEAT, dtype=torch.float64).index_add(
        0, dst, torch.tanh(x[src] - h[dst]))
    torch.testing.assert_close(y1, r1)
    torch.testing.assert_close(y2, r2)
    got = torch.autograd.grad(y1.sum() + y2.square().sum(), (x, h), retain_graph=True)
    want = torch.autograd.grad(r1.sum() + r2.square().sum(), (x, h), retain_graph=True)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)
    # only the first output used: the second's cotangent is zero, not an error
    got = torch.autograd.grad(y1.sum(), x)[0]
    torch.testing.assert_close(got, torch.autograd.grad(r1.sum(), x)[0])


# ---- captured torch tensors (closures over parameters) -------------------------------------

class Linear(tg.MessagePassing):
    reducer = tg.sum()

    def __init__(self, weight, temperature):
        self.weight = weight
        self.temperature = temperature

    def edge(self, src, dst, edge):
        return (src.x @ self.weight) * edge.a * self.temperature


def test_captured_parameters_receive_gradients():
    graph, src, dst = random_relation(5)
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(FEAT, 2, dtype=torch.float64))
    temperature = torch.nn.Parameter(torch.tensor(1.3, dtype=torch.float64))  # 0-d capture
    x = torch.randn(NUM_SRC, FEAT, dtype=torch.float64, requires_grad=True)
    a = torch.randn(len(src), dtype=torch.float64, requires_grad=True)
    y = Linear(weight, temperature)(graph=graph, src={"x": x}, edge={"a": a})
    ref = torch.zeros(NUM_DST, 2, dtype=torch.float64).index_add(
        0, dst, (x[src] @ weight) * a[:, None] * temperature)
    torch.testing.assert_close(y, ref)
    ct = torch.randn(NUM_DST, 2, dtype=torch.float64)
    params = (weight, temperature, x, a)
    for g, r in zip(torch.autograd.grad(y, params, ct), torch.autograd.grad(ref, params, ct)):
        torch.testing.assert_close(g, r)


def test_captured_parameter_of_another_dtype_and_torch_ops_on_it():
    graph, src, dst = random_relation(6)
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(FEAT, 2))  # float32 against float64 fields
    x = torch.randn(NUM_SRC, FEAT, dtype=torch.float64)
    a = torch.randn(len(src), dtype=torch.float64)
    # torch computes `weight * 2` outside Tiga; Tiga captures the result, torch chains on
    y = Linear(weight * 2.0, 1.0)(graph=graph, src={"x": x}, edge={"a": a})
    assert y.dtype == torch.float64
    ref = torch.zeros(NUM_DST, 2, dtype=torch.float64).index_add(
        0, dst, (x[src] @ (weight.double() * 2.0)) * a[:, None])
    torch.testing.assert_close(y, ref)
    (g,) = torch.autograd.grad(y.sum(), weight)
    (r,) = torch.autograd.grad(ref.sum(), weight)
    assert g.dtype == torch.float32
    torch.testing.assert_close(g, r)


def test_update_function_captures_parameters():
    graph, src, dst = random_relation(9)
    torch.manual_seed(2)
    weight = torch.nn.Parameter(torch.randn(FEAT, FEAT, dtype=torch.float64))
    bias = torch.nn.Parameter(torch.randn(FEAT, dtype=torch.float64))

    class Gated(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x @ weight

        def update(self, dst, aggregated):
            return tg.math.tanh(aggregated + bias) * dst.h

    x = torch.randn(NUM_SRC, FEAT, dtype=torch.float64, requires_grad=True)
    h = torch.randn(NUM_DST, FEAT, dtype=torch.float64, requires_grad=True)
    y = Gated()(graph=graph, src={"x": x}, dst={"h": h})
    agg = torch.zeros(NUM_DST, FEAT, dtype=torch.float64).index_add(0, dst, x[src] @ weight)
    ref = torch.tanh(agg + bias) * h
    torch.testing.assert_close(y, ref)
    params = (weight, bias, x, h)
    for g, r in zip(torch.autograd.grad(y.sum(), params), torch.autograd.grad(ref.sum(), params)):
        torch.testing.assert_close(g, r)


# ---- relations from torch index tensors ------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_graph_from_torch_index_tensors(index_dtype):
    graph, src, dst = random_relation(7)
    row_ptr, col = graph.resolve_csr()
    as_t = lambda v: torch.as_tensor(np.asarray(v), dtype=index_dtype)  # noqa: E731
    built = [
        tg.Graph.from_csr(as_t(row_ptr), as_t(col), num_src=NUM_SRC),
        tg.Graph.from_coo(as_t(src), as_t(dst), num_src=NUM_SRC, num_dst=NUM_DST),
    ]
    x = torch.randn(NUM_SRC, dtype=torch.float64, requires_grad=True)
    w = torch.randn(len(src), dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(NUM_DST, dtype=torch.float64).index_add(0, dst, x[src] * w)
    want = torch.autograd.grad(ref.sum(), (x, w))
    for g in built:
        np.testing.assert_array_equal(g.resolve_csr()[0], row_ptr)
        np.testing.assert_array_equal(g.resolve_csr()[1], col)
        y = WeightedSum()(graph=g, src={"x": x}, dst={}, edge={"w": w})
        torch.testing.assert_close(y, ref)
        for got, r in zip(torch.autograd.grad(y.sum(), (x, w)), want):
            torch.testing.assert_close(got, r)


# ---- routes ------------------------------------------------------------------------------

def _spy(monkeypatch, name):
    """Count calls of the route function `name` the bridge uses, delegating to it."""
    import tiga.torch_bridge.autograd as bridge

    real, calls = getattr(bridge, name), []

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(bridge, name, spy)
    return calls


@pytest.mark.parametrize("route", ["auto", "reference"])
def test_forward_and_backward_take_the_requested_route(monkeypatch, route):
    graph, src, dst = random_relation(8)
    x = torch.randn(NUM_SRC, dtype=torch.float64, requires_grad=True)
    w = torch.randn(len(src), dtype=torch.float64, requires_grad=True)
    executed, evaluated = _spy(monkeypatch, "execute"), _spy(monkeypatch, "eval_program")
    layer = WeightedSum()
    run = layer if route == "auto" else layer.reference
    y = run(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    dx, dw = torch.autograd.grad(y.sum(), (x, w))
    # forward and backward (Tiga's VJP program) both ran on the route, never on torch ops
    assert (len(executed), len(evaluated)) == ((2, 0) if route == "auto" else (0, 2))
    ref = torch.zeros(NUM_DST, dtype=torch.float64).index_add(0, dst, x[src] * w)
    torch.testing.assert_close(y, ref)
    for g, r in zip((dx, dw), torch.autograd.grad(ref.sum(), (x, w))):
        torch.testing.assert_close(g, r)


def test_strict_mode_is_honoured_by_the_auto_route_only():
    graph = report_graph()
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    w = torch.tensor([4.0, 5.0, 2.0], requires_grad=True)
    layer = WeightedSum()
    kwargs = dict(graph=graph, src={"x": x}, dst={}, edge={"w": w})
    falls_back = layer.explain(**kwargs).route == "reference"
    ref = torch.zeros(3).index_add(0, torch.tensor([0, 0, 1]), x[[0, 1, 1]] * w)
    saved = tg.config.strict
    tg.config.strict = True
    try:
        if falls_back:
            with pytest.raises(tg.UnsupportedError, match="strict mode"):
                layer(**kwargs)
        else:
            torch.testing.assert_close(layer(**kwargs), ref)
        y = layer.reference(**kwargs)  # the oracle route never consults strict mode
        dx, dw = torch.autograd.grad(y.sum(), (x, w))
    finally:
        tg.config.strict = saved
    torch.testing.assert_close(y, ref)
    for g, r in zip((dx, dw), torch.autograd.grad(ref.sum(), (x, w))):
        torch.testing.assert_close(g, r)


def test_bad_inputs_name_the_argument():
    graph = report_graph()
    layer = WeightedSum()
    with pytest.raises(tg.ShapeError, match=r"src\.x: .*leading axis of 2"):
        layer(graph=graph, src={"x": torch.ones(3)}, dst={}, edge={"w": torch.ones(3)})
    with pytest.raises(tg.DTypeError, match=r"edge\.w: torch dtype torch.complex64"):
        layer(graph=graph, src={"x": torch.ones(2)}, dst={},
              edge={"w": torch.ones(3, dtype=torch.complex64)})
    call = layer._call(graph, {"x": torch.ones(2)}, {}, {"w": torch.ones(3)}, {})
    with pytest.raises(tg.TigaError, match="route: expected one of"):
        run_call_torch(call, route="gpu")


# ---- DLPack aliasing -------------------------------------------------------------------------

def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def test_tg_from_dlpack_aliases_torch_memory():
    t = torch.arange(6, dtype=torch.float32, requires_grad=True)
    tt = tg.from_dlpack(t)
    assert tt.shape == (6,) and tt.dtype == tg.float32
    assert _address(tt.numpy()) == t.data_ptr()
    with torch.no_grad():
        t[2] = 42.0
    assert tt.numpy()[2] == 42.0
    strided = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous: strides carried over
    ts = tg.from_dlpack(strided)
    np.testing.assert_array_equal(ts.numpy(), strided.numpy())
    assert _address(ts.numpy()) == strided.data_ptr()


def test_torch_from_dlpack_aliases_tg_memory():
    base = np.arange(5.0)
    a = tg.asarray(base)
    t = torch.from_dlpack(a)
    assert t.data_ptr() == _address(a.numpy())
    t[1] = -7.0
    assert a.numpy()[1] == -7.0
    t2 = to_torch(a)
    assert t2.data_ptr() == t.data_ptr()


def test_bridge_helpers_share_memory():
    t = torch.arange(12.0).reshape(3, 4).t()
    view = to_numpy(t)
    assert _address(view) == t.data_ptr() and view.strides == (4, 16)
    assert not view.flags.writeable  # Tiga's numpy rules cannot write into the caller's tensor
    t[0, 0] = 99.0
    assert view[0, 0] == 99.0
    arr = np.arange(4.0)
    back = to_torch(arr)
    assert back.data_ptr() == _address(arr)
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert to_numpy(bf).dtype == tg.bfloat16.np and _address(to_numpy(bf)) == bf.data_ptr()
    assert to_torch(np.array([1.5, -2.0], tg.bfloat16.np)).dtype == torch.bfloat16


# ---- the example script ------------------------------------------------------------------------

NO_TORCH = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked (import of {name!r})")

    sys.meta_path.insert(0, BlockTorch())
    runpy.run_path("examples/weighted_sum.py", run_name="__main__")
    assert "torch" not in sys.modules
    """
)


@pytest.mark.parametrize("with_torch", [True, False])
def test_weighted_sum_example_runs(with_torch):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TIGA_DEMO_VERBOSE"] = "1"     # each value, the program and explain(), not one line
    cmd = ([sys.executable, "examples/weighted_sum.py"] if with_torch
           else [sys.executable, "-c", NO_TORCH])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.stdout.rstrip().endswith("ok")
    assert "numpy dw = [2.0, 3.0, 3.0]" in proc.stdout
    assert "propagate[" in proc.stdout and "route:" in proc.stdout
    assert ("torch dw = [2.0, 3.0, 3.0]" in proc.stdout) == with_torch
