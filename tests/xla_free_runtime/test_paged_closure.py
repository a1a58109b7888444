"""A disk tensor a function closes over pages like an argument (issue 28 item 4): tg.grad and
tg.jit of a function that reads a store field from its closure, not from its arguments, grow
the peak RSS by at most the host budget plus the working set docs/guide/larger-than-memory.md
states, over a field well larger than both (a closed-over tensor used to become a literal of
the program, read whole). Measured in a subprocess after a warm-up call, the peak reset
through /proc/self/clear_refs (as test_paged_memory.py); results are checked against numpy on
the same arrays."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zarr", minversion="3.1")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guide" / "larger-than-memory.md"
MiB = 1 << 20

SCRIPT = r'''
import json, sys
import numpy as np
import tiga as tg

MiB = 1 << 20
N, F, BUDGET, ROWS = 320_000, 64, 24 * MiB, 16384    # x: 156 MiB
root = sys.argv[1]


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/self/status has no {key}")


def peak_growth(fn):
    with open("/proc/self/clear_refs", "w") as f:    # the peak restarts at the current RSS
        f.write("5")
    base = status("VmRSS:")
    out = fn()
    return out, status("VmHWM:") - base


def columns(n, a, b):      # one source per destination, scattered over the whole store
    return np.random.default_rng(a).integers(0, n, b - a).astype(np.int32)


def features(a, b):
    return np.random.default_rng(a + 1).random((b - a, F))


def make(path, n):
    with tg.store.create(path, num_src=n, num_dst=n, overwrite=True) as w:
        for a in range(0, n, 65536):
            b = min(n, a + 65536)
            w.append_csr_chunk(np.arange(b - a + 1), columns(n, a, b))
            w.append_field("x", features(a, b), role="src")
    return tg.Graph.open(path), tg.store.open(path)["x"]


class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, w):
        return src.x * w


layer = Scaled()


def calls(g, x):
    # x is read from the closure, never passed: the functions' only argument is w
    grad = tg.grad(lambda w: tg.math.sum(layer(graph=g, src={"x": x}, w=w)))
    fwd = tg.jit(lambda w: layer(graph=g, src={"x": x}, w=w))
    return grad, fwd


g0, x0 = make(f"{root}/small", 3000)
with tg.scope(page_rows=512, budgets={"host": BUDGET}):
    grad0, fwd0 = calls(g0, x0)
    grad0(np.float64(2.0)), fwd0(np.float64(2.0))      # compiles the page kernels
g, x = make(f"{root}/big", N)
grad, fwd = calls(g, x)
with tg.scope(page_rows=ROWS, budgets={"host": BUDGET}):
    dw, bwd = peak_growth(lambda: grad(np.float64(2.0)))
    y, fw = peak_growth(lambda: fwd(np.float64(3.0)))
ci = np.concatenate([columns(N, a, min(N, a + 65536)) for a in range(0, N, 65536)])
xs = np.concatenate([features(a, min(N, a + 65536)) for a in range(0, N, 65536)])
ok_dw = np.isclose(float(np.asarray(dw)), xs[ci].sum(), rtol=1e-12, atol=0)
ok_y = np.array_equal(np.asarray(y), 3.0 * xs[ci])     # one source per row: exact
print("RESULT " + json.dumps({"bwd": bwd, "fwd": fw, "budget": BUDGET, "field": xs.nbytes,
                              "tiers": [x.tier, y.tier], "ok": [bool(ok_dw), bool(ok_y)]}))
'''


def documented_overhead() -> int:
    """The working set above the budget the guide promises, in bytes."""
    found = re.search(r"at most the budget plus (\d+) MiB", DOC.read_text().replace("\n", " "))
    assert found, f"{DOC} no longer states 'at most the budget plus <N> MiB'"
    return int(found.group(1)) * MiB


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_closed_over_disk_tensor_pages_in_grad_and_jit(tmp_path):
    overhead = documented_overhead()
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT,
                         env={"TIGA_PROGRESS": "0", "PATH": "/usr/bin:/bin",
                              "HOME": str(Path.home())})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert got["ok"] == [True, True]
    assert got["tiers"] == ["disk", "disk"]        # the field and the result stay on disk
    budget, field = got["budget"], got["field"]
    assert field > 1.2 * (budget + overhead)       # read whole, x alone breaks the bound
    # the gradient's seed (the sum's cotangent: ones shaped like the result, as large as x
    # here) is made whole, as for an argument (test_paged_memory.py): counted apart
    for what, seed in (("fwd", 0), ("bwd", field)):
        assert got[what] <= budget + overhead + seed, \
            f"{what}: a closed-over disk field grew the peak RSS by {got[what] / MiB:.1f} " \
            f"MiB, over the budget {budget / MiB:.0f} MiB + the documented " \
            f"{overhead / MiB:.0f} MiB" + (" + the seed" if seed else "")
