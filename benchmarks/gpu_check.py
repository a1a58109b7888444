"""The GPU check's benchmark driver (issue 29 item 3): every workload of benchmarks/gpu.py,
Tiga then the best peer installed, each side in a worker process this driver can kill, all
within one time budget; writes gpu-check.json and gpu-check.md into --out.

    python benchmarks/gpu_check.py [--out DIR] [--budget SECONDS] [--only a,b] [--dry]

Limits, so that the run never stalls (benchmarks/results/gpu-2026-11-26-h100.txt: a
torch.cdist peer took minutes per call):
- a workload's Tiga side (setup, compile, warm-up, timing) gets --workload-timeout seconds;
- its peer gets --peer-setup seconds to put its data on the device, then PEER_FLOOR_S plus
  10x Tiga's time per call for each warm-up call, and is stopped at once if its warm-up
  calls ran over 10x Tiga's per-call time; then 10x Tiga's time for its timed calls. A
  stopped peer is reported as "stopped: slower than 10x Tiga" with the time it was given;
- a workload that would start with less than MIN_START_S of the budget left is skipped.
A worker that was killed is replaced for the next workload. Without CUDA (and without
--dry / GPU_CHECK_DRY=1) it says so and exits 0.

One more row, "paged-fwd" (issue 28 item 3): a forward over a stored relation opened paged,
its pages streamed through the device tier (benchmarks/gpu_check_paged.py, in a process of
its own stopped after --paged-timeout seconds), against the same call held in memory.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "gpu.py")
sys.path.insert(0, HERE)
import gpu  # noqa: E402  (the workloads; importing it loads numpy only)

PAGED = "paged-fwd"      # the paged row: gpu_check_paged.py, not a gpu.py workload
PAGED_SCRIPT = os.path.join(HERE, "gpu_check_paged.py")
ORDER = ["csr-131k", PAGED, "csr-1m", "attention-fwd-fp16", "edgenn-step", "radius", "knn",
         "csr-32k", "hex-mesh", "attention-fwd-fp32", "attention-step-fp16",
         "attention-step-fp32"]     # the issue's targets first, in case the budget runs out
PEER_FLOOR_S = 3.0      # a peer's one-off first-call costs (library handles, autotuning)
MIN_START_S = 8.0
EARLY_STOP_MS = 20.0    # a warm-up call this slow and over 10x Tiga stops the peer at once
SLOWER = 10.0


class Worker:
    """One `gpu.py --worker` process in a session of its own, its events read by a thread."""

    def __init__(self, log):
        cmd = [sys.executable, WORKER, "--worker"] + (["--dry"] if gpu.DRY else [])
        root = os.path.dirname(HERE)   # (tiga from this checkout, installed or not)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, text=True, start_new_session=True, cwd=HERE,
                                     env=env)
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:   # (a library printing to stdout)
                continue
        self.events.put(None)

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def next(self, deadline: float):
        """The next event, or None at the deadline or when the worker died."""
        try:
            return self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def kill(self) -> None:
        """The worker's whole session (it started it, so its children are in it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Pool:
    """A live worker per side; a killed one is replaced when next asked for."""

    def __init__(self, log):
        self.log, self.workers = log, {}

    def get(self, side: str) -> Worker:
        w = self.workers.get(side)
        if w is None or w.proc.poll() is not None:
            w = self.workers[side] = Worker(self.log)
        return w

    def kill(self, side: str) -> None:
        w = self.workers.pop(side, None)
        if w is not None:
            w.kill()

    def close(self) -> None:
        for side in list(self.workers):
            w = self.workers.pop(side)
            w.proc.stdin.close()
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()


def run_tiga(pool: Pool, cmd: dict, limit: float) -> dict:
    w = pool.get("tiga")
    w.send(cmd)
    deadline = time.monotonic() + limit
    while True:
        ev = w.next(deadline)
        if ev is None:
            pool.kill("tiga")
            return {"status": f"tiga: no result within {limit:.0f} s (stopped)"}
        if ev["event"] in ("done", "error"):
            return ev


