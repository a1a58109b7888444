"""Every python block of README.md and docs/**/*.md runs as written, in a fresh process in an
empty directory, and prints what its comments say (markers and comparison: tests/docs/
_blocks.py). MPI blocks run under the venv's mpiexec with a time limit."""
from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._blocks import chains, instrument, matches, prologue, python_blocks, segments

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# optional packages a block may import: without one installed, its chain is skipped
OPTIONAL = ("torch", "torch_geometric", "triton", "mpi4py", "scipy", "networkx")
LIMIT_S = 240
MPI_ENV = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCALNRANKS", "PYTEST_")


def _all_chains() -> list:
    out = []
    for page in PAGES:
        out += chains(python_blocks(page))
    return out


CHAINS = _all_chains()


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _missing_modules(source: str) -> list:
    wanted = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            wanted |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            wanted.add(node.module.split(".")[0])
    return sorted(m for m in wanted & set(OPTIONAL) if importlib.util.find_spec(m) is None)


def _script(chain) -> tuple[str, dict]:
    """The chain's blocks as one script, instrumented; mark id -> expected output."""
    parts, expected = [prologue()], {}
    for block in chain.blocks:
        src, exp = instrument(block.source, f"{block.path.name}:{block.line}")
        parts.append(f"# --- {block.path.name}:{block.line}\n{src}")
        expected |= exp
    return "\n".join(parts), expected


def _run(chain, script: Path) -> tuple[int, list, str]:
    """(exit code, stdout per rank, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_ENV)}
    env.update(TIGA_PROGRESS="0", PYTHONPATH=str(ROOT))
    if not chain.ranks:
        proc = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env,
                              capture_output=True, text=True, timeout=LIMIT_S)
        return proc.returncode, [proc.stdout], proc.stderr
    # one file per rank keeps each rank's marks and prints in order
    redirect = ("import os as _o, sys as _s\n_s.stdout = open('stdout.' + next(_o.environ[k] "
                "for k in ('PMI_RANK', 'PMIX_RANK', 'OMPI_COMM_WORLD_RANK') if k in _o.environ),"
                " 'w', buffering=1)\n")
    script.write_text(redirect + script.read_text())
    env.update(TIGA_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(LIMIT_S))
    cmd = [_mpiexec(), "-n", str(chain.ranks), sys.executable, "-m", "mpi4py", script.name]
    proc = subprocess.run(cmd, cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=LIMIT_S + 30)
    outs = [(script.parent / f"stdout.{r}").read_text()
            for r in range(chain.ranks) if (script.parent / f"stdout.{r}").exists()]
    return proc.returncode, outs, proc.stdout + proc.stderr


@pytest.mark.parametrize("chain", CHAINS, ids=[c.name for c in CHAINS])
def test_code_block_runs_and_prints_what_it_says(chain, tmp_path):
    if chain.skip:
        pytest.skip(f"marked not runnable: {chain.skip}")
    source = "".join(b.source for b in chain.blocks)
    required = [m[1] for b in chain.blocks for m in b.markers if m[0] == "requires"]
    missing = _missing_modules(source) + [m for m in required
                                          if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    if chain.ranks and (_mpiexec() is None or importlib.util.find_spec("mpi4py") is None):
        pytest.skip("needs the dist extra (mpi4py, mpiexec)")
    text, expected = _script(chain)
    script = tmp_path / "doc_block.py"
    script.write_text(text)
    rc, outs, err = _run(chain, script)
    assert rc == 0, f"{chain.name} failed:\n{err[-4000:]}\n{''.join(outs)[-2000:]}"
    found = [segments(o) for o in outs]
    for mark, want in expected.items():
        printed = [p for seg in found for p in seg.get(mark, [])]
        assert printed, f"{mark}: the print never ran"
        for p in printed:
            assert matches(p, want), f"{mark}: printed\n{p}\nbut its comment says\n{want}"


def test_markers_and_comparison_catch_mistakes():
    """The checker itself: a wrong comment, a wrong number and a bad marker are caught."""
    assert matches("[23.  6.  0.]\n", "[23. 6. 0.]")
    assert not matches("[23. 6. 1.]", "[23. 6. 0.]")
    assert matches("route: cpu-llvm (fused)", "route: cpu-llvm ...")
    assert not matches("route: reference", "route: cpu-llvm ...")
    src, exp = instrument("for i in range(2):\n    print(i)  # 0\n", "t")
    assert list(exp.values()) == ["0"] and src.count("__tiga_doc_mark__") == 2
    with pytest.raises(ValueError, match="start its line"):
        instrument("if True: print(1)  # 1\n", "t")
    out = subprocess.run([sys.executable, "-c", prologue() + src], capture_output=True,
                         text=True, check=True).stdout
    assert segments(out) == {"t#0": ["0\n", "1\n"]}   # the second run says 1, not 0
    assert not matches(segments(out)["t#0"][1], "0")
    src, exp = instrument("print(1)  # 1\nprint([[2], [3]])  # [[2] [3]]\n", "u")
    out = subprocess.run([sys.executable, "-c", prologue() + src], capture_output=True,
                         text=True, check=True).stdout
    assert segments(out) == {"u#0": ["1\n"], "u#1": ["[[2], [3]]\n"]}
