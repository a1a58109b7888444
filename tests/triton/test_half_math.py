"""float16 edge functions on the Triton route: Triton's math functions take float32/float64
only (tl.exp on a float16 tile raised in the interpreter and fails to compile), so the
renderer computes them in float32 and rounds once, as numpy does for float16 in the
reference. The backward of float16 attention runs exp over float16 scores (found by
benchmarks/gpu_check.py's dry run)."""
import numpy as np
import pytest

import tiga as tg

FUNCS = ["exp", "log", "sqrt", "tanh", "sin", "cos", "sigmoid", "pow"]


@pytest.mark.parametrize("fn", FUNCS)
def test_float16_math_matches_reference(interpreter, fn):
    rng = np.random.default_rng(FUNCS.index(fn))
    row_ptr = np.array([0, 3, 3, 7, 12])
    g = tg.Graph.from_csr(row_ptr, rng.integers(0, 5, 12), num_src=5)

    class Layer(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            if fn == "pow":
                return src.x ** 1.5
            return getattr(tg.math, fn)(src.x)

    x = (rng.random((5, 3)) + 0.5).astype(np.float16)
    kw = dict(graph=g, src={"x": x}, dst={}, edge={})
    got, want = np.asarray(Layer()(**kw)), np.asarray(Layer().reference(**kw))
    assert got.dtype == want.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3)
