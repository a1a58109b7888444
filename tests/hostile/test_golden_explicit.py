"""Golden IR files are regenerated only by an explicit command (issue 41): TIGA_UPDATE_GOLDEN=1
used to make tests/lower/test_ir.py rewrite tests/lower/golden/*.mlir inside the run and pass
whatever the printer printed. Now a printer change fails the golden test with the variable set
too, the files stay as they were, and `python tests/lower/update_golden.py` (`make golden`
with --update) is the one way to regenerate them; without --update it only checks."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

LOWER = Path(__file__).parents[1] / "lower"


def _test_ir():
    spec = importlib.util.spec_from_file_location("golden_test_ir", LOWER / "test_ir.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_printer_change_fails_even_with_the_update_variable(monkeypatch):
    mod = _test_ir()
    before = {p: p.read_bytes() for p in mod.GOLDEN.glob("*.mlir")}
    assert len(before) == 4
    monkeypatch.setenv("TIGA_UPDATE_GOLDEN", "1")
    monkeypatch.setenv("TIGA_NUM_THREADS", "2")
    real = mod.WeightedSum.ir
    monkeypatch.setattr(mod.WeightedSum, "ir", lambda self, *a, **k: real(self, *a, **k) + "//x\n")
    for level in mod.LEVELS:
        with pytest.raises(AssertionError, match="make golden"):
            mod.test_golden_text_of_each_level(level)
    with pytest.raises(AssertionError, match="no longer read"):
        mod.test_update_golden_variable_is_refused()
    assert {p: p.read_bytes() for p in mod.GOLDEN.glob("*.mlir")} == before


def test_the_check_command_finds_the_files_current():
    res = subprocess.run([sys.executable, str(LOWER / "update_golden.py")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "golden files match the printer" in res.stdout
