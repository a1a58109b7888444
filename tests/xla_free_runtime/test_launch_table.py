"""The route table: one explicit, ordered tuple of planners, one `plan` every caller asks."""
import re
from pathlib import Path

import numpy as np

import tiga as tg
from tiga.xla_free_runtime import backend_table as launch
from tiga.xla_free_runtime.backends.cpu import attention as attention_route
from tiga.xla_free_runtime.backends.cpu import generated as generated_route
from tiga.xla_free_runtime.cache import Executable
from tiga.xla_free_runtime.executor import planned

ROOT = Path(tg.__file__).resolve().parent


def test_no_import_order_registry():
    """No planner list filled by import side effects: the table is a tuple in launch.py."""
    assert isinstance(launch.PLANNERS, tuple)
    assert launch.PLANNERS[1:] == (attention_route.plan_attention, generated_route.plan_generated)
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        assert "SPECIALISED_PLANNERS" not in text, path
        assert not re.search(r"PLANNERS\.(append|insert|extend)\(", text), path


def test_plan_routes_a_stored_relation_to_the_generic_kernel():
    rng = np.random.default_rng(0)
    n, e = 30, 120
    g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n)
    x = rng.standard_normal((n, 3))
    program = tg.make_program(
        lambda x: tg.propagate(g, lambda s, d, ed: s.x * 2.0, tg.sum(), src={"x": x}))(x)
    eqn = next(q for q in program.eqns if q.primitive.name == "propagate")
    graph = eqn.inputs[0].value if hasattr(eqn.inputs[0], "value") else g
    found = planned(eqn, graph)
    assert isinstance(found, Executable)
    # the memory cache: the same kernel
    assert planned(eqn, graph) is found
