"""`tiga info` / `tiga --version` run, exit 0, report every backend and never import torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs tiga.cli.main(argv) in a fresh interpreter where importing torch fails.
CLI = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked in this test (import of {{name!r}})")
            return None

    sys.meta_path.insert(0, BlockTorch())
    from tiga.cli import main

    code = main({argv!r})
    assert "torch" not in sys.modules, "tiga info imported torch"
    sys.exit(code)
    """
)


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_info_reports_backends_without_importing_torch():
    proc = run_python(CLI.format(argv=["info"]))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("tiga ", "python ", "numpy", "llvmlite", "zarr", "ml_dtypes", "torch",
                   "triton", "mpi4py", "reference", "cpu-llvm", "triton-gpu",
                   "triton-interpreter", "threads: ", "cache dir: "):
        assert needle in out, f"{needle!r} missing from:\n{out}"


def test_version_flag():
    proc = run_python(CLI.format(argv=["--version"]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tiga ")


def test_info_honours_environment(monkeypatch, capsys):
    monkeypatch.setenv("TIGA_NUM_THREADS", "3")
    monkeypatch.setenv("TIGA_CACHE_DIR", "/tmp/tiga-cache-test")
    from tiga.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "threads: 3 (TIGA_NUM_THREADS)" in out
    assert "cache dir: /tmp/tiga-cache-test (TIGA_CACHE_DIR)" in out
