"""The sliding-window loop of a stencil sum (lower/llvm/stencil_window.py): its plan, that a
kernel takes it only where the result is the row walk's sum reassociated, and that what it
computes matches the reference interpreter (float64-checked; NaN and inf where the
reference has them) whatever the row range a call starts and ends at."""
from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_llvm_propagate import strict  # (beside this file: every propagate must compile)

import tiga as tg
from tiga.core.eval import eval_program
from tiga.lower.llvm import codegen_propagate
from tiga.lower.llvm.kernel import KernelSchedule
from tiga.lower.llvm.stencil_window import window_plan
from tiga.trace.message_passing import PropagateCall
from tiga.xla_free_runtime.backends.cpu.native import jit as native_jit

m = tg.math
BOX = tuple(o for o in itertools.product((-1, 0, 1), repeat=3) if o != (0, 0, 0))
PROPS = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _kernel(graph, fn, reducer, x, **params):
    """The kernel text, signature and staged program of one stencil propagate."""
    program, args = PropagateCall(graph, fn, reducer, {"x": x}, {"x": x}, {}, None,
                                  params).staged_program()
    eqn = program.eqns[0]
    p = graph.params
    desc = ("stencil", tuple(p["shape"]), tuple(tuple(int(o) for o in off)
                                               for off in p["offsets"]), bool(p["periodic"]))
    text, sig = codegen_propagate(eqn.params, [a.type for a in eqn.inputs], "int64",
                                  KernelSchedule(relation=desc),
                                  symbol=f"window_probe_{next(_SYMBOLS)}")
    return text, sig, program, args


_SYMBOLS = itertools.count()    # (loaded kernels are cached by symbol)


def _run_ranges(text, sig, fields: list, out_shape, out_dtype, bounds: list) -> np.ndarray:
    """Run the kernel over the row ranges [bounds[i], bounds[i+1]) one call each."""
    fn = native_jit.load_object(native_jit.compile_ir(text), sig.symbol)
    out = np.full(out_shape, -7, out_dtype)
    arrays = {f"field:{i}": np.ascontiguousarray(f) for i, f in enumerate(fields)}
    arrays["out:0"] = out
    argv = (ctypes.c_void_p * len(sig.slots))(*[arrays[s].ctypes.data for s in sig.slots])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        fn(lo, hi, argv)
    return out


# ---- the plan ---------------------------------------------------------------------------------


def test_box_plan_reads_nine_rows_a_point():
    plan = window_plan((96, 96, 96), BOX)
    assert (plan.dmin, plan.dmax, plan.edges, plan.evals) == (-1, 1, 26, 9)
    ring, full = plan.sets
    assert len(ring[0]) == 8 and ring[1] is None and len(ring[2]) == 8
    assert len(full[0]) == 9 and full[1] == ring[0] and full[2] == (0,)
    assert plan.by_dx == (full[0], ring[0], full[0])
    assert plan.needed(0) == [ring[0], full[0]]    # (the full sum starts from the ring's)


def test_plans_of_other_patterns():
    star = ((0, 1), (0, -1), (1, 0), (-1, 0))           # 2-D 4-point star, 3 evals a point
    plan = window_plan((5, 7), star)
    assert plan.evals == 3 and plan.by_dx == ((0,), (-7, 7), (0,))
    line = window_plan((10,), ((-2,), (1,), (1,)))      # 1-D, a gap and a duplicate
    assert line.by_dx == ((0,), None, None, (0, 0)) and line.evals == 2
    assert window_plan((4,), ()) is None


# ---- which kernels take it --------------------------------------------------------------------


@pytest.mark.parametrize("fn,reducer,taken", [
    (lambda s, d, e: s.x, tg.sum(), True),
    (lambda s, d, e: m.tanh(s.x) * 2.0, tg.mean(), True),
    (lambda s, d, e: s.x + d.x, tg.sum(), False),       # reads the destination row
    (lambda s, d, e: s.x, tg.max(), False),              # not a sum
    (lambda s, d, e: s.x, tg.prod(), False),
])
def test_window_is_taken_only_for_source_only_sums(fn, reducer, taken):
    g = tg.Graph.stencil((6, 5, 7), BOX)
    text, *_ = _kernel(g, fn, reducer, np.ones((g.num_src, 3), np.float32))
    assert ("window.body" in text) == taken


def test_a_pattern_with_nothing_to_share_keeps_the_row_walk():
    g = tg.Graph.stencil((6, 7), ((0, 1), (1, 0)))        # one offset per dx: 2 evals either way
    text, *_ = _kernel(g, lambda s, d, e: s.x, tg.sum(), np.ones((g.num_src, 2)))
    assert "window.body" not in text


# ---- what it computes -------------------------------------------------------------------------


