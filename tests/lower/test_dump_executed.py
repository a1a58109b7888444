"""TIGA_DUMP=kernel during an ordinary call writes the Kernel IR of the kernels that call ran,
and the dumped schedule is the one the generated code was rendered with: re-rendering the
LLVM text the runtime compiled shows the dumped prefetch distance and unrolled edge loop,
and the knobs equal an independent statement of the rule. CSR and implicit walks of the
generic propagate kernel, and the radius / kNN (cell shells, tiled scan) walks, whose
tiles are the dumped ones; explain()'s schedule line is the dumped attributes."""
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
from tiga.lower.ir.syntax import format_attr

pytestmark = pytest.mark.skipif(not CPU_LLVM_AVAILABLE, reason="needs llvmlite")

CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.caches.executables import CACHE
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
    # and means over a contiguous walk or a stencil's static offsets (offset k folds into
    # accumulator k % 4); prefetch only where sources are gathered (CSR)
    lanes = 1 if reducer == "max" else max(
        k for k in (1, 2, 4) if k == 1 or k * F * 4 <= 512)
    assert s.edge_unroll == lanes
    assert s.prefetch_distance == (16 if kind == "csr" else 0)
    assert s.parallel == "rows"
    assert op.traversal == ("csr-row" if kind == "csr" else "stencil-row")
    assert ("edge4" in text) == (lanes > 1 and kind == "csr")
    assert ("stencil.interior" in text) == (kind == "stencil")
    assert ("llvm.prefetch" in text) == (s.prefetch_distance > 0)
    if s.prefetch_distance:
        ahead = re.findall(r"= add nsw i64 %\"[^\"]+\", (\d+)\n", text)
        assert str(s.prefetch_distance) in ahead


GOLDEN_KERNEL = Path(__file__).parent / "golden" / "kernel.mlir"

RENDER_CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.caches.executables import CACHE
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
    text = re.sub(r"\n\s*(target|threads|row_partition|chunks_per_thread|edge_unroll|"
                  r"prefetch_distance|parallel) = [^,\n]*,", "", GOLDEN_KERNEL.read_text())
    assert "threads" not in text and "edge_unroll" not in text
    path = tmp_path / "k.mlir"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "tiga.lower.opt_cli", str(path), "--render"],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 1 and "no schedule attributes" in res.stderr, res.stderr


# ---- radius, kNN (cell shells) and kNN (tiled scan): the generated-relation walks ----------

