"""Range reads of a disk tensor reuse a reading thread's spare chunk buffers (issue 28 item 1):
windows that share chunks with the previous read, read in any order, into a reused page
buffer or fresh, return exactly the stored rows, and a sweep of windows settles on the
spares instead of a fresh chunk array per partial chunk."""
from __future__ import annotations

import numpy as np
import pytest

from tiga.xla_free_runtime.memory.tiers import disk_direct

pytest.importorskip("zarr", minversion="3.1")


def test_window_reads_in_any_order_return_the_stored_rows(stored):
    d, x = stored
    rng = np.random.default_rng(1)
    out = np.empty((700, 32), np.float32)
    starts = list(range(0, 4300, 300)) + list(range(4200, 0, -300)) + \
        list(rng.integers(0, 4300, 40))
    for i, a in enumerate(starts):
        b = int(a) + int(rng.integers(1, 700))
        got = d.read_rows(int(a), b, out if i % 3 else None)
        np.testing.assert_array_equal(got, x[a:b], err_msg=f"rows [{a}:{b})")
        # a gather right after, through the chunks the range read kept
        rows = np.unique(rng.integers(max(0, a - 200), min(len(x), b + 200), 50))
        np.testing.assert_array_equal(d.take_rows(rows), x[rows])
    assert 0 < len(d._kept.spare) <= disk_direct.SPARE_CHUNKS


def test_a_window_sweep_settles_on_the_spares(stored, monkeypatch):
    d, x = stored
    out = np.empty((300, 32), np.float32)
    fresh = []
    real = disk_direct.aligned_empty

    def counting_empty(shape, dtype, *args, **kw):     # (chunk buffers are made here)
        if np.dtype(dtype) == np.uint8 and tuple(shape) == (d.chunk_rows * 32 * 4,):
            fresh.append(shape)
        return real(shape, dtype, *args, **kw)

    starts = range(8, 4600, 256)            # windows of 272 rows, 16 shared with the next
    for a in starts[:4]:                    # the first reads make the spares
        d.read_rows(a - 8, a + 264, out)
    monkeypatch.setattr(disk_direct, "aligned_empty", counting_empty)
    for a in starts[4:]:
        np.testing.assert_array_equal(d.read_rows(a - 8, a + 264, out), x[a - 8:a + 264])
    assert not fresh, f"{len(fresh)} fresh chunk buffers in a sweep that had spares"
