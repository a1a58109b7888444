"""IR tooling: `tiga-opt` (subprocess, console script and main()) with both flag spellings,
`tg.jit(f).lower(...).ir(level)`, `MessagePassing.ir`, TIGA_DUMP, and the schedule pass's
choices from shapes and TIGA_NUM_THREADS."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ir import COL_IDX, GOLDEN, LEVELS, ROW_PTR, WeightedSum, fixture_kwargs, golden

import tiga as tg
from tiga.lower import ir
from tiga.lower.opt_cli import main
from tiga.lower.passes import lower_iter_to_kernel, select_kernel_schedule
from tiga.lower.pipeline import lower

REPO = Path(__file__).resolve().parents[2]
ALL_PASSES = ["--lower-domain-to-iter", "--lower-iter-to-kernel", "--select-kernel-schedule",
              "--plan-distributed-tasks"]
REPORT_SPELLING = ["-gf-" + p[2:] for p in ALL_PASSES]


@pytest.fixture(autouse=True)
def _two_threads(monkeypatch):
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    monkeypatch.delenv("TIGA_DUMP", raising=False)
    monkeypatch.delenv("TIGA_DUMP_DIR", raising=False)


def run_opt(args, command=None, stdin=None):
    env = dict(os.environ, TIGA_NUM_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cmd = command or [sys.executable, "-m", "tiga.lower.opt_cli"]
    return subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          input=stdin, timeout=120)


# ---- tiga-opt ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [ALL_PASSES, REPORT_SPELLING], ids=["long", "report"])
def test_tiga_opt_subprocess_runs_every_pass(flags):
    res = run_opt([str(GOLDEN / "domain.mlir"), *flags])
    assert res.returncode == 0, res.stderr
    assert res.stdout == golden("task")


def test_tiga_opt_console_script():
    script = Path(sys.executable).parent / "tiga-opt"
    if not script.exists():
        pytest.skip("tiga-opt is not installed in this environment (pip install -e .)")
    res = run_opt([str(GOLDEN / "domain.mlir"), "-gf-lower-domain-to-iter"], [str(script)])
    assert res.returncode == 0, res.stderr
    assert res.stdout == golden("iter")


@pytest.mark.parametrize("src,flags,want", [
    ("domain", ["--lower-domain-to-iter"], "iter"),
    ("domain", ["-gf-lower-domain-to-iter"], "iter"),
    ("iter", ["--lower-iter-to-kernel", "--select-kernel-schedule"], "kernel"),
    ("iter", ["-gf-lower-iter-to-kernel", "-gf-select-kernel-schedule"], "kernel"),
    ("kernel", ["--plan-distributed-tasks"], "task"),
    ("kernel", ["-gf-plan-distributed-tasks"], "task"),
    ("task", [], "task"),
])
def test_tiga_opt_main_each_pass(capsys, src, flags, want):
    assert main([str(GOLDEN / f"{src}.mlir"), *flags]) == 0
    assert capsys.readouterr().out == golden(want)


def test_tiga_opt_kernel_without_schedule_and_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(golden("iter")))
    assert main(["-", "--lower-iter-to-kernel"]) == 0
    out = capsys.readouterr().out
    assert out == str(lower_iter_to_kernel(ir.parse_module(golden("iter"))))
    assert "gf_kernel.launch" in out and "block_rows" not in out
    assert str(select_kernel_schedule(ir.parse_module(out))) == golden("kernel")


@pytest.mark.parametrize("args,message", [
    (["domain.mlir", "--fuse-everything"], "unknown option '--fuse-everything'"),
    ([], "expected one input FILE (or - for stdin), found 0"),
    (["a.mlir", "b.mlir"], "expected one input FILE (or - for stdin), found 2"),
    (["missing.mlir"], "No such file or directory"),
    (["domain.mlir", "--lower-iter-to-kernel"],
     "lower-iter-to-kernel: expects an iter module, found a domain module"),
    (["kernel.mlir", "-gf-lower-domain-to-iter"],
     "lower-domain-to-iter: expects a domain module, found a kernel module"),
])
def test_tiga_opt_errors_exit_1_with_a_message(capsys, monkeypatch, args, message):
    monkeypatch.chdir(GOLDEN)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("tiga-opt: error: ") and message in err


def test_tiga_opt_rejects_invalid_ir(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text(golden("iter").replace('"compressed-row"', '"dense"'))
    res = run_opt([str(bad), "--lower-iter-to-kernel"])
    assert res.returncode == 1 and res.stdout == ""
    assert "coordinate_hierarchy 'dense' does not match the csr relation" in res.stderr
    res = run_opt(["-"], stdin="module @m attributes {gf.level = \"domain\"} {")
    assert res.returncode == 1 and "IR parse error at line 1" in res.stderr


def test_tiga_opt_help(capsys):
    assert main(["--help"]) == 0
    assert "--lower-domain-to-iter" in capsys.readouterr().out


# ---- API hooks ---------------------------------------------------------------------------------


def weighted_sum_plus_one(x, w):
    graph = tg.Graph.from_csr(ROW_PTR, COL_IDX, num_src=2)
    return WeightedSum()(graph=graph, src={"x": x}, dst={}, edge={"w": w}) * 2.0 + 1.0


@pytest.mark.parametrize("level", LEVELS)
def test_jit_lower_ir_each_level(level):
    x, w = np.array([2.0, 3.0], np.float32), np.array([4.0, 5.0, 2.0], np.float32)
    lowered = tg.jit(weighted_sum_plus_one).lower(x, w)
    text = lowered.ir(level)
    module = ir.parse_module(text)
    module.verify()
    assert (module.level, module.name) == (level, "weighted_sum_plus_one")
    assert str(module) == text == str(lower(lowered.program, level, name=module.name))
    op_name = {"domain": "gf.apply", "iter": "gf_iter.traverse", "kernel": "gf_kernel.launch",
               "task": "gf_task.launch"}[level]
    assert f'"{op_name}"' in text and '"gf.relation"()' in text
    assert "gf_tensor.mul" in text and "gf_tensor.add" in text
    assert "!gf.relation<csr, src=2, dst=3, edges=3, index=i64>" in text
    assert lowered.ir("program") == str(lowered.program)


def test_constant_relations_are_identified_by_digest():
    x, w = np.ones(2, np.float32), np.ones(3, np.float32)

    def other(x, w):
        g = tg.Graph.from_csr(ROW_PTR, np.array([1, 0, 1]), num_src=2)
        return WeightedSum()(graph=g, src={"x": x}, dst={}, edge={"w": w})

    digests = [ir.parse_module(tg.jit(f).lower(x, w).ir("domain")).body.ops[0].attrs
               for f in (weighted_sum_plus_one, weighted_sum_plus_one, other)]
    assert digests[0] == digests[1] != digests[2]
    module = ir.parse_module(tg.jit(other).lower(x, w).ir("domain"))
    with pytest.raises(tg.UnsupportedError, match="gf.relation has no GraphProgram form"):
        ir.program_from_module(module)


def test_ir_rejects_unknown_stage():
    lowered = tg.jit(weighted_sum_plus_one).lower(np.ones(2, np.float32),
                                                   np.ones(3, np.float32))
    with pytest.raises(tg.UnsupportedError, match="IR stage 'ptx' does not exist"):
        lowered.ir("ptx")     # ("llvm" and "triton" render a backend's source text)
    with pytest.raises(tg.UnsupportedError, match="domain, iter, kernel, task"):
        WeightedSum().ir("mlir", **fixture_kwargs())


def test_message_passing_ir_needs_the_calls_arguments():
    """A layer keeps nothing of its calls (thread-safe): ir() is of the arguments given."""
    layer = WeightedSum()
    with pytest.raises(tg.TigaError, match=r"WeightedSum\.ir\(\): pass the call's arguments"):
        layer.ir("domain")
    kw = fixture_kwargs()
    out = layer(**kw)
    np.testing.assert_allclose(np.asarray(out), [23.0, 6.0, 0.0])
    with pytest.raises(tg.TigaError, match="pass the call's arguments"):
        layer.ir("domain")                          # a call leaves nothing behind
    assert layer.ir("iter", **kw) == golden("iter")
    assert layer.ir("program", **kw) == str(layer._call_for(kw).staged_program()[0])


def test_repeat_over_propagate_runs_and_lowers():
    """Regression: tg.repeat whose body closes over a relation (repeat consts of GraphType)."""
    x, w = np.array([1.0, -2.0], np.float32), np.array([0.5, 1.5, 2.0], np.float32)
    graph = tg.Graph.from_csr(np.array([0, 2, 3]), np.array([0, 1, 1]), num_src=2)

    def f(x, w):
        return tg.repeat(3, lambda h: WeightedSum()(graph=graph, src={"x": h}, dst={},
                                                    edge={"w": w}), x)

    h = x.astype(np.float64)
    for _ in range(3):
        h = np.array([h[0] * w[0] + h[1] * w[1], h[1] * w[2]])
    np.testing.assert_allclose(np.asarray(tg.jit(f)(x, w)), h, rtol=1e-6)
    text = tg.jit(f).lower(x, w).ir("kernel")
    assert '"gf_tensor.repeat"' in text and "body = #region<0>" in text
    assert '"gf_kernel.launch"' in text and str(ir.parse_module(text)) == text


# ---- TIGA_DUMP and the schedule ---------------------------------------------------------------


def test_tiga_dump_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("TIGA_DUMP", "iter")
    WeightedSum().ir("task", **fixture_kwargs())
    err = capsys.readouterr().err
    assert err == "// TIGA_DUMP iter\n" + golden("iter")


def test_tiga_dump_all_to_a_directory(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TIGA_DUMP", "all")
    monkeypatch.setenv("TIGA_DUMP_DIR", str(tmp_path / "dumps"))
    WeightedSum().ir("task", **fixture_kwargs())
    assert capsys.readouterr().err == ""
    for level in LEVELS:
        assert (tmp_path / "dumps" / f"WeightedSum.{level}.mlir").read_text() == golden(level)


def test_tiga_dump_rejects_unknown_stage(monkeypatch):
    monkeypatch.setenv("TIGA_DUMP", "kernel,llvm")
    with pytest.raises(tg.TigaError, match="TIGA_DUMP: unknown stage"):
        WeightedSum().ir("domain", **fixture_kwargs())


def _launch(module):
    (op,) = [op for op in module.body.ops if isinstance(op, ir.LaunchOp)]
    return op


@pytest.mark.parametrize("feat,dtype,itemsize", [
    ((32,), np.float32, 4), ((4,), np.float64, 8), ((2, 3), np.float32, 4),
    ((256,), np.float16, 4)])  # float16 storage computes in float32
def test_schedule_follows_feature_width(feat, dtype, itemsize):
    graph = tg.Graph.from_csr(ROW_PTR, COL_IDX, num_src=2)
    x = np.ones((2,) + feat, dtype)
    kw = dict(graph=graph, src={"x": x}, dst={}, edge={"w": np.ones((3,) + feat, dtype)})
    kernel = lower_iter_to_kernel(ir.parse_module(WeightedSum().ir("iter", **kw)))
    s = _launch(select_kernel_schedule(kernel, target="triton")).schedule
    width = int(np.prod(feat))
    lanes = 32 // itemsize  # 256-bit SIMD lanes of the compute dtype
    row_bytes = width * itemsize
    # a stored CSR walk gathers rows x 16 neighbours x the padded row per program, within
    # 4096 elements (at least 2 rows: else one row per trip, rows by output bytes)
    padded = int(np.prod([1 << (d - 1).bit_length() for d in feat]))
    tiled_rows = 4096 // (16 * padded)
    if tiled_rows >= 2:
        assert s.block_rows == min(64, 1 << (tiled_rows.bit_length() - 1))
        assert dict(s.tiles)["row_tile"] == 1 and s.num_warps == 4
    else:
        assert s.block_rows == min(64, 1 << ((4096 // row_bytes).bit_length() - 1))
        assert "row_tile" not in dict(s.tiles)
    assert s.vector_width == max(v for v in (1, 2, 4, 8, 16) if v <= lanes and width % v == 0)
    assert s.block_neighbors == 16 and s.threads is None and s.edge_unroll is None
    text = str(select_kernel_schedule(kernel, target="triton"))
    assert 'target = "triton"' in text and "threads =" not in text and "vector_width" in text
    cpu = _launch(ir.parse_module(WeightedSum().ir("kernel", **kw))).schedule
    assert cpu.threads == 2 and cpu.block_rows is None and cpu.vector_width is None
    # 4 float32 accumulators of the row fit 512 bytes while the row is at most 32 floats
    assert cpu.edge_unroll == max(k for k in (1, 2, 4) if k == 1 or k * width * 4 <= 512)


def test_schedule_threads_and_dense_degree_bound(monkeypatch):
    graph = tg.Graph.dense(3, 5)
    kw = dict(graph=graph, src={"x": np.ones(3, np.float32)}, dst={}, edge={})

    class Sum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x

    kernel = _launch(ir.parse_module(Sum().ir("kernel", **kw)))
    assert dict(kernel.guards) == {"max_degree": tg.core.types.Dim("S")}
    module = lower(tg.make_program(lambda g, x: tg.propagate(g, lambda s, d, e: s.x, tg.sum(),
                                                             src={"x": x}))(
        graph, np.ones(3, np.float32)), "kernel")
    op = _launch(module)
    assert dict(op.guards) == {"max_degree": 3} and op.schedule.chunks_per_thread == 16
    # 3 rows and 15 edges: below the parallel threshold the launch runs on one thread
    assert op.schedule.threads == 1 and op.schedule.row_partition == "row-balanced"
    iter_module = lower(tg.make_program(lambda g, x: tg.propagate(
        g, lambda s, d, e: s.x, tg.sum(), src={"x": x}))(graph, np.ones(3, np.float32)), "iter")
    gpu = _launch(select_kernel_schedule(lower_iter_to_kernel(iter_module), target="triton"))
    assert gpu.schedule.block_neighbors == 4    # the degree bound 3, rounded up
    monkeypatch.delenv("TIGA_NUM_THREADS")
    threads = _launch(ir.parse_module(Sum().ir("kernel", **kw))).schedule.threads
    assert threads == os.cpu_count()
    monkeypatch.setenv("TIGA_NUM_THREADS", "zero")
    with pytest.raises(tg.CompilationError, match="TIGA_NUM_THREADS must be a positive "
                                                  "integer, found 'zero'"):
        Sum().ir("kernel", **kw)
