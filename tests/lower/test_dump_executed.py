"""TIGA_DUMP=kernel during an ordinary call writes the Kernel IR of the kernels that call ran,
and the dumped schedule is the one the generated code was rendered with: re-rendering the
the LLVM text the runtime compiled shows the dumped prefetch distance and unrolled edge loop,
and the knobs equal an independent statement of the rule. (CSR and implicit walks of the
generic propagate kernel; radius/kNN/attention planners do not lower through the IR yet.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiga.lower import CPU_LLVM_AVAILABLE
from tiga.lower.ir import LaunchOp
from tiga.lower.ir.kernel import parse_kernel

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")

CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.cache import CACHE
rng = np.random.default_rng(0)
n, e = 50, 300
src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
graphs = {"csr": tg.Graph.from_coo(src, dst, num_src=n, num_dst=n),
          "stencil": tg.Graph.stencil((5, 10), [(0, 1), (1, 0), (0, -1)])}
F = int(sys.argv[1])
x = rng.standard_normal((n, F)).astype(np.float32)
w = rng.standard_normal((e, 1)).astype(np.float32)
red = {"sum": tg.sum(), "max": tg.max(), "mean": tg.mean()}[sys.argv[3]]
g = graphs[sys.argv[2]]
edge = {"w": w} if sys.argv[2] == "csr" else {}
fn = (lambda s, d, ed: s.x * ed.w) if edge else (lambda s, d, ed: s.x)
out = tg.propagate(g, fn, red, src={"x": x}, dst={}, edge=edge)
exes = [x for x in CACHE._mem.values() if x.ir_text]
json.dump([x.ir_text for x in exes], open(sys.argv[4], "w"))
"""


def _run(tmp_path: Path, F: int, kind: str, reducer: str):
    out = tmp_path / "texts.json"
    env = dict(os.environ, TIGA_DUMP="kernel", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", CHILD, str(F), kind, reducer, str(out)], env=env,
                   check=True, timeout=240)
    dumps = sorted((tmp_path / "dump").glob("*.kernel.mlir"))
    return json.loads(out.read_text()), dumps


def _launch(path: Path) -> LaunchOp:
    module = parse_kernel(path.read_text())
    return next(op for op in module.body.ops if isinstance(op, LaunchOp))


@pytest.mark.parametrize("F,kind,reducer", [(1, "csr", "sum"), (32, "csr", "sum"),
                                             (200, "csr", "mean"), (8, "csr", "max"),
                                             (4, "stencil", "sum")])
def test_dumped_schedule_is_what_the_kernel_runs(tmp_path, F, kind, reducer):
    texts, dumps = _run(tmp_path, F, kind, reducer)
    assert len(texts) == 1 and len(dumps) == 1, (texts, dumps)   # one kernel, dumped once
    text, op = texts[0], _launch(dumps[0])
    s = op.schedule
    # independent oracle for the knobs: 4 accumulators of F float32 within 512 bytes, for sums
    # and means over a contiguous walk only; prefetch only where sources are gathered (CSR)
    lanes = 1 if reducer == "max" or kind == "stencil" else max(
        k for k in (1, 2, 4) if k == 1 or k * F * 4 <= 512)
    assert s.edge_unroll == lanes
    assert s.prefetch_distance == (16 if kind == "csr" else 0)
    assert s.parallel == "rows"
    assert op.traversal == ("csr-row" if kind == "csr" else "stencil-row")
    assert ("edge4" in text) == (lanes > 1)
    assert ("llvm.prefetch" in text) == (s.prefetch_distance > 0)
    if s.prefetch_distance:
        ahead = re.findall(r"= add nsw i64 %\"[^\"]+\", (\d+)\n", text)
        assert str(s.prefetch_distance) in ahead


GOLDEN_KERNEL = Path(__file__).parent / "golden" / "kernel.mlir"

RENDER_CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.cache import CACHE
rng = np.random.default_rng(1)
n, d = 40, 5
g = tg.Graph.from_csr(np.arange(n + 1) * d, rng.integers(0, n, n * d))
tg.propagate(g, lambda s, t, e: s.x * e.w, tg.sum(), src={"x": rng.random(n, np.float32)},
             dst={}, edge={"w": rng.random(n * d, np.float32)})
exe = [x for x in CACHE._mem.values() if x.ir_text][0]
json.dump([exe.ir_text, exe.signature.symbol], open(sys.argv[1], "w"))
"""


def test_render_of_golden_kernel_is_the_kernel_a_call_compiles(tmp_path):
    """`tiga-opt kernel.mlir --render` (the golden WeightedSum launch) prints the LLVM text
    an ordinary call of the same propagate compiles, up to the symbol name."""
    out = tmp_path / "call.json"
    env = dict(os.environ, TIGA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", RENDER_CHILD, str(out)], env=env, check=True,
                   timeout=240)
    compiled, symbol = json.loads(out.read_text())
    rendered = subprocess.run([sys.executable, "-m", "tiga.lower.opt_cli", str(GOLDEN_KERNEL),
                               "--render"], env=env, check=True, timeout=240,
                              capture_output=True, text=True).stdout
    assert rendered.replace("WeightedSum_0", "SYM") == compiled.replace(symbol, "SYM")


def test_render_refuses_a_module_without_schedule(tmp_path):
    text = re.sub(r"\n\s*(block_rows|block_neighbors|vector_width|threads|num_warps|"
                  r"pipeline_stages|row_partition|edge_unroll|prefetch_distance|parallel)"
                  r" = [^,\n]*,", "", GOLDEN_KERNEL.read_text())
    path = tmp_path / "k.mlir"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "tiga.lower.opt_cli", str(path), "--render"],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 1 and "no schedule attributes" in res.stderr, res.stderr
