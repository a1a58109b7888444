"""TIGA_DUMP=task during an ordinary call writes the Task module the interpreter ran, and the
Kernel ops its gf_task.launch ops hold are the kernels that were compiled and run: the printed
op of the dump is the one the executable's cache key was made from, and the runtime lowered
nothing else for the call (the executor, the one place the runtime lowers, is never asked for a
kernel: the pipeline's lower_launch, as the executor calls it, refuses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiga.lower import CPU_LLVM_AVAILABLE

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")

CHILD = r"""
import json, sys
from pathlib import Path
import numpy as np
import tiga as tg
from tiga.lower.ir.kernel import LaunchOp
from tiga.lower.ir.task import TaskLaunchOp, parse_task
from tiga.xla_free_runtime import executor as E
from tiga.xla_free_runtime.caches import equations as equation_cache
from tiga.xla_free_runtime.backends.cpu import propagate as P
from tiga.xla_free_runtime.caches.executables import CACHE

def refuse(*a, **k):
    raise AssertionError("the runtime lowered a kernel the Task module did not hold")
E.pipeline.lower_launch = refuse

rng = np.random.default_rng(0)
n, e = 60, 400
kind = sys.argv[1]
g = tg.Graph.from_coo(rng.integers(0, n, e), rng.integers(0, n, e), num_src=n, num_dst=n) \
    if kind == "csr" else tg.Graph.dense(n)
edge = {"w": rng.standard_normal((g.num_edges, 1))}

class Layer(tg.MessagePassing):
    reducer = getattr(tg, sys.argv[2])()
    def edge(self, src, dst, edge):
        return tg.math.tanh(src.x) * edge.w + dst.h

kw = dict(graph=g, src={"x": rng.standard_normal((n, 3))},
          dst={"h": rng.standard_normal((n, 3))}, edge=edge)
y = np.asarray(Layer()(**kw))
np.testing.assert_allclose(y, np.asarray(Layer().reference(**kw)), rtol=1e-12, atol=1e-12)
dumps = sorted(Path(sys.argv[3]).glob("*.task.mlir"))
module = parse_task(dumps[-1].read_text())
held = [k for t in module.body.ops if isinstance(t, TaskLaunchOp)
        for k in t.body.ops if isinstance(k, LaunchOp)]
ran = [(eqn, key, op) for eqn, variants in equation_cache.entries("kernels")
       for key, op in variants.values()]
json.dump({"dumps": len(dumps), "held": len(held), "ran": len(ran),
           "same_text": [P.kernel_text(h, eqn) == P.kernel_text(op, eqn)
                         for h, (eqn, _, op) in zip(held, ran)],
           "compiled": [key in CACHE._mem for _, key, _ in ran]}, open(sys.argv[4], "w"))
"""


@pytest.mark.parametrize("kind,reducer", [("csr", "sum"), ("csr", "max"), ("dense", "mean")])
def test_dumped_task_module_holds_the_kernels_that_run(tmp_path: Path, kind, reducer):
    out = tmp_path / "out.json"
    env = dict(os.environ, TIGA_DUMP="task", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", CHILD, kind, reducer, str(tmp_path / "dump"),
                    str(out)], env=env, check=True, timeout=240)
    got = json.loads(out.read_text())
    assert got["dumps"] == 1 and got["held"] == 1 and got["ran"] == 1, got
    assert got["same_text"] == [True] and got["compiled"] == [True], got
