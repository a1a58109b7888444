"""Validated settings (issue 41, item 5): tg.config fields reject values of the wrong type
(the string "false" is truthy: stored, it would turn strict mode on), and TIGA_* variables
with a value outside their documented set stop `import tiga` with an error naming the
variable, the value and the accepted values. The oracle for what is accepted is the
documented list in docs/guide/environment.md, checked here value by value."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tiga as tg
from tiga.core import config as config_mod
from tiga.core.config import ConfigError


@pytest.mark.parametrize("field", ["strict", "check", "progress"])
@pytest.mark.parametrize("value", ["false", "False", "0", "", 0, 1, None, 1.0, [], "true"])
def test_bool_fields_refuse_anything_but_a_bool(field, value):
    before = getattr(tg.config, field)
    with pytest.raises(tg.TigaError) as info:
        setattr(tg.config, field, value)
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, (TypeError, ValueError))
    msg = str(info.value)
    assert f"tg.config.{field}" in msg and "bool" in msg and type(value).__name__ in msg
    assert getattr(tg.config, field) is before            # nothing was stored


@pytest.mark.parametrize("field", ["strict", "check", "progress"])
def test_bool_fields_take_bools(field, monkeypatch):
    for value in (True, False):
        monkeypatch.setattr(tg.config, field, value)
        assert getattr(tg.config, field) is value


def test_backend_takes_a_name_or_none(monkeypatch):
    monkeypatch.setattr(tg.config, "_backend", None)
    for bad in (3, b"cpu-llvm", ["cpu-llvm"], True):
        with pytest.raises(ConfigError, match=r"tg.config.backend must be a backend name"):
            tg.config.backend = bad
        assert not tg.config.backend_set
    tg.config.backend = "cpu-llvm"
    assert tg.config.backend == "cpu-llvm" and tg.config.backend_set
    tg.config.backend = None
    assert not tg.config.backend_set


def test_a_typo_in_a_field_name_is_an_error():
    with pytest.raises(AttributeError):
        tg.config.stict = True           # (no silent new attribute)


def test_the_dump_stages_are_the_pipelines():
    from tiga.lower.pipeline import STAGES
    assert config_mod.DUMP_STAGES == tuple(STAGES)


def _import_with(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import tiga, sys; "
                           "print('strict', tiga.config.strict, 'check', tiga.config.check, "
                           "'progress', tiga.config.progress)"],
                          env={**_base_env(), **env}, capture_output=True, text=True,
                          timeout=120)


def _base_env() -> dict:
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIGA_")}
    return env


@pytest.mark.parametrize("name,value", [("TIGA_STRICT", "maybe"), ("TIGA_STRICT", "2"),
                                        ("TIGA_CHECK", "yes please"),
                                        ("TIGA_PROGRESS", "-1"), ("TIGA_DUMP", "bogus"),
                                        ("TIGA_TF32", "fast"), ("TIGA_PIN_MALLOC", "nah"),
                                        ("TIGA_DUMP", "kernel,bogus,iter")])
def test_unknown_environment_values_are_an_error_naming_the_variable(name, value):
    run = _import_with({name: value})
    assert run.returncode != 0, run.stdout
    # the error line, then the note naming its entry in the errors reference
    last, note = run.stderr.strip().splitlines()[-2:]
    assert last.startswith("tiga.core.config.ConfigError: "), run.stderr[-2000:]
    assert note.endswith("docs/api/errors.md#tiga.ConfigError"), note
    assert f"{name}={value!r}" in last
    if name == "TIGA_DUMP":
        assert "bogus" in last and "domain, iter, kernel, task, or all" in last
    else:
        assert "1, true, yes, on" in last and "0, false, no, off" in last


def test_documented_values_are_accepted():
    """Every spelling environment.md lists, in any case and with spaces around it."""
    cases = {"1": True, "true": True, " YES ": True, "On": True,
             "0": False, "false": False, "No": False, "OFF ": False}
    for raw, want in cases.items():
        run = _import_with({"TIGA_STRICT": raw, "TIGA_CHECK": raw, "TIGA_PROGRESS": raw,
                            "TIGA_TF32": raw, "TIGA_PIN_MALLOC": raw,
                            "TIGA_DUMP": "kernel, task"})
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["strict", str(want), "check", str(want),
                                      "progress", str(want)], (raw, run.stdout)
    run = _import_with({"TIGA_STRICT": "", "TIGA_PROGRESS": "", "TIGA_DUMP": "all"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["strict", "False", "check", "False", "progress", "True"]


def test_a_tiga_dump_set_after_import_is_refused_where_it_is_read(monkeypatch):
    """TIGA_DUMP is read again as a call lowers: an unknown stage set after import raises
    ConfigError there (it never turns into a silent reference fallback)."""
    g = tg.Graph.from_coo(np.array([0, 1, 2]), np.array([1, 2, 0]), num_src=3, num_dst=3)

    def f(x):       # (a program of its own: lowered at its first call)
        return tg.propagate(g, lambda s, d, e: s.x * 3.0 + 1.0, tg.sum(), src={"x": x})

    monkeypatch.setenv("TIGA_DUMP", "kernel,bogus")
    with pytest.raises(tg.ConfigError, match="TIGA_DUMP: unknown stage"):
        tg.jit(f)(np.ones((3, 2)))
