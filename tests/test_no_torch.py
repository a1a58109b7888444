"""`import tiga` and a WeightedSum forward/grad work with torch made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Installed first, so any attempt to import torch (or torch.*) fails loudly.
TORCH_BLOCKER = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test (import of {name!r})")
            return None

    sys.meta_path.insert(0, BlockTorch())
    assert "torch" not in sys.modules
    """
)

SCRIPT = TORCH_BLOCKER + textwrap.dedent(
    """
    import numpy as np
    import tiga as tg

    g = tg.Graph.from_csr([0, 2, 3, 3], [0, 1, 1], num_src=2)

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w

    x = np.array([2.0, 3.0])
    w = np.array([4.0, 5.0, 2.0])
    y = WeightedSum()(graph=g, src={"x": x}, dst={}, edge={"w": w})
    np.testing.assert_allclose(np.asarray(y), [23.0, 6.0, 0.0])

    def loss(x, w):
        return WeightedSum()(graph=g, src={"x": x}, dst={}, edge={"w": w}).sum()

    dx, dw = tg.grad(loss, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(dx), [4.0, 7.0])
    np.testing.assert_allclose(np.asarray(dw), [2.0, 3.0, 3.0])

    assert "torch" not in sys.modules, "tiga imported torch"
    print("ok")
    """
)


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter that imports this checkout's tiga."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_weighted_sum_and_grad_without_torch():
    proc = run_python(SCRIPT)
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    assert proc.stdout.strip().endswith("ok")