GENERATED_CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.caches.executables import CACHE
rng = np.random.default_rng(2)
kind, dims = sys.argv[1], int(sys.argv[2])
pos = rng.random((400, dims)).astype(np.float32)
x = rng.standard_normal((400, 8)).astype(np.float32)
make = lambda: tg.Graph.radius(pos, 0.15) if kind == "radius" else tg.Graph.knn(pos, 5)
got = tg.propagate(make(), lambda s, d, e: s.x, tg.sum(), src={"x": x}, dst={}, edge={})
rp, ci = make().resolve_csr()      # the reference's edge list (numpy), not the fused walk
want = np.zeros_like(x)
np.add.at(want, np.repeat(np.arange(400), np.diff(rp)), x[ci])
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
# (the cell directory's counting sort is a helper kernel, not a propagate launch)
exes = [e for e in CACHE._mem.values() if e.ir_text and e.signature.relation[0] != "directory"]
json.dump([[e.ir_text, list(e.signature.relation)] for e in exes], open(sys.argv[3], "w"))
"""


def _tiles(op) -> dict:
    return dict(op.schedule.tiles)


@pytest.mark.parametrize("kind,dims,traversal", [("radius", 3, "cell-directory-row"),
                                                 ("knn", 2, "knn-shell-row"),
                                                 ("knn", 9, "knn-tile-row")])
def test_generated_walk_dumps_the_schedule_it_runs(tmp_path, kind, dims, traversal):
    out = tmp_path / "texts.json"
    env = dict(os.environ, TIGA_DUMP="kernel", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"), TIGA_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", GENERATED_CHILD, kind, str(dims), str(out)], env=env,
                   check=True, timeout=240)
    texts = json.loads(out.read_text())
    dumps = sorted((tmp_path / "dump").glob("*.kernel.mlir"))
    assert len(texts) == 1 and len(dumps) == 1, (len(texts), dumps)
    (text, relation), op = texts[0], _launch(dumps[0])
    s = op.schedule
    assert op.traversal == traversal and s.target == "cpu-llvm" and s.threads == 2
    # the walk computes each row's neighbours: every row costs alike before the walk runs,
    # no edge-id range to unroll over, no stored column to prefetch from
    assert (s.row_partition, s.edge_unroll, s.prefetch_distance) == ("row-balanced", 1, 0)
    assert "edge4" not in text
    # the cell walks prefetch the destination rows and outputs of the row ROW_AHEAD visits
    # ahead (rows go in cell order, their fields in the caller's order); the tiled scan's
    # rows are consecutive
    assert ("llvm.prefetch" in text) == (traversal != "knn-tile-row")
    mode, block = relation[2], tuple(relation[7])
    if traversal != "knn-tile-row":
        assert mode == "cells" and block == () and not s.tiles
        return
    t = _tiles(op)
    lanes = t["vector_bytes"] // 4     # float32 coordinates
    assert mode == "tiled" and block == (lanes, t["group_rows"], t["group_vectors"])
    # the register-blocked product: group_rows x group_vectors fused multiply-adds of
    # `lanes`-wide vectors per coordinate step
    fmas = re.findall(r"call <(\d+) x float> @\"?llvm\.fmuladd", text)
    assert set(fmas) == {str(lanes)} and len(fmas) == t["group_rows"] * t["group_vectors"]


EXPLAIN_CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
rng = np.random.default_rng(3)
x = rng.standard_normal((3000, 4)).astype(np.float32)
kind = sys.argv[1]
if kind == "csr":
    g = tg.Graph.from_csr(np.arange(3001) * 12, rng.integers(0, 3000, 3000 * 12), num_src=3000)
elif kind == "stencil":
    g = tg.Graph.stencil((50, 60), [(0, 1), (1, 0), (0, -1), (-1, 0)])
elif kind == "radius":
    g = tg.Graph.radius(rng.random((3000, 3)).astype(np.float32), 0.05)
else:
    g = tg.Graph.knn(rng.random((3000, 2)).astype(np.float32), 6)


class Sum(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, s, d, e):
        return s.x * 2.0


kw = dict(graph=g, src={"x": x}, dst={}, edge={})
Sum()(**kw)
json.dump(Sum().explain(**kw).schedule, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize("kind,traversal", [("csr", "csr-row"), ("stencil", "stencil-row"),
                                            ("radius", "cell-directory-row"),
                                            ("knn", "knn-shell-row")])
def test_explain_schedule_is_the_dumped_kernel_ir(tmp_path, kind, traversal):
    """explain()'s schedule line is built from the launch's attributes: it shows exactly the
    schedule attributes the Kernel IR dumped by the call prints, in order."""
    out = tmp_path / "schedule.json"
    env = dict(os.environ, TIGA_DUMP="kernel", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"), TIGA_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", EXPLAIN_CHILD, kind, str(out)], env=env,
                   check=True, timeout=240)
    schedule = json.loads(out.read_text())
    (dump,) = sorted((tmp_path / "dump").glob("*.kernel.mlir"))
    lines = [ln.strip().rstrip(",") for ln in dump.read_text().splitlines()]
    printed = lines[lines.index('target = "cpu-llvm"'):
                    next(i for i, ln in enumerate(lines) if ln.startswith("input_roles"))]
    assert schedule.startswith(f"{traversal} launch {{{', '.join(printed)}}}"), \
        (schedule, printed)
    assert f'traversal = "{traversal}"' in lines
    # the row chunks it reports are the ones that schedule cuts
    if kind == "csr":
        assert re.search(r"; \d+ row chunks of this relation", schedule), schedule


# ---- dot-product attention: the forward and the fused (dk, dv, dq) backward kernels --------

ATTENTION_CHILD = r"""
import json, sys
import numpy as np
import tiga as tg
from tiga.xla_free_runtime.caches.executables import CACHE
n, H, D = 90, 2, int(sys.argv[1])
rng = np.random.default_rng(4)
q, k, v = (rng.standard_normal((n, H, D)).astype(np.float32) for _ in range(3))
g = tg.Graph.triangular(n)


