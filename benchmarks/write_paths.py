"""What writing a paged result to disk costs on this machine, by write path (issue 15).

    python benchmarks/write_paths.py                # 800 MiB: the 100M-edge result
    python benchmarks/write_paths.py --mib 80 --gaps 0 1 3

A paged forward whose result exceeds the host budget writes it to the spill directory as
4 MiB chunk files. This script writes the same bytes the same way (a file per chunk, each
renamed into place) along the two paths a writer can take:

  direct     O_DIRECT from one reused aligned buffer: the disk's bandwidth, no page cache
             (what storage/disk does for results and stores)
  cached     ordinary writes into the page cache; each round deletes the previous round's
             files first, as a loop that frees each result before the next call does, so
             the kernel can recycle their pages; `gap` seconds pass between rounds

and, for scale, one in-memory copy of the same bytes (what an in-memory result costs at
most). Each configuration runs in a fresh process (the first cached write of a process
meets memory the kernel has not handed out for a while). Every round's files are read back
and compared (untimed). Writes results/write-paths-*.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHUNK = 4 << 20
RESULT = "RESULT "


def _files(root: Path, data: np.ndarray, direct: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    for k in range(0, len(data), CHUNK):
        tmp, final = root / f".{k // CHUNK}.tmp", root / str(k // CHUNK)
        fd = os.open(tmp, flags, 0o644)
        try:
            view = memoryview(data[k:k + CHUNK])
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
        finally:
            os.close(fd)
        os.replace(tmp, final)


def _check(root: Path, data: np.ndarray) -> None:
    """Every chunk file holds its bytes (untimed): a write path that lost data is no figure."""
    for k in range(0, len(data), CHUNK):
        got = np.fromfile(root / str(k // CHUNK), np.uint8)
        if not np.array_equal(got, data[k:k + CHUNK]):
            raise AssertionError(f"chunk {k // CHUNK} read back differs from what was written")


def one(mode: str, mib: int, rounds: int, gap: float, root: str) -> dict:
    """`rounds` writes of `mib` MiB along `mode`, in this process; seconds per round."""
    # an mmap is page aligned, as O_DIRECT needs, and filled before timing starts
    data = np.frombuffer(mmap.mmap(-1, mib << 20), np.uint8)
    data[:] = np.arange(len(data), dtype=np.uint64).astype(np.uint8)
    times = []
    for r in range(rounds):
        if r and gap:
            time.sleep(gap)
        if mode == "copy":
            t = time.perf_counter()
            out = data.copy()
            times.append(time.perf_counter() - t)
            del out
            continue
        d = Path(tempfile.mkdtemp(dir=root))
        t = time.perf_counter()
        _files(d, data, mode == "direct")
        times.append(time.perf_counter() - t)
        _check(d, data)
        shutil.rmtree(d)       # freed before the next round, as the benchmark loop frees y
    return {"mode": mode, "mib": mib, "gap_s": gap, "seconds": times,
            "gb_per_s": [(mib << 20) / t / 1e9 for t in times]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gaps", type=float, nargs="*", default=[0.0, 3.0])
    ap.add_argument("--root", default=os.environ.get("TIGA_BENCH_PAGING_DIR"),
                    help="a directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="tiga-write-paths-", dir=os.getcwd())
    if args.one:
        got = one(args.one[0], args.mib, args.rounds, float(args.one[1]), root)
        print(RESULT + json.dumps(got), flush=True)
        return 0
    runs = []
    for mode, gap in [("copy", 0.0), ("direct", 0.0)] + [("cached", g) for g in args.gaps]:
        p = subprocess.run([sys.executable, __file__, "--one", mode, str(gap), "--mib",
                            str(args.mib), "--rounds", str(args.rounds), "--root", root],
                           capture_output=True, text=True, check=True)
        got = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)][-1]
                         [len(RESULT):])
        runs.append(got)
        print(f"{mode:7s} gap {gap:4.1f} s: " + ", ".join(f"{t:.3f}" for t in got["seconds"])
              + f" s per {args.mib} MiB (first round first)", flush=True)
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    date = datetime.datetime.now()
    out = Path(args.out) / "results" / f"write-paths-{date:%Y-%m-%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": date.isoformat(timespec="seconds"),
                               "chunk_bytes": CHUNK, "runs": runs}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
