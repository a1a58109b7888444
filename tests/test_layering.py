"""Layering check: every tiga module imports only the layers DESIGN.md's arrows allow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / "tiga"

LAYERS = ("core", "trace", "autodiff", "opt", "lower", "xla_free_runtime", "torch_bridge")
FACADE = "facade"  # tiga/__init__.py, tiga/api.py, tiga/cli.py and other top-level modules
EVERYTHING = frozenset(LAYERS) | {FACADE}

# Which tiga layers each layer may import (DESIGN.md, "Data flows one way").
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "trace": frozenset({"core", "trace"}),
    "autodiff": frozenset({"core", "trace", "autodiff"}),
    "opt": frozenset({"core", "trace", "autodiff", "opt"}),
    "lower": frozenset({"core", "trace", "autodiff", "opt", "lower"}),
    "xla_free_runtime": frozenset({"core", "trace", "autodiff", "opt", "lower",
                                   "xla_free_runtime"}),
    "torch_bridge": EVERYTHING,
    FACADE: EVERYTHING,
}
TORCH_IMPORTERS = frozenset({"torch_bridge"})
DYNAMIC_IMPORTERS = {"import_module", "__import__"}


def module_name(relpath: str) -> str:
    """'tiga/core/prims/shape.py' -> 'tiga.core.prims.shape'; '__init__' names the package."""
    parts = list(Path(relpath).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """Layer of a dotted tiga module name ('tiga' itself and top-level modules: facade)."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    if len(parts) >= 2 and (PACKAGE_DIR / parts[1]).is_dir():
        return "unknown:" + parts[1]
    return FACADE


def _package_of(relpath: str) -> str:
    module = module_name(relpath)
    if Path(relpath).name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _resolve_from(node: ast.ImportFrom, relpath: str) -> str | None:
    """Absolute module of a `from X import ...`; None if the relative import escapes tiga."""
    if node.level == 0:
        return node.module or ""
    base = _package_of(relpath).split(".")
    if node.level - 1 >= len(base):
        return None
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(source: str, relpath: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, nested ones included.

    `from pkg import name` yields `pkg.name`: `from tiga import core` imports the core
    layer, `from tiga import jit` the facade (tiga/__init__).
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=relpath)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve_from(node, relpath)
            if target is None:
                found.append((node.lineno, "<relative import beyond the tiga package>"))
                continue
            found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Call) and _dynamic_target(node):
            found.append((node.lineno, _dynamic_target(node)))
    return found


