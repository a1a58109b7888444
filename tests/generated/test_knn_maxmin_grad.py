"""Max/min gradients over a kNN relation whose neighbours are selected inside the call (the
fused generated-relation kernels: cell shells up to 3-D, the tiled scan above) equal those over
the same relation resolved to a CSR first, the reference interpreter's, and a dense float64
torch oracle on the brute-force neighbour lists, through torch autograd (tg.nn.trace) and
through tg.grad.

The max/min VJP finds each segment's winning edge by recomputing the messages in the generic
CSR kernel and comparing them with the forward's result, so the fused kernel must round a
message exactly as the generic one does. It did not when the edge function read a weight along
a strided axis (a Linear narrowing its input: x . W over W's rows as stored): the generic kernel
re-lays such a weight out once per call and multiplies it by a fused matvec, the generated
kernels had no once-per-call block and took the plain loop. The last bits differed, no edge
matched, and the cotangent of most segments was lost.
"""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg

from .oracle import knn_rows, radius_rows

torch = pytest.importorskip("torch")

N, K, HIDDEN, OUT = 24, 5, 8, 3
RADIUS = {2: 0.9, 3: 1.2, 5: 2.2}    # a few neighbours per point of _points (loop: >= 1)
DIMS = (2, 3, 4, 5, 6)
REDUCERS = ("max", "min")


