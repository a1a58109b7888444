"""Tiga benchmark harness: every workload x every installed peer, one fresh process each.

    python benchmarks/run.py                      # full run: results/, history.csv, RESULTS.md
    python benchmarks/run.py --quick --out /tmp/b # smoke run: smallest size, 1-2 repeats
    python benchmarks/run.py --compare HEAD~3     # also Tiga at HEAD~3, interleaved

Each configuration (workload, size, implementation) runs `worker.py` in a new interpreter with
equal thread counts for every library, torch's allocator on huge pages, its outputs checked
against a float64 oracle outside the timer. Configurations run in a seeded random order
(printed; `--seed` repeats it). Ctrl-C stops the running worker and writes what finished.
"""
from __future__ import annotations

import argparse
import atexit
import csv
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
import measure as M  # noqa: E402
import report  # noqa: E402
import workloads as W  # noqa: E402

RESULT_TAG = "@@BENCH-RESULT "


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smallest size of each workload, 1 warm-up, 2 timed calls")
    p.add_argument("--workloads", nargs="+", default=None,
                   help="names or families (e.g. stored_csr, edge_nn.step); see --list")
    p.add_argument("--sizes", nargs="+", type=int, default=None, help="only these sizes")
    p.add_argument("--peers", nargs="+", default=None, help="only these peers ('tiga' too)")
    p.add_argument("--threads", type=int, default=2, help="every library's thread count")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeat", type=int, default=15, help="timed calls at most (3 at least)")
    p.add_argument("--budget", type=float, default=3.0,
                   help="seconds of timed calls after which a configuration stops repeating")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    p.add_argument("--rounds", type=int, default=1, help="runs of every configuration")
    p.add_argument("--seed", type=int, default=None, help="order seed (default: random)")
    p.add_argument("--compare", metavar="REV", default=None,
                   help="also run Tiga as of git REV (a temporary worktree), interleaved")
    p.add_argument("--out", default=None, help="directory for results/, history.csv, "
                   "RESULTS.md and plots/ (default: benchmarks/; --quick: a temp dir)")
    p.add_argument("--list", action="store_true", help="list workloads and peers, then exit")
    a = p.parse_args(argv)
    if a.quick:
        a.warmup, a.repeat, a.budget = min(a.warmup, 1), min(a.repeat, 2), min(a.budget, 1.0)
        a.timeout = min(a.timeout, 180.0)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(10**6)
    return a


# ---------------------------------------------------------------- configurations
def _selected(name: str, wanted: list | None) -> bool:
    return wanted is None or any(name == w or name.startswith(w + ".") for w in wanted)


def build_configs(a, reg: dict, impls: list) -> tuple[list, list]:
    """(configurations to run, results known without running: peer not installed, size over
    the peer's limit). impls: [(label, rev or None)] of Tiga trees."""
    todo, known = [], []
    for wl in reg.values():
        if not _selected(wl.name, a.workloads):
            continue
        sizes = [s for s in (wl.quick() if a.quick else wl.sizes)
                 if a.sizes is None or s in a.sizes]
        for size in sizes:
            for name, peer in wl.peers.items():
                if a.peers is not None and name not in a.peers:
                    continue
                base = {"workload": wl.name, "size": size, "peer": name}
                missing = W.installed(peer)
                if missing or (peer.max_size is not None and size > peer.max_size):
                    why = (f"{missing} is not installed" if missing else
                           f"not run above {wl.size_label} = {peer.max_size}")
                    known.append({**base, "impl": name, "rev": None,
                                  "status": "skipped" if missing else "n/a", "reason": why})
                    continue
                for label, rev in (impls if peer.tiga else [(name, None)]):
                    if peer.tiga and name != "tiga":   # several Tiga peers (paged, in-memory)
                        label = name if rev is None else f"{name}@{rev}"
                    for rnd in range(a.rounds):
                        todo.append({**base, "impl": label, "rev": rev, "round": rnd})
    return todo, known


def spec_of(cfg: dict, a, reg: dict) -> dict:
    """The worker's spec; a workload may cap the warm-ups (seconds-long calls)."""
    warmup = min(a.warmup, reg[cfg["workload"]].extra.get("warmup", a.warmup))
    return {"workload": cfg["workload"], "size": cfg["size"], "peer": cfg["peer"],
            "threads": a.threads, "warmup": warmup, "repeat": a.repeat,
            "budget_s": a.budget}


def label(cfg: dict) -> str:
    return f"{cfg['workload']}/{cfg['size']}/{cfg['impl']}"


