"""The runtime lowers from one place (issue 25, "Done when"; DESIGN.md "One compile path"): only
xla_free_runtime/executor.py imports lower/pipeline; the interpreter, planners and plans get
the executor's Lowering handed down, and none of them imports the executor (no cycle). Read
off the source with `ast`, so a lazy import inside a function counts too."""
from __future__ import annotations

import ast
from pathlib import Path

import tiga.xla_free_runtime as runtime

ROOT = Path(runtime.__file__).parent
PACKAGE = "tiga.xla_free_runtime"


def _module_parts(path: Path) -> list:
    return (PACKAGE + "." + ".".join(path.relative_to(ROOT).with_suffix("").parts)).split(".")


def _imports(path: Path, text: str | None = None) -> set:
    """Absolute module names `path` imports (relative imports resolved), anywhere in it."""
    parts = _module_parts(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.ImportFrom):
            base = parts[:-node.level] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _sources():
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_executor_imports_the_pipeline():
    asking = [str(p.relative_to(ROOT)) for p in _sources()
              if any(m == "tiga.lower.pipeline" or m.startswith("tiga.lower.pipeline.")
                     for m in _imports(p))]
    assert asking == ["executor.py"], asking


def test_nothing_below_the_executor_imports_it():
    importing = [str(p.relative_to(ROOT)) for p in _sources()
                 if any(m == f"{PACKAGE}.executor" or m.startswith(f"{PACKAGE}.executor.")
                        for m in _imports(p))]
    assert importing == [], importing


def test_the_scan_sees_a_lazy_relative_pipeline_import():
    """The scan resolves the relative, in-function form the runtime's modules used (a guard:
    the tests above would pass vacuously if it did not)."""
    probe = ROOT / "backends" / "cpu" / "propagate.py"
    text = "def f():\n    from ....lower.pipeline import lower_launch\n"
    assert "tiga.lower.pipeline" in _imports(probe, text)