def _points(dims: int, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(100 + dims)
    x = rng.standard_normal((N, dims))
    if ties:
        # every point has a bitwise twin: twin sources are at equal distance and send equal
        # messages, so each segment's extremum is held by two edges (the first one wins)
        x[N // 2:] = x[:N // 2][::-1]
    return x


def _net(dims: int) -> torch.nn.Module:
    torch.manual_seed(dims)
    return torch.nn.Sequential(torch.nn.Linear(2 * dims, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, OUT)).double()


def _dense(x, reducer, message, rows=None):
    """Dense float64 oracle: y_i = max/min over the oracle's rows (kNN: nearest first, ties
    by smaller index; radius: ascending ids) of message(x_i, x_j - x_i); torch's max/min
    along a dim return the first extremal index, so a tie's cotangent goes to the first
    edge, as Tiga's rule."""
    if rows is None:
        rows = knn_rows(x.detach().numpy(), K, loop=True)
    out = []
    for i, src in enumerate(rows):
        src = torch.as_tensor(src)
        xi = x[i].expand(len(src), -1)
        msg = message(torch.cat([xi, x[src] - xi], dim=-1))
        out.append(getattr(msg, reducer)(dim=0).values)
    return torch.stack(out)


def _torch_layer(net, reducer):
    class EdgeMLP(tg.MessagePassing):
        def __init__(self):
            self.h = tg.nn.trace(net)

        def edge(self, src, dst, edge):
            return self.h(dst.x, src.x - dst.x)

    EdgeMLP.reducer = getattr(tg, reducer)()
    return EdgeMLP()


def _torch_grads(net, x_np, reducer, route):
    x = torch.tensor(x_np, requires_grad=True)
    wrt = [x] + list(net.parameters())
    if route == "oracle":
        y = _dense(x, reducer, net)
    else:
        layer = _torch_layer(net, reducer)
        g = tg.Graph.knn(torch.tensor(x_np), K, loop=True)
        if route == "resolved":
            g.resolve_csr()
        call = layer.reference if route == "reference" else layer
        y = call(graph=g, src={"x": x}, dst={"x": x})
    grads = torch.autograd.grad(y.square().sum(), wrt)
    return [y.detach().numpy()] + [gr.numpy() for gr in grads]


def _close(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=f"{what}: output {i}")


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.parametrize("dims", DIMS)
def test_torch_autograd_in_call_selection(dims, reducer, ties):
    net, x = _net(dims), _points(dims, ties)
    oracle = _torch_grads(net, x, reducer, "oracle")
    for route in ("in-call", "resolved", "reference"):
        _close(_torch_grads(net, x, reducer, route), oracle, f"{route} {dims}-D {reducer}")


def _weights(dims):
    rng = np.random.default_rng(7 * dims)
    # (out, in) as a Linear stores them: the edge function contracts their rows (strided)
    return rng.standard_normal((HIDDEN, 2 * dims)), rng.standard_normal((OUT, HIDDEN))


def _row_message(h, w1, w2):
    m = tg.math
    a = m.dot_general(h, w1, (((0,), (1,)), ((), ())))
    a = m.where(m.greater(a, 0.0), a, 0.0)
    return m.dot_general(a, w2, (((0,), (1,)), ((), ())))


def _tg_layer(reducer):
    class EdgeMLP(tg.MessagePassing):
        def edge(self, src, dst, edge, w1, w2):
            h = tg.math.concatenate([dst.x, src.x - dst.x], axis=-1)
            return _row_message(h, w1, w2)

    EdgeMLP.reducer = getattr(tg, reducer)()
    return EdgeMLP()


def _relation(x, kind):
    if kind == "knn":
        return tg.Graph.knn(x, K, loop=True)
    return tg.Graph.radius(x, RADIUS[x.shape[1]], loop=True)


def _tg_grads(x, w1, w2, reducer, route, kind="knn"):
    layer = _tg_layer(reducer)

    def loss(xx, a, b):
        if route == "generated":    # the relation is generated inside the traced program
            g = _relation(xx, kind)
        else:
            g = _relation(x, kind)
            if route == "resolved":
                g.resolve_csr()
        call = layer.reference if route == "reference" else layer
        y = call(graph=g, src={"x": xx}, dst={"x": xx}, w1=a, w2=b)
        return tg.math.sum(y * y)

    return [np.asarray(gr) for gr in tg.grad(loss, argnums=(0, 1, 2))(x, w1, w2)]


def _tg_oracle(x, w1, w2, reducer, rows=None):
    tx, t1, t2 = (torch.tensor(a, requires_grad=True) for a in (x, w1, w2))
    y = _dense(tx, reducer, lambda h: torch.relu(h @ t1.T) @ t2.T, rows)
    return [gr.numpy() for gr in torch.autograd.grad(y.square().sum(), [tx, t1, t2])]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.parametrize("dims", DIMS)
def test_tg_grad_in_call_selection(dims, reducer, ties):
    x, (w1, w2) = _points(dims, ties), _weights(dims)
    oracle = _tg_oracle(x, w1, w2, reducer)
    for route in ("in-call", "generated", "resolved", "reference"):
        _close(_tg_grads(x, w1, w2, reducer, route), oracle, f"{route} {dims}-D {reducer}")


@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.parametrize("dims", sorted(RADIUS))
def test_radius_tg_grad_in_call_walk(dims, reducer):
    """A radius relation's forward takes the fused cell walk (the plain scan above 3-D), its
    max/min VJP the CSR kernel: the same message rounding is needed there too."""
    x, (w1, w2) = _points(dims, True), _weights(dims)
    oracle = _tg_oracle(x, w1, w2, reducer, radius_rows(x, RADIUS[dims], loop=True))
    for route in ("in-call", "generated", "resolved"):
        _close(_tg_grads(x, w1, w2, reducer, route, "radius"), oracle,
               f"radius {route} {dims}-D {reducer}")


@pytest.mark.parametrize("kind", ["knn", "radius"])
@pytest.mark.parametrize("dims", (2, 5))
def test_fused_walk_messages_round_as_the_csr_kernel(dims, kind):
    """The invariant the max/min VJP rests on, checked directly: a max over the fused walk
    equals, bit for bit, the max over the same relation resolved to a CSR (the order of a
    max does not change its value, so any difference is a message rounded differently)."""
    x, (w1, w2) = _points(dims, False), _weights(dims)
    layer = _tg_layer("max")
    got = []
    for resolve in (False, True):
        g = _relation(x, kind)
        if resolve:
            g.resolve_csr()
        got.append(np.asarray(layer(graph=g, src={"x": x}, dst={"x": x}, w1=w1, w2=w2)))
    np.testing.assert_array_equal(got[0], got[1])
