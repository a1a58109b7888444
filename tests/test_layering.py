"""Layering check: every tiga module imports only the layers DESIGN.md's arrows allow."""

from __future__ import annotations

import ast
import io
import tokenize
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


# --- no import cycles between files (issue 37 item 6) ---

# Cycles that run entirely through tiga/xla_free_runtime, each the set of its files, left to
# the runtime's rewrite (issue 37 item 6): remove an entry once its cycle is gone (the test
# fails on a listed cycle that no longer exists, and on every cycle not listed).
RUNTIME_CYCLES_PENDING: tuple[frozenset, ...] = ()

# Cycles in tiga/autodiff, left to the engineer editing it (none left: rules/rows.py holds
# the row types that rules/graph.py and rules/attention.py both read).
AUTODIFF_CYCLES_PENDING: tuple[frozenset, ...] = ()


def import_graph(sources: dict[str, str]) -> dict[str, set]:
    """File-level imports among `sources` (relpath -> text), function-level ones included
    (a cycle hidden behind a lazy import is still a cycle). `from pkg import name` is an edge
    to pkg/name.py (or pkg/name/__init__.py) when that file exists, else to pkg/__init__.py."""
    files = {module_name(relpath): relpath for relpath in sources}
    graph: dict[str, set] = {}
    for relpath, text in sources.items():
        graph[relpath] = set()
        for _, module in imported_modules(text, relpath):
            while module and module not in files:     # a name: the module that defines it
                module = module.rpartition(".")[0]
            if module and files[module] != relpath:
                graph[relpath].add(files[module])
    return graph


def strongly_connected(graph: dict[str, set]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of two or more
    files, each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _describe(cycle: list[str], graph: dict[str, set]) -> str:
    edges = [f"    {a} -> {b}" for a in cycle for b in sorted(graph[a]) if b in cycle]
    return "  cycle of " + ", ".join(cycle) + ":\n" + "\n".join(edges)


def test_package_has_no_import_cycles():
    sources = {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
               for p in package_files()}
    graph = import_graph(sources)
    cycles = strongly_connected(graph)
    pending = set(RUNTIME_CYCLES_PENDING) | set(AUTODIFF_CYCLES_PENDING)
    new = [c for c in cycles if frozenset(c) not in pending]
    assert not new, ("import cycles between files (move what both sides need into a module "
                     "both import):\n" + "\n".join(_describe(c, graph) for c in new))
    gone = pending - {frozenset(c) for c in cycles}
    assert not gone, f"listed cycles that no longer exist, remove them: {sorted(map(sorted, gone))}"


def test_pending_runtime_cycles_lie_in_the_runtime():
    for cycle in RUNTIME_CYCLES_PENDING:
        assert all(f.startswith("tiga/xla_free_runtime/") for f in cycle), sorted(cycle)


def test_cycle_check_sees_a_lazy_import():
    sources = {"tiga/xla_free_runtime/a.py": "from . import b\n",
               "tiga/xla_free_runtime/b.py": "def f():\n    from .a import g\n"}
    assert strongly_connected(import_graph(sources)) == [["tiga/xla_free_runtime/a.py",
                                                          "tiga/xla_free_runtime/b.py"]]


def test_cycle_check_resolves_names_and_packages():
    sources = {"tiga/p/__init__.py": "from .m import f\n",     # a package re-exporting ...
               "tiga/p/m.py": "from . import g\n",             # ... a name it defines: a cycle
               "tiga/p/n.py": "from . import m\n",             # the module m, not the package
               "tiga/q.py": "import tiga.p.n\nfrom tiga.p import m\n"}
    graph = import_graph(sources)
    assert graph["tiga/p/m.py"] == {"tiga/p/__init__.py"}
    assert graph["tiga/p/n.py"] == {"tiga/p/m.py"}
    assert graph["tiga/q.py"] == {"tiga/p/n.py", "tiga/p/m.py"}
    assert strongly_connected(graph) == [["tiga/p/__init__.py", "tiga/p/m.py"]]


def test_cycle_check_finds_a_longer_cycle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"]]


# --- no backslash line continuations (issue 37 item 6) ---

# Files that may still continue a line with a backslash: none (issue 37 item 6 removed the
# last from the runtime). The list may only shrink: a listed file without continuations
# fails the test until it is removed from here.
BACKSLASH_PENDING: tuple = ()


def backslash_continuations(source: str) -> list[int]:
    """Lines that end in a backslash continuation (tokenize: a backslash inside a string or
    a comment is not one): two tokens of one logical line on different lines with no NL
    token between them outside brackets or in."""
    lines = []
    previous = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.ENCODING, tokenize.INDENT, tokenize.DEDENT):
            continue
        if (previous is not None and tok.start[0] > previous.end[0]
                and previous.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
                and tok.type != tokenize.ENDMARKER):
            lines.append(previous.end[0])
        previous = tok
    return lines


def test_no_backslash_continuations():
    found = {}
    for path in package_files():
        relpath = path.relative_to(REPO).as_posix()
        lines = backslash_continuations(path.read_text(encoding="utf-8"))
        if lines:
            found[relpath] = lines
    new = {f: lines for f, lines in found.items() if f not in BACKSLASH_PENDING}
    assert not new, ("backslash line continuations (use parentheses): "
                     + ", ".join(f"{f}:{n}" for f, lines in new.items() for n in lines))
    done = sorted(set(BACKSLASH_PENDING) - set(found))
    assert not done, f"no continuations left in {done}: remove them from BACKSLASH_PENDING"


def test_pending_backslash_files_lie_in_the_runtime():
    assert all(f.startswith("tiga/xla_free_runtime/") for f in BACKSLASH_PENDING)


@pytest.mark.parametrize("source,expected", [
    ("x = 1 + \\\n    2\n", [1]),
    ("if a and \\\n        b:\n    pass\n", [1]),
    ("f(a, \\\n  b)\n", [1]),                    # redundant inside brackets: still one
    ("s = 'a\\\\'\nt = 'b\\n'\n", []),           # escapes in strings
    ("s = 'ab\\\ncd'\n", []),                   # a string continued over two lines
    ('s = """a \\\nb"""\n', []),                # a backslash-newline in a string
    ("x = 1  # no \\\ny = 2\n", []),            # ... in a comment
    ("x = (1 +\n     2)\n", []),
])
def test_backslash_check(source, expected):
    assert backslash_continuations(source) == expected