# ---------------------------------------------------------------- processes
def run_worker(spec: dict, env: dict, timeout: float) -> dict:
    """One worker in its own session (a terminal Ctrl-C reaches only this process, which then
    kills the worker's group by id); its tagged result line, or why there is none."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, os.path.join(BENCH_DIR, "worker.py"),
                             json.dumps(spec)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return {"status": "timeout", "reason": f"over {timeout:.0f} s"}
    except BaseException:   # KeyboardInterrupt included: never leave a worker running
        _kill(proc)
        raise
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_TAG):
            return {**json.loads(line[len(RESULT_TAG):]),
                    "process_wall_s": time.perf_counter() - t0}
    tail = [ln for ln in (err or "").splitlines() if ln.strip()][-1:]
    return {"status": "error", "reason": f"exit {proc.returncode}: {tail}"[:500]}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_all(todo: list, a, envs: dict, reg: dict) -> tuple[list, bool]:
    from tqdm import tqdm

    results = []
    bar = tqdm(todo, desc="bench", unit="cfg", file=sys.stderr, dynamic_ncols=True)
    try:
        for cfg in bar:
            bar.set_postfix_str(label(cfg))
            res = run_worker(spec_of(cfg, a, reg), envs[cfg["impl"]], a.timeout)
            results.append({**cfg, **res})
            if res.get("status") != "ok":
                bar.write(f"{label(cfg)}: {res.get('status')} {res.get('reason', '')}"[:300])
    except KeyboardInterrupt:
        bar.close()
        sys.stderr.write("\ninterrupted: worker stopped; writing the finished results\n")
        return results, True
    bar.close()
    return results, False


# ---------------------------------------------------------------- Tiga trees
def add_worktree(rev: str) -> tuple[str, str]:
    """A detached worktree of `rev` in a temp dir (removed at exit): (its path, short sha)."""
    sha = M.git(ROOT, "rev-parse", "--short", f"{rev}^{{commit}}")
    if not sha:
        raise SystemExit(f"--compare: {rev!r} does not name a commit of {ROOT}")
    path = os.path.join(tempfile.mkdtemp(prefix="tiga-bench-rev-"), "tree")
    res = subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"--compare: git worktree add failed: {res.stderr.strip()}")

    def remove() -> None:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path],
                       capture_output=True)
        subprocess.run(["git", "-C", ROOT, "worktree", "prune"], capture_output=True)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    atexit.register(remove)
    return path, sha


def tiga_trees(a, cache_root: str) -> tuple[list, dict]:
    """[(impl label, rev)] and impl label -> (PYTHONPATH, TIGA_CACHE_DIR)."""
    if a.compare is None:
        return [("tiga", None)], {"tiga": (ROOT, os.path.join(cache_root, "worktree"))}
    path, sha = add_worktree(a.compare)
    old = f"tiga@{sha}"
    return ([("tiga@worktree", None), (old, sha)],
            {"tiga@worktree": (ROOT, os.path.join(cache_root, "worktree")),
             old: (path, os.path.join(cache_root, sha))})


# ---------------------------------------------------------------- output
def out_dir(a) -> str:
    if a.out:
        return os.path.abspath(a.out)
    if a.quick:
        return tempfile.mkdtemp(prefix="tiga-bench-quick-")
    return BENCH_DIR


def append_history(path: str, run: dict) -> None:
    """One row per finished configuration: date, commit, workload, size, peer, median_ms."""
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["date", "commit", "workload", "size", "peer", "median_ms"])
        for r in run["results"]:
            if r.get("status") == "ok":
                w.writerow([run["date"], run["code"]["short"], r["workload"], r["size"],
                            r["impl"], f"{r['median_ms']:.4g}"])


def workload_meta(reg: dict, names: set) -> dict:
    return {n: {"title": wl.title, "description": wl.description, "size_label": wl.size_label,
                "dtype": wl.dtype, "sizes": list(wl.sizes),
                "peers": {p: peer.note for p, peer in wl.peers.items()}}
            for n, wl in reg.items() if n in names}


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt   # SIGTERM like Ctrl-C: stop the worker, write, remove worktrees


def main(argv=None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    reg = W.registry()
    if a.list:
        for wl in reg.values():
            print(f"{wl.name:20s} sizes {wl.sizes}  peers {', '.join(wl.peers)}")
        return 0
    cache_root = tempfile.mkdtemp(prefix="tiga-bench-cache-")
    atexit.register(shutil.rmtree, cache_root, True)
    impls, trees = tiga_trees(a, cache_root)
    todo, known = build_configs(a, reg, impls)
    random.Random(a.seed).shuffle(todo)
    print(f"{len(todo)} configurations, order seed {a.seed} (--seed {a.seed} repeats it)",
          file=sys.stderr)
    tree_of = {rev: label for label, rev in impls}   # a config's Tiga tree follows its rev
    envs = {cfg["impl"]: M.child_env(a.threads, *trees[tree_of.get(cfg["rev"], impls[0][0])])
            for cfg in todo}
    t0 = time.time()
    results, interrupted = run_all(todo, a, envs, reg)
    run = {"schema": 1, "date": datetime.date.today().isoformat(),
           "started": datetime.datetime.fromtimestamp(t0).isoformat(timespec="seconds"),
           "wall_s": round(time.time() - t0, 1), "code": M.code_state(ROOT),
           "machine": M.machine_info(a.threads), "seed": a.seed, "interrupted": interrupted,
           "settings": {k: v for k, v in vars(a).items() if k != "list"},
           "compare": None if a.compare is None else {"rev": a.compare, "impl": impls[1][0]},
           "order": [label(c) for c in todo],
           "workloads": workload_meta(reg, {c["workload"] for c in todo + known}),
           "results": results + known}
    dest = out_dir(a)
    os.makedirs(os.path.join(dest, "results"), exist_ok=True)
    stem = f"run-{run['date']}-{run['code']['short']}{'-quick' if a.quick else ''}"
    name, k = f"{stem}.json", 1
    while os.path.exists(os.path.join(dest, "results", name)):   # never overwrite a run
        k += 1
        name = f"{stem}-{k}.json"
    path = os.path.join(dest, "results", name)
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
    append_history(os.path.join(dest, "history.csv"), run)
    md = report.write_report(run, dest, f"results/{name}")
    print(report.standing_text(run))
    print(f"\nresults: {path}\nreport: {md}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
