"""Paging benchmark (issues 15, 28): a graph store on disk run page by page, against
in-memory Tiga on the same graph and against the disk's own floor, measured in the same run,
at 10M, 100M and (with --large) 1B edges.

    python benchmarks/paging.py              # 10M and 100M edges (a few minutes)
    python benchmarks/paging.py --large      # adds 1B edges (about 60 GB of disk, ~15 min)
    python benchmarks/paging.py --quick      # 1M edges, a smoke run
    python benchmarks/paging.py --sizes 10000000 --no-sweep --gradient --floor-mib 1024

The report's workload: destination i reads sources i±1 .. i±8 mod N (16 per row, N = edges
/ 16) with 32 float32 integer-valued features, x[s, f] = (7 s + f) mod 13, so every output
value is an exact small integer and is checked exactly, every row (rows far from the wrap
depend only on i mod 13: one table lookup per row; the wrapped rows are summed directly).

Every phase runs in its own process (`--phase`), so its peak RSS (`ru_maxrss`) is its own:
  ingest     tg.store.create + append_csr_chunk / append_field + commit (timed whole)
  disk       the disk's sequential write and read bandwidth on the store's own directory
             (disk_floor.py: O_DIRECT, cold; buffered with the pages dropped where O_DIRECT
             is refused, and recorded so), right after ingest
  forward    tg.Graph.open + a store field, paged under a host budget; the first call runs
             on a cold page cache (each store file dropped with posix_fadvise(DONTNEED)
             after ingest; no root needed), later calls warm; per-stage seconds (read,
             gather, compute, write, waited), bytes read and written per tier (the run's
             own report, tg.profile()), and what the process read from and wrote to the
             block layer during the call (/proc/self/io, a cross-check)
  io         the forward's I/O with nothing else, on the same disk (disk_floor.call_io): the
             store's files read cold by two threads, the result's bytes written O_DIRECT,
             and both at once (one device shares its bandwidth between reads and writes)
  memory     the same relation built with Graph.from_csr, x in numpy (the same-run peer)
  sweep      the report's page-size sweep at 10M: 16384 / 65536 / 262144 rows per page
  gradient   tg.vjp through the paged program, the cotangent the forward's result (on
             disk past the budget): the transposed relation built out of core first (timed
             apart: once per store), then the backward pass (a walk over the transpose)
report_paging.py then puts each paged call against its floor: max(bytes read from disk /
read bandwidth, bytes written to disk / write bandwidth, the in-memory call's warm median),
and against the call's I/O alone (the io phase: what the disk takes to move its bytes).
Writes results/paging-<date>-<commit>.json, plots/paging.png (time and RSS against edges,
with the floor) and PAGING.md beside RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from workloads.paging import DEGREE, FEATURES, OFFSETS, csr_rows, features  # noqa: E402

RESULT = "RESULT "
INGEST_ROWS = 1 << 18
BUDGET = {"small": "512MiB", "large": "2GiB"}        # host budgets: <= 100M, 1B edges
# issue 28: the 100M forward with its result on the host too (a second forward phase)
EXTRA_BUDGETS = {100_000_000: ("2GiB",)}
SWEEP = (16384, 65536, 262144)


# ---------------------------------------------------------------- the exact oracle
def _table(period_rows: np.ndarray) -> np.ndarray:
    return features(period_rows).astype(np.float64)


def expected_rows(kind: str, a: int, b: int, n: int) -> np.ndarray:
    """Rows [a, b) of y (kind "y": y[i] = sum_o x[i + o]) or of the gradient with the
    cotangent y (kind "dx": dx[s] = sum_o y[s - o]), indices mod n, in float64."""
    reach = 8 if kind == "y" else 16
    rows = np.arange(a, b, dtype=np.int64)
    out = np.empty((b - a, FEATURES))
    # rows whose neighbourhood does not wrap depend on the row mod 13 only
    table = _direct(kind, np.arange(13 + reach, 26 + reach, dtype=np.int64) % n, n) \
        if n > 2 * reach + 26 else None
    inner = (rows >= reach) & (rows < n - reach) if table is not None else \
        np.zeros(len(rows), bool)
    out[inner] = table[(rows[inner] - reach) % 13] if table is not None else 0
    if (~inner).any():
        out[~inner] = _direct(kind, rows[~inner], n)
    return out


def _direct(kind: str, rows: np.ndarray, n: int) -> np.ndarray:
    if kind == "y":
        return sum(_table((rows + o) % n) for o in OFFSETS)
    return sum(_direct("y", (rows - o) % n, n) for o in OFFSETS)


def check_result(t, kind: str, n: int, step: int = 1 << 16) -> int:
    """Compare a result (host or disk tensor) with the oracle, a row range at a time; the
    number of rows checked (all of them), or AssertionError naming the first bad row."""
    st = getattr(t, "_storage", None)
    for a in range(0, n, step):
        b = min(n, a + step)
        got = st.read_rows(a, b) if st is not None and st.tier == "disk" else \
            np.asarray(t[a:b] if st is None else st._live()[a:b])
        want = expected_rows(kind, a, b, n)
        bad = np.flatnonzero(np.any(got != want, axis=1))
        if len(bad):
            i = a + int(bad[0])
            raise AssertionError(f"{kind}[{i}] = {got[bad[0]][:4]}..., expected "
                                 f"{want[bad[0]][:4]}...")
    return n


# ---------------------------------------------------------------- phases (one process each)
def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_split_mib() -> dict:
    """The resident set now, split: anonymous (what the process allocated) and file pages
    (a mapped store's page-cache pages, shared and clean: the kernel takes them back under
    pressure)."""
    try:
        with open("/proc/self/status") as f:
            got = dict(line.split(":", 1) for line in f if line.startswith("Rss"))
        return {k[3:].lower(): int(v.split()[0]) / 1024 for k, v in got.items()}
    except (OSError, ValueError):
        return {}


def _store(root: str, edges: int) -> str:
    return os.path.join(root, f"e{edges}", "store")


def drop_page_cache(path: str) -> int:
    """posix_fadvise(DONTNEED) on every file under `path` (their pages are clean after the
    commit's fsync, so the kernel drops them); the bytes dropped."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                total += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return total


def phase_ingest(tg, root: str, edges: int, **_) -> dict:
    n = edges // DEGREE
    path = _store(root, edges)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    t = time.perf_counter()
    with tg.store.create(path, num_src=n, num_dst=n, index_dtype="int32") as w:
        for a in range(0, n, INGEST_ROWS):
            b = min(n, a + INGEST_ROWS)
            w.append_csr_chunk(*csr_rows(a, b, n))
            w.append_field("x", features(np.arange(a, b)), role="src")
    seconds = time.perf_counter() - t
    disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return {"seconds": seconds, "peak_rss_mib": _rss_mib(), "store_bytes": disk,
            "dropped_bytes": drop_page_cache(path)}


def _gather_layer(tg):
    class Gather(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x
    return Gather()


def _profile(tg):
    """tg.profile() (Tigas before the run reports kept the latest figures on the graph)."""
    import contextlib
    return tg.profile() if hasattr(tg, "profile") else contextlib.nullcontext()


def _io() -> dict:
    """Bytes this process had the block layer read and write so far (/proc/self/io; empty
    where the kernel does not keep them)."""
    try:
        with open("/proc/self/io") as f:
            got = dict(line.split(": ") for line in f.read().splitlines())
        return {"read": int(got["read_bytes"]), "written": int(got["write_bytes"])}
    except (OSError, KeyError, ValueError):
        return {}


def _io_delta(before: dict) -> dict:
    after = _io()
    return {k: after[k] - before[k] for k in before if k in after}


def _stats(g, prof) -> dict:
    s = prof.measured("paged")[-1] if prof is not None else g.params["last_paged_run"]
    return {"pages": s.pages, "page_rows": s.page_rows, "stages_s": dict(s.seconds),
            "bytes_read": dict(s.bytes_read), "bytes_written": dict(s.bytes_written),
            "distinct_ratio": s.distinct_ratio, "overlapped_s": s.overlapped,
            "result_tier": s.result_tier, "mapped": getattr(s, "mapped", False)}


def phase_forward(tg, root: str, edges: int, budget: str, page_rows: int, reps: int,
                  **_) -> dict:
    n, path = edges // DEGREE, _store(root, edges)
    g, x = tg.Graph.open(path), tg.store.open(path)["x"]
    layer, times, runs = _gather_layer(tg), [], []
    drop_page_cache(path)
    with tg.scope(budgets={"host": budget}, page_rows=page_rows), _profile(tg) as prof:
        for i in range(reps):
            io, t = _io(), time.perf_counter()
            y = layer(graph=g, src={"x": x})
            times.append(time.perf_counter() - t)
            runs.append(dict(_stats(g, prof), block_io=_io_delta(io)))
            if i < reps - 1:
                del y
        rss, split = _rss_mib(), _rss_split_mib()   # (before the check: a float64 oracle)
        checked = check_result(y, "y", n)
    return {"cold_s": times[0], "warm_s": times[1:], "runs": runs, "rows_checked": checked,
            "peak_rss_mib": rss, "rss_now_mib": split, "budget": budget,
            "page_rows": page_rows}


def phase_memory(tg, root: str, edges: int, reps: int, **_) -> dict:
    n = edges // DEGREE
    g = tg.Graph.from_csr(*csr_rows(0, n, n), num_src=n)
    x = features(np.arange(n))
    layer, times = _gather_layer(tg), []
    for i in range(reps + 1):            # the first call compiles: not counted
        t = time.perf_counter()
        y = layer(graph=g, src={"x": x})
        times.append(time.perf_counter() - t)
        if i == 0:
            rss = _rss_mib()
            check_result(y, "y", n, 1 << 16)
        del y
    return {"warm_s": times[1:], "first_s": times[0], "peak_rss_mib": rss}


def phase_gradient(tg, root: str, edges: int, budget: str, page_rows: int, **_) -> dict:
    n, path = edges // DEGREE, _store(root, edges)
    t = time.perf_counter()
    built = tg.store.open(path).transpose() is not None
    build_s = time.perf_counter() - t
    drop_page_cache(path)
    g, x = tg.Graph.open(path), tg.store.open(path)["x"]
    layer = _gather_layer(tg)
    with tg.scope(budgets={"host": budget}, page_rows=page_rows), _profile(tg) as prof:
        t = time.perf_counter()
        y, back = tg.vjp(lambda x: layer(graph=g, src={"x": x}), x)
        forward_s = time.perf_counter() - t
        backward_io = _backward_io(tg, path, y, n)
        io, t1 = _io(), time.perf_counter()
        (dx,) = back(y)
        t2 = time.perf_counter()
        rss = _rss_mib()
        stats = dict(_stats(g, prof), block_io=_io_delta(io))
        checked = check_result(dx, "dx", n)
    return {"transpose_build_s": build_s, "built": built, "forward_s": forward_s,
            "backward_s": t2 - t1, "backward_run": stats, "backward_io": backward_io,
            "rows_checked": checked, "peak_rss_mib": rss, "result_tier": dx.tier}


def _backward_io(tg, path: str, y, n: int) -> dict:
    """The backward pass's I/O alone, right before it, on its own files: the transposed
    CSR and the cotangent (the forward's result, on disk past the budget) read cold, the
    gradient's bytes written, both at once (disk_floor.call_io; the pages dropped after)."""
    from disk_floor import call_io
    tops = [os.path.join(tg.store.open(path).vdir, "transpose", a)
            for a in ("row_ptr", "col_idx")]
    if y.tier == "disk":
        tops.append(str(y._storage.path))
    files = sorted(os.path.join(d, f) for top in tops for d, _, names in os.walk(top)
                   for f in names)
    return call_io(files, n * FEATURES * 4, os.path.dirname(path))


def phase_disk(tg, root: str, edges: int, floor_mib: int, **_) -> dict:
    """The disk's bandwidth on the store's own directory (after ingest, before the calls)."""
    from disk_floor import measure as disk_bandwidth
    return dict(disk_bandwidth(os.path.dirname(_store(root, edges)), floor_mib),
                peak_rss_mib=_rss_mib())


def phase_io(tg, root: str, edges: int, **_) -> dict:
    """The forward's I/O with nothing else (disk_floor.call_io): the store's files read cold,
    the result's bytes written, and both at once, on the store's disk before the calls."""
    from disk_floor import call_io
    path = _store(root, edges)
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    return dict(call_io(files, edges // DEGREE * FEATURES * 4, os.path.dirname(path)),
                peak_rss_mib=_rss_mib())


PHASES = {"ingest": phase_ingest, "forward": phase_forward, "memory": phase_memory,
          "gradient": phase_gradient, "disk": phase_disk, "io": phase_io}


def run_phase(args) -> None:
    os.environ.setdefault("TIGA_PROGRESS", "0")
    tg = None
    if args.phase not in ("disk", "io"):      # (the disk's figures need no Tiga)
        import tiga as tg
        tg.config.progress = False
    got = PHASES[args.phase](tg, root=args.root, edges=args.edges, budget=args.budget,
                             page_rows=args.page_rows, reps=args.reps,
                             floor_mib=args.floor_mib)
    print(RESULT + json.dumps(got), flush=True)


# ---------------------------------------------------------------- the driver
def launch(phase: str, root: str, edges: int, budget: str = "512MiB",
           page_rows: int = 65536, reps: int = 1, timeout: int = 3600,
           floor_mib: int = 2048) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--root", root, "--edges", str(edges),
           "--budget", budget, "--page-rows", str(page_rows), "--reps", str(reps),
           "--floor-mib", str(floor_mib)]
    print(f"  {phase:9s} {edges:>13,d} edges ...", end=" ", flush=True)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        print(f"failed ({' | '.join(tail)})")
        return {"error": " | ".join(tail)}
    got = json.loads(lines[-1][len(RESULT):])
    print(f"{time.perf_counter() - t:.1f} s (peak RSS {got['peak_rss_mib']:.0f} MiB)")
    return got


def measure(sizes: list, root: str, a) -> dict:
    """Every phase of every size (`a`: the parsed options), each in its own process."""
    out, reps = {}, a.reps
    for edges in sizes:
        large = edges >= 500_000_000
        budget = BUDGET["large" if large else "small"]
        r = out[str(edges)] = {"budget": budget}
        r["ingest"] = launch("ingest", root, edges)
        if "error" in r["ingest"]:
            continue
        r["disk"] = launch("disk", root, edges, floor_mib=a.floor_mib)
        r["io"] = launch("io", root, edges)
        if not large:     # (first: its uncounted first call compiles the page kernel too)
            r["memory"] = launch("memory", root, edges, reps=reps)
        r["forward"] = launch("forward", root, edges, budget, reps=1 if large else reps)
        for extra in EXTRA_BUDGETS.get(edges, ()) + tuple(a.also_budget or ()):
            r[f"forward {extra}"] = launch("forward", root, edges, extra,
                                           reps=1 if large else reps)
        if edges >= 100_000_000 or a.gradient:
            r["gradient"] = launch("gradient", root, edges, budget)
        if edges == 10_000_000 and not a.no_sweep:
            r["sweep"] = {str(p): launch("forward", root, edges, budget, p, reps)
                          for p in SWEEP}
        shutil.rmtree(os.path.dirname(_store(root, edges)), ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", action="store_true", help="add 1B edges")
    ap.add_argument("--quick", action="store_true", help="1M edges only")
    ap.add_argument("--sizes", type=int, nargs="*", help="edge counts (overrides the above)")
    ap.add_argument("--reps", type=int, default=9,
                    help="forward calls per size: a cold one, then warm ones (reported: their "
                         "median; single warm calls vary by up to 3x on this VM, "
                         "PAGING_NOTES.md)")
    ap.add_argument("--floor-mib", type=int, default=2048,
                    help="MiB written and read back to measure the disk's bandwidth")
    ap.add_argument("--no-sweep", action="store_true", help="skip the 10M page-size sweep")
    ap.add_argument("--gradient", action="store_true",
                    help="the gradient phase below 100M edges too")
    ap.add_argument("--also-budget", nargs="*",
                    help="host budgets of further forward phases at every size")
    ap.add_argument("--note", default="", help="a line for PAGING.md (e.g. the host's load)")
    ap.add_argument("--root", default=os.environ.get("TIGA_BENCH_PAGING_DIR"),
                    help="directory for the stores (default: a temporary one)")
    ap.add_argument("--out", default=str(HERE), help="where results/, plots/ go")
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--edges", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--budget", default="512MiB", help=argparse.SUPPRESS)
    ap.add_argument("--page-rows", type=int, default=65536, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.phase:
        run_phase(a)
        return 0
    sizes = a.sizes or ([1_000_000] if a.quick else
                        [10_000_000, 100_000_000] + ([1_000_000_000] if a.large else []))
    root = a.root or tempfile.mkdtemp(prefix="tiga-paging-")
    os.makedirs(root, exist_ok=True)
    from measure import code_state, machine_info
    from report_paging import write_outputs
    print(f"paging benchmark: stores under {root}")
    try:
        results = measure(sizes, root, a)
    finally:
        if not a.root:
            shutil.rmtree(root, ignore_errors=True)
    run = {"machine": machine_info(int(os.environ.get("TIGA_NUM_THREADS", os.cpu_count()))),
           "code": code_state(str(HERE.parent)), "date": datetime.datetime.now().isoformat(
               timespec="seconds"), "sizes": results,
           "page_cache": "dropped per store file with posix_fadvise(DONTNEED) after ingest",
           "note": a.note}
    print(write_outputs(run, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
