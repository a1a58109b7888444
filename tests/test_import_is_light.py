"""`import tiga` in a fresh process imports none of the heavy optional dependencies: each is
imported where it is used (ml_dtypes on the first bfloat16 numpy dtype, torch / triton /
zarr / mpi4py / scipy / numba by the paths that need them), and tg.bfloat16 still works."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("ml_dtypes", "torch", "triton", "zarr", "mpi4py", "scipy", "numba")

SCRIPT = f"""
import json, sys
import tiga as tg
loaded = [m for m in {HEAVY!r} if m in sys.modules]
name = repr(tg.bfloat16)
after = "ml_dtypes" in sys.modules        # naming the dtype needs no storage type
storage = str(tg.bfloat16.np)            # its numpy storage does
print(json.dumps({{"loaded": loaded, "name": name, "after": after, "storage": storage,
                  "ml_dtypes": "ml_dtypes" in sys.modules}}))
"""


def test_import_tiga_loads_no_heavy_dependency():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    assert got["name"] == "tg.bfloat16" and got["after"] is False
    assert got["storage"] == "bfloat16" and got["ml_dtypes"] is True


def test_bfloat16_arrays_map_to_tg_bfloat16():
    import ml_dtypes
    import numpy as np

    import tiga as tg
    from tiga.core.dtypes import as_dtype

    assert as_dtype(np.dtype(ml_dtypes.bfloat16)) is tg.bfloat16
    assert as_dtype(ml_dtypes.bfloat16) is tg.bfloat16
    assert tg.bfloat16.np == np.dtype(ml_dtypes.bfloat16)
    assert tg.asarray(np.ones(3, dtype=ml_dtypes.bfloat16)).dtype is tg.bfloat16


def test_import_tiga_leaves_llvm_unloaded():
    """llvmlite's LLVM (llvmlite.binding: its shared library and set-up, ~50 ms) is loaded
    by the first compile, never by `import tiga` (a warm process may never compile)."""
    code = "import sys, tiga; print('llvmlite.binding' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "False"