def run_peer(pool: Pool, cmd: dict, setup_s: float, tiga_ms: float) -> dict:
    """The peer side under the 10x rule (module docstring)."""
    w = pool.get("peer")
    w.send(cmd)
    per_call = SLOWER * tiga_ms / 1e3
    deadline, phase, name = time.monotonic() + setup_s, "setup", None
    while True:
        ev = w.next(deadline)
        if ev is None:
            pool.kill("peer")
            if phase == "setup":
                return {"peer": name, "peer_status": f"peer: no data on the device within "
                                                     f"{setup_s:.0f} s"}
            return {"peer": name, "peer_status": f"stopped: slower than {SLOWER:.0f}x Tiga "
                                                 f"({phase} ran past {per_call * 1e3:.3g} "
                                                 "ms per call)"}
        if ev["event"] == "ready":
            phase, name = "warm-up", ev.get("peer")
            deadline = time.monotonic() + PEER_FLOOR_S + per_call * (cmd["warmup"] + 1)
        elif ev["event"] == "warm":
            est = ev.get("est_ms", 0.0)   # (one synchronised call: launch latency in it)
            if est > SLOWER * tiga_ms and est > EARLY_STOP_MS and not gpu.DRY:
                pool.kill("peer")
                return {"peer": name, "peer_status": f"stopped: slower than {SLOWER:.0f}x "
                                                     f"Tiga (warm-up call {ev['est_ms']:.3g} "
                                                     "ms)"}
            phase = "timing"
            deadline = time.monotonic() + PEER_FLOOR_S + per_call * (cmd["repeat"] + 2)
        elif ev["event"] in ("done", "error"):
            return ev


def run_workload(pool: Pool, name: str, args, tmp: str, end: float) -> dict:
    row = {"workload": name, "size": gpu.size_text(name)}
    left = end - time.monotonic()
    if left < MIN_START_S:
        return dict(row, status=f"skipped: {max(0.0, left):.0f} s of the budget left")
    save = os.path.join(tmp, f"{name}.npy")
    cmd = {"workload": name, "warmup": args.warmup, "repeat": args.repeat}
    ev = run_tiga(pool, dict(cmd, side="tiga", save=save), min(args.workload_timeout, left))
    if ev.get("event") != "done":
        return dict(row, status=ev.get("status") or "tiga failed", error=ev.get("error"))
    row["tiga_ms"], row["tiga_calls"] = ev["ms"], ev.get("calls")
    left = end - time.monotonic()
    if left < 1.0:
        return dict(row, status="ok", peer_status="skipped: budget spent")
    ev = run_peer(pool, dict(cmd, side="peer", compare=save),
                  min(args.peer_setup, left), row["tiga_ms"])
    row["status"] = "ok"
    if ev.get("event") == "error":
        row["peer_status"], row["error"] = "peer failed", ev["error"]
    elif ev.get("event") == "done" and ev.get("peer") is None:
        row["peer_status"] = ev.get("why", "no peer")
    elif ev.get("event") == "done":
        row.update(peer=ev["peer"], peer_ms=ev["ms"], peer_calls=ev.get("calls"),
                   speedup=ev["ms"] / row["tiga_ms"],
                   max_abs_diff=ev.get("max_abs_diff"), scale=ev.get("scale"),
                   peer_status="ok")
    else:
        row.update(ev)
    if os.path.exists(save):
        os.remove(save)
    return row


def run_paged(args, end: float) -> dict:
    """The paged row: gpu_check_paged.py in a session of its own, killed at its limit."""
    row = {"workload": PAGED, "size": "stored CSR, paged through the device tier"}
    left = end - time.monotonic()
    if left < MIN_START_S:
        return dict(row, status=f"skipped: {max(0.0, left):.0f} s of the budget left")
    limit = min(args.paged_timeout, left)
    root = os.path.dirname(HERE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, PAGED_SCRIPT] + (["--dry"] if gpu.DRY else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=HERE, env=env)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return dict(row, status=f"tiga: no result within {limit:.0f} s (stopped)")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    ev = json.loads(lines[-1]) if lines else {"event": "error", "error": err[-2000:]}
    if ev.get("event") != "done":
        return dict(row, status="tiga failed", error=ev.get("error"))
    return dict(row, status="ok", peer_status="ok", size=ev["size"], tiga_ms=ev["ms"],
                peer=ev["peer"], peer_ms=ev["peer_ms"], speedup=ev["speedup"],
                max_abs_diff=ev["max_abs_diff"], scale=ev["scale"],
                **{k: ev[k] for k in ("pages", "route", "tier", "bytes_to_device",
                                      "bytes_from_device")})


