"""The API reference shows users what they can use and nothing of the runtime: every error
and warning class a user can meet is `tg.<Name>` and has an entry in docs/api/errors.md
saying what to do; every tg.nn layer's `forward` documents its arguments and what it
returns (help() shows that, not torch's generic text); the reference's directives and the
anchors of the built site name no private (`_`) object and nothing under the runtime
(tiga.xla_free_runtime) or the code generators (tiga.lower)."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiga as tg

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
ERRORS_PAGE = (API / "errors.md").read_text()
HAS_TORCH = importlib.util.find_spec("torch") is not None
# UnsupportedError subclasses that only signal between a code generator and the runtime,
# which catches them and falls back; one that escaped is still a tg.UnsupportedError
GENERATOR_SIGNALS = {"TritonUnsupported", "CodegenUnsupported"}
# members of documented classes that only the runtime calls (hidden with `members:`)
PLUMBING = {"pp_param", "with_stats", "with_regions", "row_offsets", "local_offsets",
            "page_bounds", "read_inputs", "attach"}
RUNTIME_PATHS = ("tiga.xla_free_runtime", "tiga.lower")


# run in a fresh interpreter: importing every module (backends, the MPI layer) must not
# change the state of the process the other tests run in
_WALK = """
import importlib, importlib.util, json, pkgutil, warnings
import tiga
skip_torch = importlib.util.find_spec("torch") is None
for info in pkgutil.walk_packages(tiga.__path__, "tiga."):
    if skip_torch and info.name.startswith("tiga.torch_bridge"):
        continue
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(info.name)
    except Exception:      # triton, mpi4py, ... not installed
        pass
out = {}
for base in (tiga.TigaError, Warning):
    found, walked, todo = set(), set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub in walked:
                continue
            walked.add(sub)
            todo.append(sub)      # through builtins too (UserWarning)
            if sub.__module__.split(".")[0] == "tiga":
                found.add((sub.__module__, sub.__qualname__))
    out[base.__name__] = sorted(found)
