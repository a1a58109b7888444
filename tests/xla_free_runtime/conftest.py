"""Fixtures shared by the runtime tests."""
from __future__ import annotations

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.memory.tiers import disk as disk_mod


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """(a disk tensor's storage, its numpy rows): 5000 rows of 32 float32 in chunks of 128
    rows (16 KiB), written under tmp_path."""
    pytest.importorskip("zarr", minversion="3.1")
    monkeypatch.setattr(disk_mod, "CHUNK_BYTES", 16 << 10)
    x = np.random.default_rng(0).random((5000, 32)).astype(np.float32)
    with tg.scope(spill_dir=tmp_path):
        d = tg.asarray(x).to("disk")._storage
        assert d._direct and d.chunk_rows == 128
        yield d, x