@st.composite
def stencils(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(rank))
    if draw(st.booleans()):
        cube = itertools.product(*[range(-1, 2)] * rank)
        offsets = [o for o in cube if any(o) or draw(st.booleans())]
    else:
        offsets = draw(st.lists(st.tuples(*[st.integers(-2, 2)] * rank), min_size=1,
                                max_size=10))
    return tg.Graph.stencil(shape, offsets, periodic=draw(st.booleans()))


def _inputs(rng, n, width, dtype, nonfinite: bool):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, (n, width)).astype(dtype)
    x = rng.standard_normal((n, width)).astype(dtype)
    if nonfinite and x.size:
        for v in (np.nan, np.inf, -np.inf):
            x.reshape(-1)[rng.integers(0, x.size, 2)] = v
    return x


FAMILIES = {
    "copy": lambda s, d, e: s.x,
    "affine": lambda s, d, e: s.x * 2.0 + 1.0,
    "tanh": lambda s, d, e: m.tanh(s.x) * 0.5,
}


@PROPS
@given(g=stencils(), family=st.sampled_from(sorted(FAMILIES)),
       red=st.sampled_from(["sum", "mean"]),
       dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64]),
       width=st.sampled_from([1, 3, 16]), nonfinite=st.booleans(), seed=st.integers(0, 999))
def test_window_matches_the_reference(g, family, red, dtype, width, nonfinite, seed):
    if np.dtype(dtype).kind == "i":     # (integer messages: exact sums of the rows)
        family, red = "copy", "sum"
    rng = np.random.default_rng(seed)
    x = _inputs(rng, g.num_src, width, dtype, nonfinite)
    fn, reducer = FAMILIES[family], getattr(tg, red)()
    with strict():
        got = np.asarray(tg.propagate(g, fn, reducer, src={"x": x}))
    program, args = PropagateCall(g, fn, reducer, {"x": x}, {}, {}, None,
                                  {}).staged_program()
    ref = eval_program(program, *args)[0]
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if np.dtype(dtype).kind == "i" and red == "sum":
        np.testing.assert_array_equal(got, ref)
        return
    # float64 oracle: the reference's sums of the messages in float64
    msgs = eval_program(*_flat(PropagateCall(g, fn, reducer, {"x": x.astype(np.float64)},
                                             {}, {}, None, {}).staged_program()))[0]
    assert np.isnan(got).tolist() == np.isnan(ref).tolist()
    finite = np.isfinite(ref)
    assert np.array_equal(got[~finite], ref[~finite], equal_nan=True)
    tol = 2e-4 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(got[finite], ref[finite], rtol=tol, atol=tol)
    if family == "copy" or dtype == np.float64:
        ok = np.isfinite(msgs)
        np.testing.assert_allclose(got[ok & finite].astype(np.float64), msgs[ok & finite],
                                   rtol=tol, atol=tol)


def _flat(staged):
    program, args = staged
    return (program, *args)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from([(5, 6, 7), (4, 9), (13,), (3, 3, 3), (4, 9, 5), (3, 2, 7, 4)]),
       cuts=st.lists(st.integers(0, 300), max_size=6), seed=st.integers(0, 99))
def test_a_row_range_anywhere_gives_the_same_bits(shape, cuts, seed):
    """Chunks of any rows (mid-line starts and ends included) compute every point as the
    whole range does, bit for bit: the result does not depend on the thread count."""
    rank = len(shape)
    offsets = [o for o in itertools.product(*[range(-1, 2)] * rank) if any(o)]
    g = tg.Graph.stencil(shape, offsets)
    x = np.random.default_rng(seed).standard_normal((g.num_src, 5)).astype(np.float32)
    text, sig, _, _ = _kernel(g, lambda s, d, e: s.x * 3.0, tg.sum(), x)
    assert "window.body" in text
    n = g.num_dst
    whole = _run_ranges(text, sig, [x, x], (n, 5), np.float32, [0, n])
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    pieces = _run_ranges(text, sig, [x, x], (n, 5), np.float32, bounds)
    assert whole.tobytes() == pieces.tobytes()
    rp, col = g.resolve_csr()
    want = np.add.reduceat(3.0 * x.astype(np.float64)[col], rp[:-1], axis=0)
    want[np.diff(rp) == 0] = 0
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5)


def test_a_lattice_of_nan_and_inf_matches_the_reference_exactly():
    g = tg.Graph.stencil((6, 6, 6), BOX)
    x = np.zeros((g.num_src, 16), np.float32)
    x[50, 0], x[51, 1], x[52, 1], x[90, 2], x[130, 3] = np.nan, np.inf, -np.inf, np.inf, -0.0
    x[:, 4] = -0.0
    x[10:200, 5] = 3e38            # overflows float32 however the sum is ordered
    with strict():
        got = np.asarray(tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": x}))
    program, args = PropagateCall(g, lambda s, d, e: s.x, tg.sum(), {"x": x}, {}, {}, None,
                                  {}).staged_program()
    ref = eval_program(program, *args)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    np.testing.assert_array_equal(np.signbit(got[:, 4]), np.signbit(ref[:, 4]))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-6, atol=1e-6)
