"""vmap with batch-first fields (in_axes=0, out_axes=0, JAX's default) of a stored-CSR
propagate: the result is the propagate's own (rows, B, F) result with its batch axis moved
by a view (no copy back), so these check what the user gets from that view: the values of
a Python loop of the unbatched call, no aliasing of the arguments, and later uses of a
non-contiguous array (tg functions, numpy, torch, the disk tier).
"""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.autodiff.batching import final_batch_moves

ROWS, NB, F, B = 96, 5, 3, 4


def _relation(seed=0):
    rng = np.random.default_rng(seed)
    row_ptr = np.arange(ROWS + 1, dtype=np.int64) * NB
    col = rng.integers(0, ROWS, ROWS * NB).astype(np.int64)
    return tg.Graph.from_csr(row_ptr, col, num_src=ROWS)


G = _relation()
W = np.random.default_rng(1).standard_normal(ROWS * NB).astype(np.float32)


def fw(x, w):
    return tg.propagate(G, lambda s, d, e: s.x * e.w, tg.sum(), src={"x": x}, edge={"w": w})


def _xs(shape=(B, ROWS, F), dtype=np.float32, seed=2):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _loop(xs):
    return np.stack([np.asarray(fw(x, W)) for x in xs])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_first_vmap_matches_a_loop(dtype):
    xs = _xs(dtype=dtype)
    w = W.astype(dtype)
    got = tg.vmap(fw, in_axes=(0, None))(xs, w)
    want = np.stack([np.asarray(fw(x, w)) for x in xs])
    assert isinstance(got, tg.Tensor) and got.shape == want.shape
    assert np.asarray(got).dtype == dtype
    np.testing.assert_array_equal(np.asarray(got), want)
    # the default in_axes=0 maps the weights too: the same values, given per instance
    got = tg.vmap(fw)(xs, np.stack([w] * B))
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("out_axes", [0, 1, 2, -1, -2])
def test_batch_first_vmap_out_axes(out_axes):
    xs = _xs()
    got = np.asarray(tg.vmap(fw, in_axes=(0, None), out_axes=out_axes)(xs, W))
    np.testing.assert_array_equal(got, np.moveaxis(_loop(xs), 0, out_axes))


def test_the_result_is_the_propagates_own_with_the_batch_moved_by_a_view():
    """The batched program's final transpose (rows, B, F) -> (B, rows, F) is not run: the
    result is a strided view of the propagate's result, the values unchanged."""
    xs = _xs()
    got = np.asarray(tg.vmap(fw, in_axes=(0, None))(xs, W))
    assert not got.flags.c_contiguous
    assert got.strides == (F * got.itemsize, B * F * got.itemsize, got.itemsize)
    np.testing.assert_array_equal(got, _loop(xs))


def test_two_results_do_not_share_memory():
    def two(x, w):
        y = fw(x, w)
        return y, fw(x, w)

    xs = _xs()
    a, b = tg.vmap(two, in_axes=(0, None))(xs, W)
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_array_equal(a, b)
    if np.may_share_memory(a, b):
        pytest.fail("vmap returned two outputs over one buffer")


@pytest.mark.parametrize("fn, in_axes", [
    (lambda x: x, 1),                     # the program is one transpose of the argument
    (lambda x: tg.math.transpose(x, (1, 0)), 0),
    (lambda x: x.reshape((F, ROWS)), 2),
])
def test_a_result_that_is_a_transpose_of_the_input_does_not_alias_it(fn, in_axes):
    x = _xs((ROWS, F, B) if in_axes == 2 else (ROWS, B, F) if in_axes == 1 else (B, ROWS, F))
    got = tg.vmap(fn, in_axes=in_axes)(x)
    before = np.array(got)
    assert not np.shares_memory(np.asarray(got), x)
    x[...] = 7.0    # the caller reuses its array: the result keeps its values
    np.testing.assert_array_equal(np.asarray(got), before)


def test_final_batch_moves_keeps_transposes_of_arguments_and_views():
    xs = _xs((ROWS, B, F))
    prog = tg.make_program(tg.vmap(lambda x: x, in_axes=1))(xs)
    assert final_batch_moves(prog, [0]) == (prog, [None])
    prog = tg.make_program(tg.vmap(fw, in_axes=(0, None)))(_xs(), W)
    stripped, perms = final_batch_moves(prog, [0])
    assert perms == [(1, 0, 2)]
    assert [e.primitive.name for e in stripped.eqns].count("transpose") == 1   # the input's


def test_the_strided_result_in_later_uses():
    xs = _xs()
    got = tg.vmap(fw, in_axes=(0, None))(xs, W)
    want = _loop(xs)
    np.testing.assert_array_equal(np.asarray(fw(got[1], W)), np.asarray(fw(want[1], W)))
    np.testing.assert_array_equal(np.asarray(tg.jit(fw)(got[2], W)),
                                  np.asarray(fw(want[2], W)))
    np.testing.assert_array_equal(np.asarray(tg.vmap(fw, in_axes=(0, None))(got, W)),
                                  _loop(want))
    np.testing.assert_array_equal(np.asarray(got * 2.0 + 1.0), want * 2.0 + 1.0)
    np.testing.assert_array_equal(np.asarray(got.to("disk")), want)
    np.testing.assert_array_equal(np.array(got), want)
    # a reduction over the whole array reads it in its own order (float rounding apart)
    np.testing.assert_allclose(np.asarray(tg.math.sum(got)), want.sum(), rtol=1e-5)


def test_the_strided_result_in_torch():
    torch = pytest.importorskip("torch")
    xs = _xs()
    got = tg.vmap(fw, in_axes=(0, None))(xs, W)
    want = torch.from_numpy(_loop(xs))
    t = torch.from_numpy(np.asarray(got))
    assert torch.equal(t, want) and not t.is_contiguous()
    d = torch.from_dlpack(got)
    assert torch.equal(d, want)
    assert torch.equal(d.contiguous().view(-1), want.reshape(-1))
    assert torch.equal(torch.from_numpy(np.asarray(got)) @ torch.ones(F), want @ torch.ones(F))


def test_inside_a_trace_the_transpose_stays():
    """Under jit or grad the batched program is inlined, its transposes included: the
    result's layout is the enclosing program's business."""
    xs = _xs(dtype=np.float64)
    w = W.astype(np.float64)
    vm = tg.vmap(fw, in_axes=(0, None))
    got = np.asarray(tg.jit(vm)(xs, w))
    np.testing.assert_array_equal(got, np.asarray(vm(xs, w)))
    g = np.asarray(tg.grad(lambda x: tg.math.sum(vm(x, w) ** 2))(xs))
    for k in range(B):
        want = np.asarray(tg.grad(lambda x: tg.math.sum(fw(x, w) ** 2))(xs[k]))
        np.testing.assert_allclose(g[k], want, rtol=1e-12, atol=1e-12)


def test_run_inside_a_trace_on_concrete_arguments_then_outside():
    """A trace that calls the vmap on arrays it closes over runs the batched program with
    its transposes; the same vmap called outside returns the view: neither run reuses the
    other's rewritten program."""
    xs = _xs()
    want = _loop(xs)
    vm = tg.vmap(fw, in_axes=(0, None))

    def outer(y):
        return vm(xs, W) + y

    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(tg.jit(outer)(np.float32(0.0))), want)
        np.testing.assert_array_equal(np.asarray(vm(xs, W)), want)
