"""The device tier (storage/device.py): the storage logic against a stand-in CUDA runtime
whose "device memory" is host memory (copies are memmoves), so row ranges, gathers, writes,
budgets, release and errors are checked on any machine; and, where CUDA exists, the real
runtime (marked gpu, skipped elsewhere)."""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

import tiga as tg
from tiga.xla_free_runtime.memory.tiers import device as device_storage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stand_in_cuda import StandInRuntime  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    rt = StandInRuntime()
    monkeypatch.setattr(device_storage, "runtime", lambda: rt)
    return rt


def test_round_trip_rows_and_gathers(fake):
    x = np.random.default_rng(0).standard_normal((50, 3)).astype(np.float32)
    d = tg.asarray(x).to("cuda")
    assert d.tier == "device" and d.device == "cuda" and d.to("device") is d
    np.testing.assert_array_equal(d.numpy(), x)
    np.testing.assert_array_equal(d.to("host").numpy(), x)
    st = d._storage
    np.testing.assert_array_equal(st.read_rows(10, 17), x[10:17])
    rows = np.array([0, 1, 2, 9, 30, 31, 49])
    np.testing.assert_array_equal(st.take_rows(rows), x[rows])
    kinds = [k for k, _ in fake.copies[-3:]]
    assert kinds == [2, 2, 2]               # three runs of rows: three copies back
    st.write_rows(5, np.ones((2, 3), np.float32))
    want = x.copy()
    want[5:7] = 1
    np.testing.assert_array_equal(st.read(), want)
    iface = d.__cuda_array_interface__
    assert iface["shape"] == (50, 3) and iface["typestr"] == "<f4" and iface["version"] == 3
    assert not hasattr(tg.asarray(x), "__cuda_array_interface__")


def test_device_to_disk_and_back(fake, tmp_path):
    x = np.arange(40, dtype=np.int64).reshape(20, 2)
    d = tg.asarray(x).to("cuda")
    with tg.scope(spill_dir=tmp_path):
        on_disk = d.to("disk")
        assert on_disk.tier == "disk"
        np.testing.assert_array_equal(on_disk.numpy(), x)
        np.testing.assert_array_equal(on_disk.to("cuda").numpy(), x)


def test_budget_release_and_errors(fake):
    x = np.ones((100, 4), np.float32)
    with tg.scope(budgets={"device": "1KB"}):
        with pytest.raises(tg.StorageError, match="device budget .* to\\('cuda'\\)"):
            tg.asarray(x).to("cuda")               # 1600 bytes
    with tg.scope(budgets={"device": "4KB"}):
        d = tg.asarray(x).to("cuda")
        assert tg.memory.report()["device"]["bytes"] == 1600
        assert len(fake.buffers) == 1
        del d
        gc.collect()
        assert tg.memory.report()["device"]["bytes"] == 0 and not fake.buffers
        fake.fail_alloc = True
        with pytest.raises(tg.StorageError, match="cudaMalloc of 1600 bytes failed "
                                                  "\\(cudaErrorMemoryAllocation\\)"):
            tg.asarray(x).to("cuda")
        assert tg.memory.report()["device"]["bytes"] == 0     # the charge given back
    fake.fail_alloc = False
    st = device_storage.DeviceStorage.from_host(np.zeros((3, 2)))
    with pytest.raises(tg.ShapeError, match="do not fit"):
        st.write_rows(2, np.zeros((2, 2)))
    st.release()
    with pytest.raises(tg.StorageError, match="released"):
        st.read()


def test_without_cuda_python_or_a_device(monkeypatch):
    def missing():
        raise tg.UnsupportedError("the device tier needs cuda-python (cuda.bindings)")
    monkeypatch.setattr(device_storage, "runtime", missing)
    assert not device_storage.available()
    with pytest.raises(tg.UnsupportedError, match="CUDA device and cuda-python"):
        tg.asarray(np.ones(3)).to("cuda")


def test_device_round_trip_and_its_array_interface(monkeypatch):
    """A round trip through the device tier on the CUDA runtime where a device exists, else on
    the stand-in (never a skip): rows come back as written and the array interface names the
    allocation; torch adopts it in place on a real device."""
    real = device_storage.available()
    if not real:
        rt = StandInRuntime()
        monkeypatch.setattr(device_storage, "runtime", lambda: rt)
    x = np.random.default_rng(1).standard_normal((1000, 8)).astype(np.float32)
    d = tg.asarray(x).to("cuda")
    np.testing.assert_array_equal(d.numpy(), x)
    np.testing.assert_array_equal(d._storage.read_rows(100, 300), x[100:300])
    face = d.__cuda_array_interface__
    assert face["shape"] == (1000, 8) and face["typestr"] == "<f4" and face["data"][0] != 0
    if real:
        torch = pytest.importorskip("torch")
        t = torch.as_tensor(d, device="cuda")           # in place, through the interface
        assert t.data_ptr() == face["data"][0]
        np.testing.assert_array_equal(t.cpu().numpy(), x)
