"""A disk tensor a function closes over pages like an argument (issue 28 item 4): tg.grad and
tg.jit of a function that reads a store field from its closure, not from its arguments, grow
the peak RSS as the same function taking the field as an argument does (which
test_paged_memory.py bounds by the budget plus the documented working set), over a field
five times the host budget: a closed-over tensor used to become a literal of the program,
read whole. Measured in a subprocess after a warm-up call, the peak reset through
/proc/self/clear_refs; results are checked against numpy on the same arrays."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peak_rss import PROBE  # noqa: E402

pytest.importorskip("zarr", minversion="3.1")

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

SCRIPT = PROBE + r'''
import json, sys
import numpy as np
import tiga as tg

MiB = 1 << 20
N, F, BUDGET, ROWS = 80_000, 64, 8 * MiB, 2048       # x: 39 MiB
root = sys.argv[1]


ci = np.random.default_rng(0).integers(0, N, N).astype(np.int32)   # one source per row
xs = np.random.default_rng(1).random((N, F))
with tg.store.create(f"{root}/s", num_src=N, num_dst=N) as w:
    w.append_csr_chunk(np.arange(N + 1), ci)
    w.append_field("x", xs, role="src")
g, x = tg.Graph.open(f"{root}/s"), tg.store.open(f"{root}/s")["x"]


class Scaled(tg.MessagePassing):
    reducer = tg.sum()

    def edge(self, src, dst, edge, w):
        return src.x * w


layer = Scaled()
arg_grad = tg.grad(lambda w, x: tg.math.sum(layer(graph=g, src={"x": x}, w=w)))
arg_fwd = tg.jit(lambda w, x: layer(graph=g, src={"x": x}, w=w))
# x read from the closure, never passed: the functions' only argument is w
clo_grad = tg.grad(lambda w: tg.math.sum(layer(graph=g, src={"x": x}, w=w)))
clo_fwd = tg.jit(lambda w: layer(graph=g, src={"x": x}, w=w))
w = np.float64(2.0)
with tg.scope(page_rows=ROWS, budgets={"host": BUDGET}):
    arg_grad(w, x), arg_fwd(w, x)                    # compiles the page kernels
    _, grad_arg = peak_growth(lambda: arg_grad(w, x))
    dw, grad_closure = peak_growth(lambda: clo_grad(w))
    _, fwd_arg = peak_growth(lambda: arg_fwd(w, x))
    y, fwd_closure = peak_growth(lambda: clo_fwd(w))
ok_dw = np.isclose(float(np.asarray(dw)), xs[ci].sum(), rtol=1e-12, atol=0)
ok_y = bool(np.array_equal(y._storage.read_rows(0, N), 2.0 * xs[ci]))
print("RESULT " + json.dumps({"grad": [grad_arg, grad_closure], "fwd": [fwd_arg, fwd_closure],
                              "budget": BUDGET, "field": xs.nbytes,
                              "tiers": [x.tier, y.tier], "ok": [bool(ok_dw), ok_y]}))
'''


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_closed_over_disk_tensor_pages_like_an_argument(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT,
                         env={"TIGA_PROGRESS": "0", "PATH": "/usr/bin:/bin",
                              "HOME": str(Path.home())})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert got["ok"] == [True, True]
    assert got["tiers"] == ["disk", "disk"]        # the field and the result stay on disk
    field = got["field"]
    assert field > 4 * got["budget"]
    for what in ("grad", "fwd"):
        arg, closure = got[what]
        # read whole, the closure would add the field (39 MiB) to the argument's peak
        assert closure <= arg + field / 2, \
            f"{what}: closing over the disk field grew the peak RSS by {closure / MiB:.1f} " \
            f"MiB, passing it by {arg / MiB:.1f} MiB (the field: {field / MiB:.0f} MiB)"
