"""torch.from_dlpack(tg.Tensor) for bfloat16 storage, which numpy cannot export itself."""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tiga as tg  # noqa: E402
from tiga.xla_free_runtime.memory import dlpack_export  # noqa: E402


def _bf16(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) \
        .astype(tg.bfloat16.np)


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4), (0, 3)])
def test_bfloat16_export_aliases_the_storage(shape):
    arr = _bf16(shape)
    t = torch.from_dlpack(tg.asarray(arr))
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == shape
    np.testing.assert_array_equal(t.float().numpy(), arr.astype(np.float32))
    if arr.size:
        assert t.data_ptr() == arr.ctypes.data
        t.view(-1)[0] = 7.0   # writes land in the tg.Tensor's storage: no copy was made
        assert float(arr.reshape(-1)[0]) == 7.0


def test_bfloat16_export_keeps_strides():
    base = _bf16((6, 8))
    view = base[1::2, ::3]
    t = torch.from_dlpack(tg.asarray(view))
    assert t.stride() == tuple(s // 2 for s in view.strides)
    assert t.data_ptr() == view.ctypes.data
    np.testing.assert_array_equal(t.float().numpy(), view.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, tg.bfloat16.np])
def test_negative_strides_are_copied_not_crashed_on(dtype):
    # torch aborts the interpreter on a DLPack tensor with negative strides
    view = _bf16((6, 8)).astype(dtype)[::-1, ::-2]
    t = torch.from_dlpack(tg.asarray(view))
    np.testing.assert_array_equal(t.float().numpy(), view.astype(np.float32))
    with pytest.raises(BufferError, match="negative strides"):
        tg.asarray(view).__dlpack__(copy=False)


def test_legacy_capsule_and_read_only_rule():
    arr = _bf16((4,))
    t = torch.utils.dlpack.from_dlpack(tg.asarray(arr).__dlpack__())  # no max_version
    np.testing.assert_array_equal(t.float().numpy(), arr.astype(np.float32))
    ro = arr.copy()
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        tg.asarray(ro).__dlpack__()
    copied = tg.asarray(ro).__dlpack__(copy=True)
    np.testing.assert_array_equal(torch.utils.dlpack.from_dlpack(copied).float().numpy(),
                                  ro.astype(np.float32))


def test_exports_are_released():
    gc.collect()
    before = len(dlpack_export._LIVE)
    arr = _bf16((16,))
    unused = tg.asarray(arr).__dlpack__(max_version=(1, 0))
    consumed = torch.from_dlpack(tg.asarray(arr))
    assert len(dlpack_export._LIVE) == before + 2
    del unused, consumed
    gc.collect()
    assert len(dlpack_export._LIVE) == before


def test_wrong_device_is_refused():
    with pytest.raises(BufferError, match="dl_device"):
        tg.asarray(_bf16((2,))).__dlpack__(dl_device=(2, 0))
