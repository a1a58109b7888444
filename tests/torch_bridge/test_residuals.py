"""save_residuals: the VJP reads the forward's intermediates instead of recomputing them,
with the same cotangents (against the unrewritten VJP and an independent torch oracle)."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.autodiff import vjp_program
from tiga.core.eval import eval_program
from tiga.core.passes import dce
from tiga.core.prims.graph import propagate_p
from tiga.opt import save_residuals
from tiga.trace.staging import make_program

torch = pytest.importorskip("torch")


def _layer(p, x, w):
    h = tg.math.tanh(x @ w)
    g = tg.Graph.radius(p, 0.35)
    y = tg.propagate(g, lambda s, d, e: s.h * (0.35 - e.distance), tg.sum(), src={"h": h})
    return tg.math.tanh(y) * h


def test_vjp_reads_saved_values_and_matches():
    rng = np.random.default_rng(2)
    p, x, w = rng.random((40, 3)), rng.standard_normal((40, 4)), rng.standard_normal((4, 5))
    fwd = make_program(_layer)(p, x, w)
    vjp = vjp_program(fwd, [True, True, True])
    n_out = len(fwd.outs)
    ct = rng.standard_normal((40, 5))
    want = eval_program(vjp, p, x, w, ct)[n_out:]
    saved = save_residuals(fwd, vjp)
    assert saved is not None
    fwd2, vjp2 = saved
    res = eval_program(fwd2, p, x, w)
    np.testing.assert_array_equal(res[0], eval_program(fwd, p, x, w)[0])
    got = eval_program(vjp2, p, x, w, ct, *res[n_out:])[n_out:]
    # the forward's propagate is not walked again by the VJP (only its transposed walks)
    n_fwd = sum(e.primitive is propagate_p for e in fwd.eqns)
    n_vjp = sum(e.primitive is propagate_p for e in vjp.eqns)
    assert sum(e.primitive is propagate_p for e in vjp2.eqns) == n_vjp - n_fwd
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

    # the same gradients from torch over the oracle's edge list
    pt, xt, wt = (torch.tensor(a, requires_grad=True) for a in (p, x, w))
    d = torch.cdist(pt.detach(), pt.detach())
    dst, src = torch.nonzero((d <= 0.35) & ~torch.eye(40, dtype=torch.bool), as_tuple=True)
    h = torch.tanh(xt @ wt)
    dist = ((pt[src] - pt[dst]) ** 2).sum(1).sqrt()
    y = torch.zeros(40, 5, dtype=torch.float64).index_add(0, dst, h[src] * (0.35 - dist)[:, None])
    out = torch.tanh(y) * h
    grads = torch.autograd.grad(out, (pt, xt, wt), torch.tensor(ct))
    for a, b in zip(got, grads):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-11)


def test_nothing_repeated_gives_none():
    def f(x):
        return x * 2.0

    fwd = make_program(f)(np.ones(3))
    # the cotangent alone (x -> 2 ct) repeats nothing of the forward
    assert save_residuals(fwd, dce(vjp_program(fwd, [True]), keep_outputs=[1])) is None


def test_fold_negations_is_bitwise_exact():
    from tiga.core.prims.elementwise import unary_p
    from tiga.opt import fold_negations

    def f(a, b, c):
        return -b + a, a + (-c), -c * 2.0

    vals = [np.array([0.0, -0.0, 1.5, -2.25, np.inf, 3.0]),
            np.array([0.0, 0.0, -0.5, 1e-300, 1.0, -0.0]),
            np.array([-0.0, 0.0, 7.0, -1e300, 2.0, np.nan])]
    prog = make_program(f)(*vals)
    folded = fold_negations(prog)
    # the negation also read by the product stays; the one read only by an add goes
    assert sum(e.primitive is unary_p["neg"] for e in folded.eqns) == 1
    for got, want in zip(eval_program(folded, *vals), eval_program(prog, *vals)):
        real = ~np.isnan(want)   # a NaN's sign bit carries no value
        np.testing.assert_array_equal(np.signbit(got)[real], np.signbit(want)[real])
        np.testing.assert_array_equal(got, want)



def test_saved_intermediate_survives_an_in_place_change_of_the_output():
    """An output that is a view (reshape) of an intermediate the VJP reads as a residual:
    changing that output tensor in place before backward leaves the gradients alone."""
    from tiga.torch_bridge.autograd import _Run

    def f(x):
        h = tg.math.tanh(x)
        return tg.math.reshape(h, (12,)), h * h

    x_np = np.linspace(-1.5, 2.0, 12).reshape(3, 4)
    program = make_program(f)(x_np)
    x = torch.tensor(x_np, requires_grad=True)
    run = _Run(program, [x_np], [x], "auto")
    view, _ = run.forward()
    assert run.residuals and not any(np.may_share_memory(r, np.asarray(view.numpy()))
                                     for r in run.residuals)
    view.mul_(0.0)
    (grad,) = run.backward([None, torch.ones(3, 4, dtype=torch.float64)])
    h = np.tanh(x_np)
    np.testing.assert_allclose(grad.numpy(), 2 * h * (1 - h * h), rtol=1e-12)