def versions() -> dict:
    """Package versions (metadata, nothing imported) and the device as nvidia-smi names it."""
    from importlib import metadata

    out = {"python": sys.version.split()[0], "dry": gpu.DRY}
    for name in ("torch", "triton", "numpy", "torch_geometric", "torch_cluster",
                 "torch_sparse", "cuda-python", "hypothesis"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        out["device"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        ).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        out["device"] = None
    if gpu.DRY:
        out["device"] = "cpu (GPU_CHECK_DRY: triton-interpreter, tiny sizes; timings mean nothing)"
    return out


def _fmt(v, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def markdown(report: dict) -> str:
    v = report["versions"]
    lines = [f"# GPU check: {v.get('device')}", "",
             f"torch {v.get('torch')}, triton {v.get('triton')}, torch_geometric "
             f"{v.get('torch_geometric')}, torch_cluster {v.get('torch_cluster')}; "
             f"tests: {report.get('tests') or 'not run'}; {report['elapsed_s']:.0f} s", "",
             "| workload | size | Tiga ms | peer | peer ms | speedup | max abs diff | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        status = r.get("status", "")
        if r.get("peer_status") not in (None, "ok"):
            status += f"; {r['peer_status']}"
        diff = None if r.get("max_abs_diff") is None else \
            f"{r['max_abs_diff']:.2e} (of {_fmt(r.get('scale'), '.2g')})"
        lines.append(f"| {r['workload']} | {r['size']} | {_fmt(r.get('tiga_ms'))} | "
                     f"{r.get('peer') or '–'} | {_fmt(r.get('peer_ms'))} | "
                     f"{_fmt(r.get('speedup'), '.2f')}{'x' if r.get('speedup') else ''} | "
                     f"{diff or '–'} | {status} |")
    return "\n".join(lines) + "\n"


def _tests_summary(path: str | None) -> str | None:
    """The last line of the pytest log (its summary), where there is one."""
    if not path or not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    return tail[-1].strip("= ") if tail else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for every workload")
    ap.add_argument("--only", default=",".join(ORDER), help="workloads, comma-separated")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--workload-timeout", type=float, default=300.0 if gpu.DRY else 45.0,
                    help="seconds for a workload's Tiga side (compile included)")
    ap.add_argument("--peer-setup", type=float, default=30.0)
    ap.add_argument("--paged-timeout", type=float, default=120.0 if gpu.DRY else 90.0,
                    help="seconds for the paged row (store, compile, calls)")
    ap.add_argument("--tests-log", default=None, help="the pytest log to summarise")
    ap.add_argument("--dry", action="store_true", help="= GPU_CHECK_DRY=1 (CPU, tiny sizes)")
    args = ap.parse_args(argv)
    if not gpu.DRY and not _cuda():
        print("benchmarks/gpu_check.py: skipped: no CUDA device (GPU_CHECK_DRY=1 checks the "
              "plumbing on CPU)")
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(gpu.NAMES) - {PAGED})
    if unknown:
        ap.error(f"--only: unknown workload(s) {', '.join(unknown)}; known: "
                 f"{', '.join(gpu.NAMES + [PAGED])}")
    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    end = start + args.budget
    report = {"versions": versions(), "args": vars(args), "rows": []}
    with open(os.path.join(args.out, "workers.log"), "a") as log, \
            tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        pool = Pool(log)
        try:
            for name in names:
                row = run_paged(args, end) if name == PAGED else \
                    run_workload(pool, name, args, tmp, end)
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
        finally:
            pool.close()
    report["elapsed_s"] = time.monotonic() - start
    report["tests"] = _tests_summary(args.tests_log)
    with open(os.path.join(args.out, "gpu-check.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out, "gpu-check.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r.get("status") == "ok" for r in report["rows"]) else 1


def _cuda() -> bool:
    """Whether a CUDA device answers (asked in a subprocess: this driver never imports
    torch, so it holds no CUDA context while the workers time)."""
    if "torch" in sys.modules:   # (a caller that imported it: a test)
        return bool(sys.modules["torch"].cuda.is_available())
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if __name__ == "__main__":
    sys.exit(main())