class Attention(tg.MessagePassing):
    reducer = tg.online_softmax()

    def edge(self, src, dst, edge, scale):
        return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)


def f(q, k, v):
    return Attention()(graph=g, src={"key": k, "value": v}, dst={"query": q}, scale=0.3)


y = np.asarray(f(q, k, v))
grads = tg.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2))(q, k, v)
exes = [e for e in CACHE._mem.values() if e.ir_text]
ex = tg.jit(tg.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2))).lower(
    q, k, v).compile().explain()
json.dump({"exes": [[e.ir_text, list(e.signature.relation)] for e in exes],
           "schedule": ex.schedule, "y": y.tolist()}, open(sys.argv[2], "w"))
"""


def _allocas(text: str) -> dict:
    return {m[0]: int(m[1]) for m in re.findall(r'%"(\w+)" = alloca \[(\d+) x float\]', text)}


@pytest.mark.parametrize("width", [16, 64])
def test_attention_dumps_the_tiles_its_kernels_run(tmp_path, width):
    """An ordinary forward and tg.grad call dump an attention-tiles launch per propagate; the
    compiled forward and backward kernels record the schedule's tiles, and their stack tiles
    (an independent statement of the kernels' layout) have the dumped sizes."""
    out = tmp_path / "attn.json"
    env = dict(os.environ, TIGA_DUMP="kernel", TIGA_DUMP_DIR=str(tmp_path / "dump"),
               TIGA_CACHE_DIR=str(tmp_path / "cache"), TIGA_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", ATTENTION_CHILD, str(width), str(out)], env=env,
                   check=True, timeout=240)
    got = json.loads(out.read_text())
    # (each call dumps its program's bound kernel module: every launch in it is one that runs)
    launches = [op for p in sorted((tmp_path / "dump").glob("*.kernel.mlir"))
                for op in parse_kernel(p.read_text()).body.ops if isinstance(op, LaunchOp)]
    attention = [op for op in launches if op.traversal == "attention-tiles"]
    by_kernel: dict = {}
    for op in attention:     # (the forward of the grad call: the one returning statistics)
        which = "forward" if op.comp.reducer.name == "online_softmax" else "backward"
        if which not in by_kernel or op.comp.reducer.stats:
            by_kernel[which] = op
    assert set(by_kernel) == {"forward", "backward"}, [op.traversal for op in launches]
    fwd, bwd = by_kernel["forward"], by_kernel["backward"]
    assert fwd.comp.reducer.stats and len(fwd.results) == 3      # y, row max, row mass
    assert bwd.comp.reduce_by == ("src", "src", "dst") and len(bwd.results) == 3
    for op in (fwd, bwd):
        s = op.schedule
        assert (s.target, s.threads, s.edge_unroll, s.prefetch_distance) == \
            ("cpu-llvm", 2, 1, 0)
        assert op.coordinate_hierarchy == "attention-tiles" and op.materializes == ()
    kernels = {rel[0]: (text, {name: val for name, val in rel[1:]})
               for text, rel in got["exes"]}
    assert set(kernels) == {"attention", "attention-backward"}, list(kernels)
    (ftext, ftiles), (btext, btiles) = kernels["attention"], kernels["attention-backward"]
    assert ftiles == _tiles(fwd) and btiles == _tiles(bwd)
    t = _tiles(fwd)
    step = 16 * t["step_vectors"]
    rows = t["group_rows"] * t["row_groups"]
    a = _allocas(ftext)
    assert (a["pbuf"], a["st"], a["mb"], a["mv"]) == \
        (t["group_rows"] * step, rows * width, rows, rows * 16)
    t = _tiles(bwd)
    a = _allocas(btext)
    assert (a["ktb"], a["pbuf"], a["qtile"], a["dkacc"]) == \
        (width * t["key_block"], t["tile_rows"] * t["key_block"], t["tile_rows"] * width,
         t["key_block"] * width)
    # explain()'s schedule line is the backward launch's printed schedule attributes
    attrs = ", ".join(f"{k} = {format_attr(v)}" for k, v in bwd.schedule.attrs())
    assert got["schedule"].startswith(f"attention-tiles launch {{{attrs}}}"), got["schedule"]
