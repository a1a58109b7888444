"""core: the transpose impl rule copies runs of axes that stay in place as opaque items
(vmap's batch-first input transpose); its result is np.transpose's, byte for byte."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tiga.core.dtypes import bfloat16
from tiga.core.prims.shape import transpose_impl_rule

SHAPES = [(2, 3, 4), (3, 1, 5, 2), (4, 5), (2, 3, 4, 5), (0, 3, 2), (1, 1, 1), (6,), ()]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.bool_,
                                   bfloat16.np])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_transpose_impl_is_numpys(shape, dtype):
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    for perm in itertools.permutations(range(len(shape))):
        for a in (x, x.T):     # C-contiguous and not
            got = transpose_impl_rule(a, permutation=perm)[0]
            want = np.transpose(a, perm)
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tobytes() == want.tobytes()
            assert got.flags.c_contiguous and got.flags.writeable
            assert got.size == 0 or not np.shares_memory(got, a)


def test_transpose_impl_keeps_nan_payloads_and_signed_zeros():
    bits = np.array([0x7FC00001, 0x80000000, 0x3F800000, 0xFF800000], np.uint32)
    x = np.tile(bits.view(np.float32), 6).reshape(2, 3, 4)
    got = transpose_impl_rule(x, permutation=(1, 0, 2))[0]
    assert got.view(np.uint32).tobytes() == np.transpose(x, (1, 0, 2)).copy().tobytes()


def test_the_batch_first_vmap_transpose():
    x = np.random.default_rng(0).standard_normal((16, 1024, 8)).astype(np.float32)
    got = transpose_impl_rule(x, permutation=(1, 0, 2))[0]
    np.testing.assert_array_equal(got, np.ascontiguousarray(x.transpose(1, 0, 2)))
