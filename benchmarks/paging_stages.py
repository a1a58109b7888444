"""Where a paged call's loader time goes, stage by stage (issue 28 item 1).

    python benchmarks/paging_stages.py                    # 10M edges, warm, 5 calls
    python benchmarks/paging_stages.py --first-run        # each call as a relation's first
    python benchmarks/paging_stages.py --edges 1000000 --reps 3

Wraps the page loaders' functions with timers (summed over the prefetch threads, per call)
and runs the paging benchmark's workload (benchmarks/workloads/paging.py: 16 neighbours, 32
float32 features, 65536 rows a page, 512 MiB host budget) from a store it builds once under
--root. `--first-run` clears the per-page window memo before each call, so every page's
ids go through distinct() as on a relation's first paged call. Before/after comparisons:
run it alternately against two trees (`git archive <rev> | tar -x -C /work/a`, then
`TREE=/work/a python benchmarks/paging_stages.py`: TREE's tiga is imported instead of the
installed one, which PYTHONPATH cannot override for an editable install), several rounds,
on a quiet machine.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
if os.environ.get("TREE"):      # another tree's tiga: past the editable install's finder
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.environ["TREE"])
from workloads.paging import DEGREE, csr_rows, features  # noqa: E402

STAGES = (  # (module under tiga.xla_free_runtime, owner or "", function, label)
    ("store.stores", "Store", "read_rows", "csr read (Store.read_rows)"),
    ("paging.handlers", "PagedRun", "distinct", "distinct + remap"),
    ("memory.tiers.disk", "DiskStorage", "take_rows", "field gather (take_rows)"),
    ("memory.tiers.disk", "DiskStorage", "_read_direct", "  range reads (_read_direct)"),
    ("memory.tiers.disk", "DiskStorage", "_read_chunk", "  chunk file read + crc32c"),
    ("paging.buffers", "PageBuffers", "acquire", "page buffer set acquire (waits)"),
    ("paging.handlers", "PagedRun", "load_relation", "loader: relation rows + distinct"),
    ("paging.handlers", "PagedRun", "load_field", "loader: field rows / gathers"),
    ("paging.run", "_PagedRun", "load", "loader total (load, before 1cfa41f)"),
    ("paging.run", "_PagedRun", "compute", "compute (kernel, writes; before the split)"),
    ("paging.handlers", "PagedRun", "compute", "compute (kernel, writes)"),
)


def timed(stages: list) -> tuple:
    """Wrap each stage's function with a timer; (seconds, calls) by label."""
    import importlib
    seconds, calls, lock = collections.defaultdict(float), collections.Counter(), threading.Lock()
    cpu = collections.defaultdict(float)     # the calling thread's CPU time, by label
    for mod, owner, name, label in stages:
        try:
            o = importlib.import_module("tiga.xla_free_runtime." + mod)
        except ImportError:     # (a stage the tree under test does not have: an older one)
            continue
        o = getattr(o, owner, None) if owner else o
        fn = getattr(o, name, None)
        if fn is None:
            continue

        def wrapper(*a, _fn=fn, _label=label, **k):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return _fn(*a, **k)
            finally:
                with lock:
                    seconds[_label] += time.perf_counter() - t
                    cpu[_label] += time.thread_time() - c
                    calls[_label] += 1
        setattr(o, name, functools.wraps(fn)(wrapper))
    return seconds, cpu, calls


def process_cpu() -> float:
    """User + system CPU seconds of this process, every thread."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def store(tg, root: str, edges: int) -> str:
    n, path = edges // DEGREE, os.path.join(root, f"stages-{edges}")
    if not os.path.exists(path):
        with tg.store.create(path, num_src=n, num_dst=n, index_dtype="int32") as w:
            for a in range(0, n, 1 << 18):
                b = min(n, a + (1 << 18))
                w.append_csr_chunk(*csr_rows(a, b, n))
                w.append_field("x", features(np.arange(a, b)), role="src")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--first-run", action="store_true")
    ap.add_argument("--root", default=os.environ.get("TIGA_BENCH_PAGING_DIR", "/tmp"))
    a = ap.parse_args(argv)
    os.environ.setdefault("TIGA_PROGRESS", "0")
    import tiga as tg
    seconds, cpu, calls = timed(list(STAGES))
    path = store(tg, a.root, a.edges)

    class Gather(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x
    layer, g, x = Gather(), tg.Graph.open(path), tg.store.open(path)["x"]
    times = []
    with tg.scope(budgets={"host": "512MiB"}, page_rows=65536):
        for _ in range(2):                 # compiles; fills the page cache and the memo
            layer(graph=g, src={"x": x})
        seconds.clear(), cpu.clear(), calls.clear()
        c0 = process_cpu()
        for _ in range(a.reps):
            if a.first_run:
                g.params.get("page_windows", {}).clear()
            t = time.perf_counter()
            layer(graph=g, src={"x": x})
            times.append(time.perf_counter() - t)
    paged_cpu = (process_cpu() - c0) / a.reps
    n = a.edges // DEGREE
    gm, xm = tg.Graph.from_csr(*csr_rows(0, n, n), num_src=n), features(np.arange(n))
    layer(graph=gm, src={"x": xm})
    mem, c0 = [], process_cpu()
    for _ in range(a.reps):
        t = time.perf_counter()
        layer(graph=gm, src={"x": xm})
        mem.append(time.perf_counter() - t)
    print(f"{tg.__file__}: {a.edges:,} edges, {'first-run ids' if a.first_run else 'warm'}, "
          f"{a.reps} calls; paged median {np.median(times) * 1e3:.1f} ms, in-memory median "
          f"{np.median(mem) * 1e3:.1f} ms; load average {os.getloadavg()[0]:.2f}")
    print(f"  process CPU per call: paged {paged_cpu * 1e3:.1f} ms, in-memory "
          f"{(process_cpu() - c0) / a.reps * 1e3:.1f} ms")
    print(f"  {'stage':32s} {'wall':>8s}    {'CPU':>8s} (summed over threads, per call)")
    for label in seconds:
        wall, used = seconds[label] / a.reps * 1e3, cpu[label] / a.reps * 1e3
        print(f"  {label:32s} {wall:8.2f} ms {used:8.2f} ms ({calls[label] / a.reps:.0f} "
              "calls/call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
