"""`make demo` output: an example prints one summary line of at most 100 characters, and
its full explain() report only with TIGA_DEMO_VERBOSE=1 (examples/weighted_sum.py, the
cheapest; the others follow the same pattern and their own tests check their results)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(verbose: bool) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TIGA_DEMO_VERBOSE"}
    if verbose:
        env["TIGA_DEMO_VERBOSE"] = "1"
    proc = subprocess.run([sys.executable, "examples/weighted_sum.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_demo_prints_one_short_line_and_explains_only_when_asked():
    short = _run(verbose=False)
    assert len(short) == 1 and len(short[0]) <= 100, short
    assert "y [23.0, 6.0, 0.0], dx [4.0, 7.0], dw [2.0, 3.0, 3.0]" in short[0]
    full = _run(verbose=True)
    assert any(line.startswith("route:") for line in full)
    assert full[-1] == "ok" and len(full) > 10
