"""The route of a propagate: one `routes.plan` every caller asks (a stored relation pages on
every target; otherwise the backend of the call's target plans it), no planner table filled by
import side effects, and no backend importing paging or another backend's planner."""
import ast
import re
from pathlib import Path

import numpy as np

import tiga as tg
from tiga.xla_free_runtime import backends
from tiga.xla_free_runtime.caches.executables import Executable
from tiga.xla_free_runtime.calls import routes
from tiga.xla_free_runtime.executor import plan_routes
from tiga.xla_free_runtime.paging.run import PagedPlan

ROOT = Path(tg.__file__).resolve().parent
RUNTIME = ROOT / "xla_free_runtime"


def test_no_planner_table():
    assert not (RUNTIME / "backend_table.py").exists()
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        assert "PLANNERS" not in text and "register_launcher" not in text, path
        assert not re.search(r"in TRITON_BACKENDS", text), path


def _imports(path: Path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_backends_plan_and_import_neither_paging_nor_distributed():
    assert callable(backends.BACKENDS["cpu-llvm"].plan)
    assert callable(backends.BACKENDS["triton"].plan)
    for path in (RUNTIME / "backends").rglob("*.py"):
        bad = [m for m in _imports(path) if m.lstrip(".").split(".")[0] in
               ("paging", "distributed", "backend_table", "executor")]
        assert not bad, (path, bad)


def test_a_stored_relation_pages_on_every_target(tmp_path):
    rng = np.random.default_rng(1)
    n = 40
    rp = np.arange(n + 1) * 3
    ci = rng.integers(0, n, 3 * n)
    with tg.store.create(tmp_path / "s", num_src=n, num_dst=n) as w:
        w.append_csr_chunk(rp, ci)
    g = tg.Graph.open(tmp_path / "s")
    x = rng.standard_normal((n, 2))
    program = tg.make_program(
        lambda x: tg.propagate(g, lambda s, d, ed: s.x, tg.sum(), src={"x": x}))(x)
    eqn = next(q for q in program.eqns if q.primitive.name == "propagate")
    for target in ("cpu-llvm", "triton"):
        assert isinstance(routes.plan(eqn, g, compile=False, target=target), PagedPlan)


def test_plan_routes_a_stored_relation_to_the_generic_kernel():
    rng = np.random.default_rng(0)
    n, e = 30, 120
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    x = rng.standard_normal((n, 3))
    program = tg.make_program(
        lambda x: tg.propagate(g, lambda s, d, ed: s.x * 2.0, tg.sum(), src={"x": x}))(x)
    eqn = next(q for q in program.eqns if q.primitive.name == "propagate")
    found = plan_routes(program, [x])[id(eqn)]
    assert isinstance(found, Executable)
    # the memory cache: the same kernel
    assert plan_routes(program, [x])[id(eqn)] is found
