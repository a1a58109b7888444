"""The documentation as a whole: the README is a short front page, relative links resolve,
mkdocs lists every page and builds strictly, and every public name of `tiga` has a
docstring and a place in the API reference (docs/api/)."""
from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import tiga

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
API_TEXT = "\n".join(p.read_text() for p in sorted((DOCS / "api").glob("*.md")))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# subpackages and helpers that `import tiga` exposes but that are not the user's API
INTERNAL = {"api", "autodiff", "core", "trace", "lower", "opt", "xla_free_runtime",
            "torch_bridge", "cli", "testing", "annotations"}
NAMESPACES = {"math", "nn", "distributed", "memory", "store"}


def test_readme_is_a_short_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 1200
    first_block = text.split("```")[1]
    assert first_block.startswith("sh\nmake demo") and "make test" in first_block
    assert "docs/guide/install.md" in text and "docs/api/index.md" in text


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name}: link to {target} ({path} does not exist)"


def test_mkdocs_nav_lists_every_page():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", config, flags=re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages <= listed, f"not in mkdocs.yml's nav: {sorted(pages - listed)}"
    # the benchmark reports and the changelog live outside docs/; docs/hooks adds them
    assert all((DOCS / p).exists() or p.startswith("benchmarks/")
               or (p == "CHANGELOG.md" and (ROOT / p).exists()) for p in listed)


def _public_names() -> list:
    names = set(tiga.__all__) | {n for n in dir(tiga) if not n.startswith("_")}
    return sorted(names - INTERNAL - {"__version__"})


def _own_doc(obj) -> str:
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    doc = (doc or "").strip()
    # a dataclass without a docstring gets its signature as __doc__: not documentation
    return "" if doc.startswith(f"{getattr(obj, '__name__', '')}(") else doc


@pytest.mark.parametrize("name", _public_names())
def test_public_name_is_documented(name):
    obj = getattr(tiga, name)
    if isinstance(obj, types.ModuleType):
        assert name in NAMESPACES, f"tg.{name}: a new public module; add it to the API pages"
        assert f"::: tiga.{name}" in API_TEXT or name == "math", name
        return
    assert f"::: tiga.{name}\n" in API_TEXT + "\n" or f"`tg.{name}`" in API_TEXT, \
        f"tg.{name} is not in docs/api/"
    if callable(obj) and not isinstance(obj, tiga.Reducer):
        assert _own_doc(obj), f"tg.{name} has no docstring"


def _namespace_members(name: str) -> list:
    module = getattr(tiga, name)
    return [(name, m) for m in getattr(module, "__all__", [])]


@pytest.mark.parametrize("namespace, member", [
    *(pair for ns in ("distributed", "memory", "store") for pair in _namespace_members(ns)),
    *(("nn", m) for m in tiga.nn.__all__)])
def test_namespace_member_is_documented(namespace, member):
    if namespace == "nn" and member != "trace" and importlib.util.find_spec("torch") is None:
        pytest.skip("the tg.nn layers need torch")
    obj = getattr(getattr(tiga, namespace), member)
    if callable(obj):
        assert _own_doc(obj), f"tg.{namespace}.{member} has no docstring"


def test_every_math_function_is_in_the_reference():
    module = tiga.math
    functions = [n for n, f in vars(module).items() if not n.startswith("_")
                 and inspect.isfunction(f) and f.__module__ == module.__name__]
    text = (DOCS / "api" / "arrays.md").read_text()
    missing = [n for n in functions if not re.search(rf"`{n}\(|\b{n}\b", text)]
    assert not missing, f"tg.math functions missing from docs/api/arrays.md: {missing}"


def test_package_ships_py_typed():
    assert (ROOT / "tiga" / "py.typed").exists()
    assert 'tiga = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.skipif(importlib.util.find_spec("mkdocstrings") is None,
                    reason="needs the docs extra: pip install -e '.[docs]'")
def test_mkdocs_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    performance = (tmp_path / "site" / "guide" / "performance" / "index.html").read_text()
    images = re.findall(r'<img[^>]*src="([^"]+)"', performance)
    assert images and all((tmp_path / "site" / "guide" / "performance" / src).resolve()
                          .exists() for src in images)
