"""A page's distinct-row remap (issue 28 item 1): paging.run.distinct() through the native
kernel (paging.gather, lower/llvm/page_distinct) equals np.unique's (sorted distinct ids,
inverse) for every shape of page the paged runs meet, for int32 and int64 ids, in place into
the page's own id buffer as the paged run calls it, and equals numpy's way where the kernel
is not used."""
from __future__ import annotations

import numpy as np
import pytest

from tiga.xla_free_runtime.paging import gather
from tiga.xla_free_runtime.paging.distinct import distinct


def pages(dtype) -> dict:
    rng = np.random.default_rng(0)
    n = 50_000
    rows = np.arange(4096, dtype=np.int64)
    offsets = np.array([o for o in range(-8, 9) if o])
    return {k: np.ascontiguousarray(v, dtype=dtype) for k, v in {
        "window": (rows[:, None] + 9000 + offsets).reshape(-1),
        "wraps around": ((rows[:, None] + offsets) % n).reshape(-1),
        "random, narrow span": rng.integers(100, 20_000, 30_000),
        "few far windows": np.concatenate([rng.integers(0, 300, 5000),
                                           rng.integers(40_000_000, 40_000_300, 5000)]),
        "thin over a wide span": rng.integers(0, 1 << 30, 3000),
        "one id": np.array([77]),
        "all equal": np.full(1000, 5),
    }.items()}


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_native_distinct_equals_np_unique(dtype):
    assert gather.kernel(np.dtype(dtype).itemsize * 8) is not None   # built here (llvmlite)
    for name, ci in pages(dtype).items():
        want_u, want_inv = np.unique(ci, return_inverse=True)
        u, inv = distinct(ci, dtype)
        assert inv.dtype == dtype, name
        np.testing.assert_array_equal(u, want_u, err_msg=name)
        np.testing.assert_array_equal(inv, want_inv.reshape(-1), err_msg=name)
        buf = ci.copy()        # as a paged run calls it: positions into the page's buffer
        u2, inv2 = distinct(buf, dtype, out=buf)
        np.testing.assert_array_equal(u2, want_u, err_msg=name)
        np.testing.assert_array_equal(inv2, want_inv.reshape(-1), err_msg=name)


def test_native_kernel_writes_in_place_and_reuses_its_scratch():
    ci = pages(np.int32)["wraps around"]
    buf = ci.copy()
    lo, hi = int(ci.min()), int(ci.max()) + 1
    u, inv = gather.marked(buf, lo, hi - lo, np.int32, out=buf)
    assert np.shares_memory(inv, buf)
    np.testing.assert_array_equal(u[inv], ci)
    first = gather._scratch(hi - lo, np.dtype(np.int32))
    again = gather._scratch(hi - lo - 1, np.dtype(np.int32))
    assert np.shares_memory(first, again)           # one mark array per thread, kept


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_numpy_way_where_the_kernel_is_not_used(monkeypatch, dtype):
    for name, ci in pages(dtype).items():
        native = distinct(ci, dtype)
        with monkeypatch.context() as m:
            m.setattr(gather, "kernel", lambda bits: None)
            assert gather.marked(ci, int(ci.min()), 1, dtype) is None
            plain = distinct(ci, dtype)
        for a, b in zip(native, plain):
            np.testing.assert_array_equal(a, b, err_msg=name)
    # ids of another width than the index dtype: numpy's way, same answer
    ci = pages(np.int64)["random, narrow span"]
    u, inv = distinct(ci, np.int32)
    assert inv.dtype == np.int32
    np.testing.assert_array_equal(u[inv], ci)
