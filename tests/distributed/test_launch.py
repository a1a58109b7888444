"""Launches the MPI tests under mpiexec (2, 3 and 4 ranks) from the normal pytest session, so
`make test` and CI run them; plus the failure paths (a rank that stalls or raises ends the
job with an error, never a hang). Skipped without mpi4py / mpiexec, and inside mpiexec."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ._mpi import MPI_ENV, under_mpiexec

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(under_mpiexec(), reason="already a rank of an mpiexec job"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or _mpiexec() is None,
                       reason="needs the dist extra: pip install 'tiga[dist]'"),
]


def _launch(ranks: int, args: list, limit: int, **env_extra) -> tuple:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PMI_", "PMIX_")) and k not in MPI_ENV}
    # ranks may outnumber cores: one kernel thread each; MPIEXEC_TIMEOUT bounds the job
    env.update(TIGA_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(limit), **env_extra)
    cmd = [_mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=limit + 30)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


# every module at two rank counts (2 and 3 or 4): ranks outnumber the 2 cores of CI, where
# a launch costs about its rank count in CPU time; all launches together stay under 90 s
SUITES = {2: ("test_mpi_equivalence.py", "test_mpi_relations.py", "test_mpi_tasks.py",
              "test_mpi_paged.py"),
          3: ("test_mpi_relations.py", "test_mpi_tasks.py"), 4: ("test_mpi_equivalence.py",)}


def test_every_mpi_module_is_launched():
    # conftest.py collects test_mpi_*.py only under mpiexec: one missing here would never run
    launched = {f for files in SUITES.values() for f in files}
    assert {p.name for p in HERE.glob("test_mpi_*.py")} == launched


@pytest.mark.parametrize("ranks", sorted(SUITES))
def test_mpi_suite(ranks):
    rc, out, _ = _launch(ranks, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "-p", "no:randomly", *[str(HERE / f) for f in SUITES[ranks]]],
                         limit=400)
    assert rc == 0, out[-6000:]
    assert " passed" in out and "skipped" not in out.split(" passed")[-1][:40], out[-3000:]


def test_stalled_rank_gives_distributed_error_within_timeout():
    rc, out, took = _launch(2, [str(HERE / "failure_script.py"), "silent", "20"], limit=60,
                            TIGA_DIST_TIMEOUT="2")
    assert rc != 0, out[-3000:]
    assert "rank 0 DistributedError after" in out, out[-3000:]
    waited = float(out.split("rank 0 DistributedError after ")[1].split(" s")[0])
    assert 1.9 <= waited < 10, out[-3000:]
    assert "TIGA_DIST_TIMEOUT=2" in out
    assert took < 50     # the job ends when rank 0's error aborts it, not when rank 1 wakes


def test_raising_rank_ends_the_job_nonzero():
    rc, out, took = _launch(2, [str(HERE / "failure_script.py"), "raise"], limit=60,
                            TIGA_DIST_TIMEOUT="30")
    assert rc != 0, out[-3000:]
    assert "rank 1 fails on purpose" in out, out[-3000:]
    assert took < 30