def _dynamic_target(node: ast.Call) -> str | None:
    """Module named by `importlib.import_module("x")` / `__import__("x")` with a literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in DYNAMIC_IMPORTERS or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def check_source(source: str, relpath: str) -> list[str]:
    """Layering violations of one file, as readable messages (empty when clean)."""
    layer = layer_of(module_name(relpath))
    if layer.startswith("unknown:"):
        return [f"{relpath}: subpackage tiga/{layer[8:]} is not a layer of DESIGN.md; "
                "add it to DESIGN.md and to tests/test_layering.py"]
    try:
        imports = imported_modules(source, relpath)
    except SyntaxError as exc:
        return [f"{relpath}:{exc.lineno}: does not parse: {exc.msg}"]
    problems = []
    for line, module in imports:
        if module.startswith("<"):
            problems.append(f"{relpath}:{line}: {module}")
        elif _is_torch(module) and layer not in TORCH_IMPORTERS:
            problems.append(f"{relpath}:{line}: imports {module}; only tiga/torch_bridge "
                            "may import torch")
        elif module == "tiga" or module.startswith("tiga."):
            target = layer_of(module)
            if target not in ALLOWED[layer] and not target.startswith("unknown:"):
                problems.append(f"{relpath}:{line}: layer '{layer}' imports {module} "
                                f"(layer '{target}'); allowed: {sorted(ALLOWED[layer])}")
    return sorted(set(problems))


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_package_respects_layering():
    files = package_files()
    assert files, f"no Python files found under {PACKAGE_DIR}"
    problems = []
    for path in files:
        relpath = path.relative_to(REPO).as_posix()
        problems.extend(check_source(path.read_text(encoding="utf-8"), relpath))
    assert not problems, "layering violations:\n" + "\n".join(problems)


# --- the checker itself must catch violations (so the test above can fail) ---

BAD = [
    ("tiga/core/types.py", "from tiga.trace import tracer\n", "layer 'core' imports"),
    ("tiga/core/types.py", "import tiga\n", "layer 'core' imports tiga "),
    ("tiga/core/types.py", "from tiga import jit\n", "tiga.jit (layer 'facade')"),
    ("tiga/core/prims/shape.py", "from ...trace import tracer\n", "layer 'core' imports"),
    ("tiga/trace/tracer.py", "from ..lower import pipeline\n", "imports tiga.lower"),
    ("tiga/trace/tracer.py", "from .. import autodiff\n", "imports tiga.autodiff"),
    ("tiga/autodiff/vjp.py", "import tiga.xla_free_runtime.cache\n", "layer 'autodiff'"),
    ("tiga/autodiff/vjp.py", "from ..opt import optimize_program\n", "layer 'autodiff'"),
    ("tiga/trace/call_cache.py", "from ..opt import hoist_linear\n", "layer 'trace'"),
    ("tiga/core/passes.py", "from tiga.opt import dce\n", "layer 'core'"),
    ("tiga/opt/cse.py", "from ..lower import pipeline\n", "layer 'opt' imports"),
    ("tiga/opt/dce.py", "from tiga.xla_free_runtime import executor\n", "layer 'opt'"),
    ("tiga/lower/__init__.py", "from ..torch_bridge import dlpack\n", "layer 'lower'"),
    ("tiga/lower/pipeline.py", "from tiga.api import jit\n", "layer 'facade'"),
    ("tiga/xla_free_runtime/x.py", "from tiga.torch_bridge import dlpack\n", "torch_bridge"),
    ("tiga/lower/llvm/rules/x.py", "def f():\n    import torch.nn as nn\n", "imports torch.nn"),
    ("tiga/core/eval.py", "from torch import Tensor\n", "imports torch.Tensor"),
    ("tiga/api.py", "if True:\n    import torch\n", "only tiga/torch_bridge"),
    ("tiga/__init__.py", "import importlib\nimportlib.import_module('torch')\n", "torch"),
    ("tiga/cli.py", "__import__('torch.autograd')\n", "imports torch.autograd"),
    ("tiga/core/x.py", "from .... import y\n", "beyond the tiga package"),
    ("tiga/core/x.py", "def broken(:\n", "does not parse"),
]

GOOD = [
    ("tiga/core/types.py", "from . import dtypes\nfrom .prims import shape\n"),
    ("tiga/core/prims/shape.py", "from ..types import TensorType\nfrom tiga.core import x\n"),
    ("tiga/trace/tracer.py", "from ..core import types\nfrom tiga.trace.pytree import f\n"),
    ("tiga/autodiff/rules/graph.py", "from ...trace import tracer\nfrom ... import core\n"),
    ("tiga/lower/llvm/rules/x.py", "from ....autodiff import vjp\nimport llvmlite.ir\n"),
    ("tiga/xla_free_runtime/cache.py", "from ..lower import pipeline\nimport numpy\n"),
    ("tiga/opt/hoist_linear.py", "from ..trace import math\nfrom ..autodiff import vjp\n"),
    ("tiga/lower/pipeline.py", "from ..opt import optimize_program\n"),
    ("tiga/xla_free_runtime/executor.py", "from tiga.opt import relation_kind\n"),
    ("tiga/torch_bridge/autograd.py", "import torch\nfrom tiga.api import jit\n"),
    ("tiga/api.py", "from .xla_free_runtime import executor\nfrom . import torch_bridge\n"),
    ("tiga/__init__.py", "from .api import jit\nfrom tiga.core.errors import TigaError\n"),
    ("tiga/cli.py", "from importlib import metadata\nmetadata.version('torch')\n"),
    ("tiga/core/x.py", "import torchvision_like_name\nimport torchaudio_not\n"),
]


@pytest.mark.parametrize("relpath,source,needle", BAD)
def test_checker_flags_violation(relpath, source, needle):
    problems = check_source(source, relpath)
    assert problems, f"checker missed a violation in {relpath}: {source!r}"
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize("relpath,source", GOOD)
def test_checker_accepts_allowed_imports(relpath, source):
    assert check_source(source, relpath) == []


def test_relative_imports_resolve_against_the_package():
    assert module_name("tiga/core/__init__.py") == "tiga.core"
    mods = [m for _, m in imported_modules("from ..core import x\n", "tiga/trace/t.py")]
    assert mods == ["tiga.core.x"]
    mods = [m for _, m in imported_modules("from . import y\n", "tiga/core/__init__.py")]
    assert mods == ["tiga.core.y"]
    mods = [m for _, m in imported_modules("from .. import lower\n", "tiga/trace/a/b.py")]
    assert mods == ["tiga.trace.lower"]


def runtime_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Import cycles among runtime modules (`sources`: relpath -> text), function-level
    imports included: a cycle hidden behind a lazy import is still a cycle (issue 25)."""
    graph: dict[str, set] = {}
    for relpath, text in sources.items():
        here = module_name(relpath)
        graph[here] = {m for _, m in imported_modules(text, relpath)
                       if m.startswith("tiga.xla_free_runtime")}
    known = set(graph)
    for here in graph:   # `from pkg import mod` names the module, not the package
        graph[here] = {m if m in known else m.rpartition(".")[0] for m in graph[here]}
    cycles, done = [], set()

    def visit(node, path):
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return cycles


def test_runtime_has_no_import_cycles():
    sources = {p.relative_to(REPO).as_posix(): p.read_text() for p in package_files()
               if "xla_free_runtime" in p.parts}
    assert not runtime_cycles(sources)


def test_cycle_check_sees_a_lazy_import():
    sources = {"tiga/xla_free_runtime/a.py": "from . import b\n",
               "tiga/xla_free_runtime/b.py": "def f():\n    from .a import g\n"}
    assert runtime_cycles(sources)
