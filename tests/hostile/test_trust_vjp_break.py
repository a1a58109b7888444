"""A broken Triton VJP fails a test of `make test` on a CPU machine (issue 41, item 7).

On 58b7cff tests/triton's gradient tests compared `tg.grad` of a layer with `tg.grad` of its
`reference()`; the reference call is inlined into the traced program and runs on the same
Triton route, so a wrong backward was compared with itself and passed. Here the real
tests/triton gradient test runs in a pytest of its own (Triton's interpreter, a fresh
artifact cache so no good kernel is read back) with one of two breaks installed by a plugin:

- "triton-walk": the Triton rendering of the walk by source (the propagate a source field's
  cotangent is, so it exists only in gradient programs) reads every edge's fields at edge 0,
  a bug of the Triton route alone (the numpy reference_grad oracle catches it);
- "vjp-rule": propagate's VJP rule scales its cotangents by 1.01, a bug every route shares
  (only the central differences catch it).

Each must make the test fail; with no break the same run passes (the failure is the break's).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

TESTS = Path(__file__).parents[1]
GRAD_TEST = TESTS / "triton" / "test_interpreter.py"

# the plugin the inner pytest loads (-p trust_vjp_break): installs the break named by
# TRUST_BREAK before the tests run, counts the kernels it broke, and registers a hypothesis
# profile without shrinking (a failing property would rerun on the interpreter for minutes)
PLUGIN = '''
import os
from hypothesis import Phase, settings

settings.register_profile("trust-break", deadline=None, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate))
COUNT = os.environ["TRUST_BREAK_COUNT"]


def _count():
    with open(COUNT, "a") as f:
        f.write("x")


def pytest_configure(config):
    how = os.environ["TRUST_BREAK"]
    if how == "triton-walk":
        import tiga.lower.triton as triton_lowering
        from tiga.lower.abi import KernelSource
        real = triton_lowering.render_propagate
        needle = "eid = tl.load(edge_perm + p"

        def broken(params, *args, **kwargs):
            ks = real(params, *args, **kwargs)
            if params["reduce_by"] != "src" or needle not in ks.text:
                return ks
            _count()
            return KernelSource(ks.text.replace(needle, "eid = 0 * tl.load(edge_perm + p"),
                                ks.signature)
        triton_lowering.render_propagate = broken
    elif how == "vjp-rule":
        from tiga.autodiff.registry import vjp_rules
        from tiga.core.prims.graph import propagate_p
        rule = vjp_rules[propagate_p]

        def broken(*args, **kwargs):
            _count()
            return tuple(None if c is None else c * 1.01 for c in rule(*args, **kwargs))
        vjp_rules[propagate_p] = broken
'''


def _run_grad_test(tmp_path, how: str) -> tuple:
    """(exit status, output, kernels or rules the break touched) of the gradient test."""
    (tmp_path / "trust_vjp_break.py").write_text(PLUGIN)
    count = tmp_path / f"count-{how}"
    count.write_text("")
    env = {**os.environ, "TRUST_BREAK": how, "TRUST_BREAK_COUNT": str(count),
           "TRITON_INTERPRET": "1", "TIGA_CACHE_DIR": str(tmp_path / f"cache-{how}"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "trust_vjp_break", "--hypothesis-profile=trust-break",
           f"{GRAD_TEST}::test_grad_matches_reference[sum]"]
    res = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True,
                         timeout=500)
    return res.returncode, res.stdout + res.stderr, len(count.read_text())


@pytest.mark.parametrize("how", ["triton-walk", "vjp-rule"])
def test_a_broken_triton_gradient_fails_the_gradient_test(tmp_path, how):
    rc, out, touched = _run_grad_test(tmp_path, how)
    assert touched, f"the break was never applied (nothing to show):\n{out[-3000:]}"
    assert rc == 1 and "1 failed" in out, f"the gradient test passed a broken VJP:\n{out[-3000:]}"


def test_the_same_run_without_a_break_passes(tmp_path):
    rc, out, _ = _run_grad_test(tmp_path, "none")
    assert rc == 0 and "1 passed" in out, out[-3000:]
