"""The first call pins glibc's malloc thresholds (xla_free_runtime/backends/cpu/native/
heap.py), so per-call arrays of a few MiB are reused from the heap instead of faulted in
afresh every call. Oracle:
the process's own minor page-fault count (getrusage) over an allocation pattern that makes
unpinned glibc trim and regrow its heap every round."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tiga.xla_free_runtime.backends.cpu.native import heap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# one 4 MiB block freed (glibc's thresholds adapt to it: mmap 4 MiB, trim 8 MiB), then rounds
# of five 4.5 MiB arrays, all freed: unpinned, the 22 MiB heap top is trimmed and refaulted
# every round (about 5,700 pages); pinned it is reused
SCRIPT = """
import resource, sys
import numpy as np
import tiga as tg
if sys.argv[1] == "call":
    g = tg.Graph.from_coo(np.array([0, 1]), np.array([1, 0]), num_src=2, num_dst=2)
    tg.propagate(g, lambda s, d, e: s.x, tg.sum(), src={"x": np.ones((2, 3), np.float32)})
a = np.ones(4 << 20, np.uint8)
del a
def one_round():
    xs = [np.ones(9 << 19, np.uint8) for _ in range(5)]
    del xs
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env) -> int:
    clean = {k: v for k, v in os.environ.items()
             if k not in heap.USER_SETTINGS + ("TIGA_PIN_MALLOC", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], env={**clean, **env},
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_a_call_pins_the_thresholds_and_rounds_stop_faulting():
    unpinned = _faults("call", TIGA_PIN_MALLOC="0")
    pinned = _faults("call")
    assert unpinned > 20 * 2000, unpinned     # the pattern really does trim every round
    assert pinned < unpinned / 20, (pinned, unpinned)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_without_a_call_nothing_is_pinned():
    assert _faults("none") > 20 * 2000


@pytest.mark.parametrize("env, why", [
    ({"TIGA_PIN_MALLOC": "0"}, "TIGA_PIN_MALLOC=0"),
    ({"TIGA_PIN_MALLOC": "off"}, "TIGA_PIN_MALLOC=0"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000"}, "MALLOC_TRIM_THRESHOLD_ is set"),
    ({"MALLOC_MMAP_THRESHOLD_": "1000"}, "MALLOC_MMAP_THRESHOLD_ is set"),
    ({"MALLOC_TOP_PAD_": "0"}, "MALLOC_TOP_PAD_ is set"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES sets glibc.malloc"),
])
def test_a_users_own_malloc_settings_are_left_alone(env, why):
    assert heap.wanted(env) == why


def test_otherwise_the_thresholds_are_wanted():
    assert heap.wanted({}) is None
    assert heap.wanted({"TIGA_PIN_MALLOC": "1", "GLIBC_TUNABLES": "glibc.pthread.x=1"}) is None