print(json.dumps(out))
"""


@functools.cache
def _walk() -> dict:
    proc = subprocess.run([sys.executable, "-c", _WALK], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _subclasses(base: type) -> list:
    """Every subclass of `base` defined in tiga, found in a fresh interpreter that imported
    every tiga module that imports here (optional dependencies may be missing)."""
    classes = []
    for module, qualname in _walk()[base.__name__]:
        if "<locals>" in qualname:
            continue
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        classes.append(obj)
    return sorted(classes, key=lambda c: c.__name__)


def _user_visible(classes: list) -> list:
    return [c for c in classes if not c.__name__.startswith("_")
            and c.__name__ not in GENERATOR_SIGNALS and "<locals>" not in c.__qualname__]


def test_every_error_class_is_exported_and_documented():
    classes = _user_visible(_subclasses(tg.TigaError))
    names = {c.__name__ for c in classes}
    # the ones this test was written against: a shrinking list means a walk that broke
    assert {"LayerArgumentError", "RequiresGradError", "ConfigError", "ShapeError"} <= names
    for cls in classes:
        name = cls.__name__
        assert getattr(tg, name, None) is cls, f"{cls.__module__}.{name} is not tg.{name}"
        assert name in tg.__all__, f"tg.{name} is not in tiga.__all__"
        assert f"::: tiga.{name}\n" in ERRORS_PAGE, f"tg.{name} is not in docs/api/errors.md"
        assert "What to do" in (cls.__doc__ or ""), f"tg.{name}'s docstring says no fix"


def test_generator_signals_are_unsupported_errors():
    for cls in _subclasses(tg.TigaError):
        if cls.__name__ in GENERATOR_SIGNALS:
            assert issubclass(cls, tg.UnsupportedError), cls


def test_every_warning_class_is_exported_and_documented():
    classes = _user_visible(_subclasses(Warning))
    assert {"TraceWarning", "CacheTrustWarning"} <= {c.__name__ for c in classes}
    for cls in classes:
        assert getattr(tg, cls.__name__, None) is cls, cls
        assert f"::: tiga.{cls.__name__}\n" in ERRORS_PAGE, cls


def test_requires_grad_error_is_what_a_user_meets_and_says_what_to_do():
    torch = pytest.importorskip("torch")
    g = tg.Graph.from_csr([0, 1, 2], [1, 0], num_src=2)
    x = torch.ones(2, 3, requires_grad=True)

    def f(x):
        return tg.propagate(g, lambda src, dst, edge: src.x, tg.sum(), src={"x": x})

    with pytest.raises(tg.RequiresGradError, match=r"\.backward\(\).*x\.detach\(\)"):
        tg.jit(f)(x)
    assert isinstance(tg.RequiresGradError("m"), tg.TraceError)
    assert f(x).shape == (2, 3)       # outside tg.jit it runs, under torch.autograd


def test_layer_argument_error_is_what_the_layers_raise():
    pytest.importorskip("torch")
    assert tg.nn.LayerArgumentError is tg.LayerArgumentError
    with pytest.raises(tg.LayerArgumentError, match="SAGEConv"):
        tg.nn.SAGEConv(4, 2, aggr="median")
    assert issubclass(tg.LayerArgumentError, ValueError)   # as PyG raises


def _forward_layers() -> list:
    return [n for n in tg.nn.LAYERS] + ["Aggregation", "DegreeScalerAggregation"]


@pytest.mark.skipif(not HAS_TORCH, reason="the tg.nn layers need torch")
@pytest.mark.parametrize("name", _forward_layers())
def test_layer_forward_documents_its_arguments_and_result(name):
    import pydoc

    cls = getattr(tg.nn, name)
    forward = cls.forward
    doc = inspect.getdoc(forward) or ""
    assert doc and "Should be overridden by all subclasses" not in doc, \
        f"tg.nn.{name}.forward has torch's generic docstring"
    params = [p for p in inspect.signature(forward).parameters if p != "self"]
    if cls.__module__.endswith(".aggr") or name.endswith("Aggregation"):
        missing = [p for p in params if not re.search(rf"\b{p}\b", doc)]
    else:
        args = doc.split("Args:", 1)[-1].split("Returns:", 1)[0] if "Args:" in doc else ""
        missing = [p for p in params if not re.search(rf"^\s+{p}: \S", args, re.M)]
        returns = doc.split("Returns:", 1)[-1] if "Returns:" in doc else ""
        assert re.search(r"\([^)]*\bN", returns), f"{name}.forward: no output shape"
    assert not missing, f"tg.nn.{name}.forward's docstring does not name {missing}"
    assert doc.splitlines()[0] in pydoc.render_doc(forward, renderer=pydoc.plaintext)


def _directives() -> list:
    out = []
    for page in sorted(API.glob("*.md")):
        out += [(page.name, m) for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)]
    return out


@pytest.mark.parametrize("page, path", _directives())
def test_reference_directive_names_no_internal(page, path):
    assert not any(part.startswith("_") for part in path.split(".")), (page, path)
    assert not path.startswith(RUNTIME_PATHS), f"{page}: {path} is runtime plumbing"


@pytest.mark.skipif(importlib.util.find_spec("mkdocstrings") is None,
                    reason="needs the docs extra: pip install -e '.[docs]'")
def test_built_reference_anchors_name_no_internal(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ids = set()
    for html in (tmp_path / "site" / "api").rglob("index.html"):
        ids |= set(re.findall(r'id="(tiga\.[^"]+)"', html.read_text()))
    assert any(i.endswith("GCNConv.forward") for i in ids)    # layer pages show forward
    # the anchor each error's note names (docs/api/errors.md#tiga.<Name>) is its entry there
    errors_ids = set(re.findall(r'id="(tiga\.\w+)"',
                                (tmp_path / "site" / "api" / "errors" / "index.html").read_text()))
    for cls in _user_visible(_subclasses(tg.TigaError)) + [tg.TigaError]:
        assert f"tiga.{cls.__name__}" in errors_ids, cls
    bad = sorted(i for i in ids if i.startswith(RUNTIME_PATHS)
                 or any(p.startswith("_") for p in i.split("."))
                 or i.rsplit(".", 1)[-1] in PLUMBING)
    assert not bad, f"the reference shows internals: {bad}"


def _static_nn_names() -> set:
    """The names tiga/nn.py imports under TYPE_CHECKING (what mkdocstrings reads)."""
    import ast

    tree = ast.parse((ROOT / "tiga" / "nn.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            return {a.name for imp in node.body for a in imp.names}
    return set()


def test_reference_documents_tg_nn_names_under_tg_nn():
    """Layer pages anchor at tiga.nn.<Name> (not the torch bridge's module path): tg.nn's
    lazily loaded names are imported statically for the docs tools, all of them, and every
    layer, function and NeighborLoader has its entry."""
    runtime = set(tg.nn.LAYERS + tg.nn.AGGREGATIONS + tg.nn.FUNCTIONS)
    assert _static_nn_names() == runtime
    text = (API / "nn.md").read_text()
    documented = set(re.findall(r"^::: tiga\.nn\.(\w+)$", text, re.M))
    wanted = set(tg.nn.LAYERS + tg.nn.FUNCTIONS) | {"DegreeScalerAggregation", "trace"}
    assert wanted <= documented, f"missing from docs/api/nn.md: {sorted(wanted - documented)}"
    assert documented <= runtime | {"trace"}
    assert "::: tiga.torch_bridge.layers." not in text.replace(
        "::: tiga.torch_bridge.layers.loader.SampledSubgraph", "")
    if HAS_TORCH:
        from tiga.torch_bridge import layers

        for name in documented - {"trace"}:
            assert getattr(tg.nn, name) is getattr(layers, name), name


def test_dir_of_tiga_lists_the_public_api_only():
    listed = set(dir(tg))
    assert listed == set(tg.__all__)
    assert not listed & {"xla_free_runtime", "lower", "core", "trace", "annotations"}
    assert tg.xla_free_runtime is not None     # still importable, just not listed


def test_error_tracebacks_end_with_their_entry_in_the_errors_page():
    import pickle
    import traceback

    with pytest.raises(tg.GraphValidationError) as info:
        tg.Graph.from_csr([0, 2], [0, 5], num_src=2)
    err = info.value
    link = "docs/api/errors.md#tiga.GraphValidationError"
    assert "errors.md" not in str(err)                    # the message itself is unchanged
    # what every user can follow: help() on the class (no site URL is configured), then
    # the page in the docs, whose anchor the built site has (test below)
    assert err.__notes__ == ["See help(tg.GraphValidationError), or its entry in the errors "
                             f"reference: {link}"]
    assert "What to do" in tg.GraphValidationError.__doc__
    shown = "".join(traceback.format_exception(err)).rstrip("\n")
    assert shown.endswith(link)
    again = pickle.loads(pickle.dumps(err))               # (MPI ranks pickle errors)
    assert again.__notes__ == err.__notes__ and str(again) == str(err)
    for cls in _subclasses(tg.TigaError) + [tg.TigaError]:
        if "<locals>" in cls.__qualname__:
            continue
        try:
            note = cls("m").__notes__[-1]
        except TypeError:      # a private signal with another constructor
            continue
        name = note.rsplit("#tiga.", 1)[1]
        assert note.startswith(f"See help(tg.{name}), "), note
        assert f"::: tiga.{name}\n" in ERRORS_PAGE, (cls, note)
        assert issubclass(cls, getattr(tg, name)), (cls, note)
        if cls.__name__ in GENERATOR_SIGNALS:
            assert name == "UnsupportedError", note


def test_tg_math_exports_its_functions_only():
    """dir(tg.math) and its __all__ are the documented functions: the primitives
    (`add_p` ...), the tracer's helpers (`Tracer`, `bind`) and imported modules stay
    reachable but unlisted."""
    names = set(tg.math.__all__)
    assert set(dir(tg.math)) == names and len(names) > 60
    assert not names & {"Tracer", "bind", "np", "builtins", "host_array", "aval_of",
                        "promote", "as_dtype", "ShapeError"}
    assert not [n for n in names if n.endswith("_p")]
    for name in names:
        assert (getattr(tg.math, name).__doc__ or "").strip(), name
    assert tg.math.bind is not None          # internals are still reachable by the runtime


def test_dir_of_the_torch_free_namespaces_is_their_api():
    assert set(dir(tg.distributed)) == set(tg.distributed.__all__)
    assert set(dir(tg.nn)) == set(tg.nn.__all__) | {"aggr"}
    for space in (tg.store, tg.memory):      # runtime modules: their helpers stay unlisted
        assert set(dir(space)) == set(space.__all__)
        assert all(getattr(space, n).__doc__ for n in space.__all__)


SPACES = ("", "math", "nn", "store", "memory", "distributed")


def _public(space: str) -> list:
    module = getattr(tg, space) if space else tg
    return [(space, n) for n in module.__all__ if n != "__version__"]


@pytest.mark.parametrize("space, name", [p for s in SPACES for p in _public(s)],
                         ids=lambda v: v or "tiga")
def test_public_name_has_a_docstring_and_no_private_module_path(space, name):
    """Every name of tiga, tg.math, tg.nn, tg.store, tg.memory and tg.distributed: a
    function or class has its own docstring and lives under no `_` module (help() and
    tracebacks show its module); a value (a dtype, tg.config) is documented by its type."""
    if space == "nn" and not HAS_TORCH and name != "trace":
        pytest.skip("the tg.nn layers need torch")
    obj = getattr(getattr(tg, space) if space else tg, name)
    label = f"tg.{space + '.' if space else ''}{name}"
    if inspect.ismodule(obj):
        assert (obj.__doc__ or "").strip(), f"{label} has no docstring"
        return
    if not (inspect.isclass(obj) or callable(obj)):
        obj = type(obj)
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    assert (doc or "").strip(), f"{label} has no docstring of its own"
    module = obj.__module__
    assert not any(p.startswith("_") for p in module.split(".")), \
        f"{label} lives under the private module {module}"


def test_namespace_members_are_in_the_reference():
    """Each listed name of tg.store, tg.memory, tg.distributed and tg.nn has its entry in
    docs/api (a `:::` directive or a directive's members list); what the reference leaves
    out is not listed."""
    text = "".join(p.read_text() for p in sorted(API.glob("*.md")))
    listed = set(re.findall(r"^::: ([\w.]+)", text, re.M))
    members = {m.strip() for group in re.findall(r"members: \[([^\]]*)\]", text)
               for m in group.split(",")}
    for space in ("store", "memory", "distributed", "nn"):
        module = getattr(tg, space)
        missing = [n for n in module.__all__
                   if f"tiga.{space}.{n}" not in listed and n not in members
                   # (tg.nn.LayerArgumentError is tg.LayerArgumentError, on the errors page)
                   and not (f"tiga.{n}" in listed and getattr(tg, n, None) is getattr(module, n))]
        assert not missing, f"tg.{space}: {missing} are listed but not in docs/api"
