"""The benchmark harness runs end to end (a --quick smoke run in a subprocess) and its
correctness check rejects wrong outputs. Not a timing test: no figure is asserted."""
from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)
import measure  # noqa: E402

pytest.importorskip("scipy")
pytest.importorskip("tqdm")


def _run(out, *extra) -> tuple[dict, subprocess.CompletedProcess]:
    cmd = [sys.executable, os.path.join(BENCH, "run.py"), "--quick", "--seed", "3",
           "--out", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = glob.glob(os.path.join(str(out), "results", "run-*-quick.json"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return json.load(f), proc


def _assert_checked(run: dict, expected_impls: set) -> None:
    """Every configuration ran (fresh process each), passed its float64 check, and the order
    is the recorded seeded permutation."""
    results = run["results"]
    assert {r["impl"] for r in results} == expected_impls
    for r in results:
        assert r["status"] == "ok", r
        tol = measure.DEFAULT_TOL[r["dtype"]] * 2
        assert 0 <= r["rel_err"] <= tol, r
        assert r["reps"] >= 1 and r["min_ms"] <= r["median_ms"] <= r["max_ms"], r
    assert sorted(run["order"]) == sorted(
        f"{r['workload']}/{r['size']}/{r['impl']}" for r in results)
    assert run["seed"] == 3


def test_quick_run_writes_checked_results(tmp_path):
    run, proc = _run(tmp_path, "--workloads", "stored_csr.fwd", "hex_mesh.stencil",
                     "--peers", "scipy", "numpy slices", "tiga")
    _assert_checked(run, {"scipy", "numpy slices", "tiga"})
    assert {r["workload"] for r in run["results"]} == {"stored_csr.fwd", "hex_mesh.stencil"}
    assert all(r["size"] in (8192, 32) for r in run["results"])   # --quick: smallest sizes
    md = (tmp_path / "RESULTS.md").read_text()
    assert "## Current standing" in md and "stored_csr.fwd" in md and "hex_mesh.stencil" in md
    with open(tmp_path / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(run["results"])
    assert "order seed 3" in proc.stderr


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs a git checkout")
def test_compare_interleaves_a_worktree(tmp_path):
    run, _ = _run(tmp_path, "--workloads", "stored_csr.fwd", "--peers", "tiga",
                  "--compare", "HEAD")
    old = run["compare"]["impl"]
    _assert_checked(run, {"tiga@worktree", old})
    files = {r["impl"]: r["tiga_file"] for r in run["results"]}
    assert files["tiga@worktree"].startswith(os.path.join(ROOT, "tiga"))
    assert not files[old].startswith(os.path.join(ROOT, "tiga"))   # the worktree's copy
    worktrees = subprocess.run(["git", "-C", ROOT, "worktree", "list"], capture_output=True,
                               text=True).stdout
    assert "tiga-bench-rev-" not in worktrees                       # removed at exit


def test_check_rejects_wrong_outputs():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1000, 4))
    good = ref.astype(np.float32)
    assert measure.check(good, [ref], "float32")[0]
    bad = good.copy()
    bad[123, 2] += 1e-2 * np.abs(ref).max()
    ok, err = measure.check(bad, [ref], "float32")
    assert not ok and err == pytest.approx(1e-2, rel=1e-2)
    nan = good.copy()
    nan[0, 0] = np.nan
    assert not measure.check(nan, [ref], "float32")[0]
    assert not measure.check([good, good], [ref], "float32")[0]     # output count differs
    rows = np.ones(1000, bool)
    rows[123] = False                                               # an ambiguous row
    assert measure.check(bad, ([ref], rows), "float32")[0]


def test_write_paths_script_runs_and_checks_its_files(tmp_path):
    """benchmarks/write_paths.py (the evidence for the paging write policy) runs every path
    end to end, reads each round's files back, and leaves nothing behind in its root."""
    probe = tmp_path / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0))
        os.close(fd)
    except OSError:
        pytest.skip("the temporary directory's file system refuses O_DIRECT")
    root = tmp_path / "root"
    root.mkdir()
    cmd = [sys.executable, os.path.join(BENCH, "write_paths.py"), "--mib", "8", "--rounds",
           "2", "--gaps", "0", "--root", str(root), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out,) = glob.glob(str(tmp_path / "results" / "write-paths-*.json"))
    with open(out) as f:
        runs = json.load(f)["runs"]
    assert [(r["mode"], r["gap_s"]) for r in runs] == \
        [("copy", 0.0), ("direct", 0.0), ("cached", 0.0)]
    assert all(len(r["seconds"]) == 2 and min(r["seconds"]) > 0 for r in runs)
    assert not any(root.iterdir())


def test_write_paths_check_rejects_a_changed_chunk(tmp_path):
    import write_paths
    data = np.arange(2 * write_paths.CHUNK + 100, dtype=np.uint64).astype(np.uint8)
    write_paths._files(tmp_path, data, direct=False)
    write_paths._check(tmp_path, data)
    with open(tmp_path / "1", "r+b") as f:
        f.seek(7)
        f.write(bytes([data[write_paths.CHUNK + 7] ^ 1]))
    with pytest.raises(AssertionError, match="chunk 1"):
        write_paths._check(tmp_path, data)
