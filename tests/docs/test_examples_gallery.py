"""The examples gallery (docs/guide/examples.md) links every script in examples/, and every
script it links runs as written (`python examples/<name>.py`, from the repository root,
as `make demo` runs it) and prints its one summary line. A script that imports an optional
package missing here is skipped, saying which."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "docs" / "guide" / "examples.md"
OPTIONAL = ("torch", "torch_geometric", "scipy", "networkx", "triton", "mpi4py")
LIMIT_S = 300


def _linked() -> list:
    return sorted(set(re.findall(r"\]\(\.\./\.\./examples/([\w]+\.py)\)", GALLERY.read_text())))


def _top_level_imports(path: Path) -> set:
    """Modules imported at module level (an import inside a function is optional there)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_gallery_links_every_example():
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert _linked() == scripts, "docs/guide/examples.md must link every examples/*.py"


@pytest.mark.parametrize("name", _linked())
def test_linked_example_runs_as_written(name):
    path = ROOT / "examples" / name
    missing = sorted(m for m in _top_level_imports(path) & set(OPTIONAL)
                     if importlib.util.find_spec(m) is None)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    env = {k: v for k, v in os.environ.items() if k != "TIGA_DEMO_VERBOSE"}
    env.update(TIGA_PROGRESS="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(path.relative_to(ROOT))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=LIMIT_S)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), f"{name} printed nothing"
