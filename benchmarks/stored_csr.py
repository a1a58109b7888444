"""benchmarks: the report's stored-CSR workload, y[i] = sum_e w_e * x[col_e], against peers.

Degree 32, 32 float32 features, N = 8192 / 32768 / 131072; forward and forward+backward
(gradients of y.sum() w.r.t. x and w). Each (peer, mode, N) runs in a fresh process; see
_harness.py. Usage: python benchmarks/stored_csr.py [--quick] [--sizes ...] [--threads 2]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

DEGREE, FEATURES, SEED = 32, 32, 0
SIZES = (8192, 32768, 131072)
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ---------------------------------------------------------------- peers (run in the child)
def _torch(threads):
    import torch
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # beta / invariant-check notes
    return torch


def peer_scipy(d, mode, threads):
    import scipy.sparse as sp
    if mode != "fwd":
        return None  # scipy has no autograd; a hand-written VJP would not be the same peer
    a = sp.csr_matrix((d["w"], d["col"], d["row_ptr"]), shape=(d["n"], d["n"]))
    return lambda: a @ d["x"]


def _torch_sparse(layout):
    def peer(d, mode, threads):
        torch = _torch(threads)
        n, rp, col = d["n"], torch.from_numpy(d["row_ptr"]), torch.from_numpy(d["col"])
        x, w = torch.from_numpy(d["x"]), torch.from_numpy(d["w"])
        rows = torch.repeat_interleave(torch.arange(n), DEGREE)
        coo = torch.stack([rows, col])

        def matrix(values):
            if layout == "csr":
                return torch.sparse_csr_tensor(rp, col, values, (n, n))
            return torch.sparse_coo_tensor(coo, values, (n, n), is_coalesced=True)
        if mode == "fwd":
            a = matrix(w)
            return lambda: torch.sparse.mm(a, x)
        return _autograd(torch, x, w, lambda xx, ww: torch.sparse.mm(matrix(ww), xx))
    return peer


def peer_index_add(d, mode, threads):
    torch = _torch(threads)
    n = d["n"]
    col = torch.from_numpy(d["col"])
    dst = torch.repeat_interleave(torch.arange(n), DEGREE)
    x, w = torch.from_numpy(d["x"]), torch.from_numpy(d["w"])

    def f(xx, ww):
        msg = xx.index_select(0, col) * ww.unsqueeze(1)
        return torch.zeros(n, xx.shape[1], dtype=xx.dtype).index_add_(0, dst, msg)
    return (lambda: f(x, w)) if mode == "fwd" else _autograd(torch, x, w, f)


def peer_pyg(d, mode, threads):
    torch = _torch(threads)
    from torch_geometric.nn import MessagePassing

    class WeightedSum(MessagePassing):
        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, x=x, w=w)

        def message(self, x_j, w):
            return x_j * w.unsqueeze(-1)

    n = d["n"]
    dst = torch.repeat_interleave(torch.arange(n), DEGREE)
    ei = torch.stack([torch.from_numpy(d["col"]), dst])  # PyG: row 0 source, row 1 target
    m, x, w = WeightedSum(), torch.from_numpy(d["x"]), torch.from_numpy(d["w"])
    f = lambda xx, ww: m(xx, ei, ww)
    return (lambda: f(x, w)) if mode == "fwd" else _autograd(torch, x, w, f)


def _autograd(torch, x, w, f):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step():
        xr.grad = wr.grad = None
        f(xr, wr).sum().backward()
        return xr.grad, wr.grad
    return step


def _tiga_module():
    import tiga as tg

    class WeightedSum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x * edge.w
    return tg, WeightedSum()


def peer_tiga(d, mode, threads):
    tg, m = _tiga_module()
    g = tg.Graph.from_csr(d["row_ptr"], d["col"], num_src=d["n"])
    x, w = d["x"], d["w"]
    call = lambda xx, ww: m(graph=g, src={"x": xx}, dst={}, edge={"w": ww})
    d["explain"] = str(m.explain(graph=g, src={"x": x}, dst={}, edge={"w": w}))
    if mode == "fwd":
        return lambda: call(x, w)
    grad = tg.grad(lambda xx, ww: call(xx, ww).sum(), argnums=(0, 1))
    try:  # the route of the whole gradient program, not only of the forward propagate
        d["explain"] = str(tg.jit(grad).lower(x, w).compile().explain())
    except Exception as e:  # noqa: BLE001 - keep the forward explanation, say why
        d["explain"] += f"\n(gradient program not explainable through tg.jit: {e!r})"
    return lambda: grad(x, w)


PEERS = {"scipy-csr": peer_scipy, "torch-sparse-csr": _torch_sparse("csr"),
         "torch-sparse-coo": _torch_sparse("coo"), "torch-index_add": peer_index_add,
         "pyg": peer_pyg, "tiga": peer_tiga}


# ---------------------------------------------------------------- child entry points
def _check(d, mode, out) -> float:
    """Max relative error against a float64 oracle built here with numpy (outside the timing)."""
    import scipy.sparse as sp
    x64, w64, col = d["x"].astype(np.float64), d["w"].astype(np.float64), d["col"]
    if mode == "fwd":
        a64 = sp.csr_matrix((w64, col, d["row_ptr"]), shape=(d["n"], d["n"]))
        got, refs = [_host(out)], [a64 @ x64]
    else:  # d(sum y)/dx[s, :] = sum of w over edges reading s; d(sum y)/dw_e = sum_f x[col_e, f]
        gx = np.bincount(col, weights=w64, minlength=d["n"])[:, None] * np.ones(x64.shape[1])
        got, refs = [_host(o) for o in out], [gx, x64.sum(1)[col]]
    return max(float(np.abs(g.reshape(r.shape) - r).max() / max(1.0, np.abs(r).max()))
               for g, r in zip(got, refs))


def _host(t):
    return t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)


def child_run(spec: dict) -> dict:
    peer, mode, n, threads = spec["peer"], spec["mode"], spec["n"], spec["threads"]
    if peer == "pyg":
        try:
            import torch_geometric  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure means "not installable here"
            return {"status": "skipped", "reason": f"torch_geometric does not import: {e}"}
    rp, col, w, x = H.make_csr(n, DEGREE, FEATURES, SEED)
    if spec.get("x_align"):
        raw = np.empty(x.nbytes + spec["x_align"], np.uint8)
        start = -raw.ctypes.data % spec["x_align"]
        x_aligned = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
        x_aligned[...] = x
        x = x_aligned
    d = {"n": n, "row_ptr": rp, "col": col, "w": w, "x": x}
    fn = PEERS[peer](d, mode, threads)
    if fn is None:
        return {"status": "n/a", "reason": f"{peer} has no {mode} path"}
    mem = H.PeakRSS()
    mem.start()  # the first call pays one-time costs (JIT compile, caches): measured apart
    t0 = time.perf_counter()
    first = fn()
    first_ms = (time.perf_counter() - t0) * 1e3
    first_peak = mem.stop()
    err = _check(d, mode, first)
    del first
    mem.start()
    timing = H.time_calls(fn, spec["warmup"], spec["repeat"], spec["budget_s"])
    peak = mem.stop()
    res = {**timing, "rel_err": err, "first_call_ms": first_ms,
           "peak_rss_first_call_bytes": first_peak, "peak_rss_delta_bytes": peak,
           "peak_rss_method": mem.method,
           "numpy_traced_peak_bytes": H.traced_peak_bytes(fn),
           "loadavg_1min": os.getloadavg()[0],  # other work on the machine skews timings
           # a 128-byte row starting mid cache line spans three lines: gathers cost more
           "x_offset_in_cache_line": int(x.ctypes.data % 64)}
    if "explain" in d:
        res["explain"] = d["explain"]
        res["route"] = d["explain"].splitlines()[0].split(":", 1)[1].strip()
    return res


def child_firstcall(spec: dict) -> dict:
    """First-call latency: trace + lower + compile + run, in a process whose TIGA_CACHE_DIR the
    parent chose (empty for the cold run, reused for the warm run)."""
    t0 = time.perf_counter()
    tg, m = _tiga_module()
    t_import = time.perf_counter() - t0
    n = spec["n"]
    rp, col, w, x = H.make_csr(n, DEGREE, FEATURES, SEED)
    g = tg.Graph.from_csr(rp, col, num_src=n)
    call = lambda xx, ww: m(graph=g, src={"x": xx}, dst={}, edge={"w": ww})
    out = {"import_s": t_import, "cache_dir": os.environ.get("TIGA_CACHE_DIR")}
    grad = tg.grad(lambda a, b: call(a, b).sum(), argnums=(0, 1))
    for key, f in (("fwd", lambda: call(x, w)), ("fwdbwd", lambda: grad(x, w))):
        t0 = time.perf_counter()
        f()
        out[f"{key}_first_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        f()
        out[f"{key}_second_ms"] = (time.perf_counter() - t0) * 1e3
    ex = str(m.explain())
    out["explain"] = ex
    out["route"] = ex.splitlines()[0].split(":", 1)[1].strip()
    return out


def child_calibrate(spec: dict) -> dict:
    return {"bandwidth": H.measure_bandwidth(), "sgemm": H.measure_sgemm()}


# ---------------------------------------------------------------- parent
def bytes_moved(n: int, mode: str) -> int:
    """Compulsory traffic: every array read or written once per pass (int64 indices, float32
    values); random re-reads of x rows that miss cache are NOT counted, so this is a lower
    bound. Backward re-reads the index, w and x, reads dy, writes dx and dw."""
    e, f = n * DEGREE, FEATURES
    fwd = 8 * (n + 1) + 8 * e + 4 * e + 4 * n * f + 4 * n * f
    if mode == "fwd":
        return fwd
    return fwd + 8 * (n + 1) + 8 * e + 4 * e + 4 * n * f + 4 * n * f + 4 * n * f + 4 * e


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--repeat", type=int, default=20, help="timed calls per config (max)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per config")
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over all configs; each config reports its best round")
    p.add_argument("--quick", action="store_true", help="repeat 5, warmup 1")
    p.add_argument("--x-align", type=int, default=0, choices=[0, 64],
                   help="64: every peer reads x from a 64-byte aligned copy (torch's own "
                        "allocator aligns so); 0: where numpy put it (16-byte aligned, so "
                        "each process draws its own offset within the cache line)")
    p.add_argument("--out", default=None, help="JSON path (default results/stored_csr-<date>)")
    p.add_argument("--render", default=None, help="print the tables of a saved JSON and exit")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.repeat, a.warmup = min(a.repeat, 5), min(a.warmup, 1)
    return a


def _argv(spec: dict) -> list:
    return [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]


def build_jobs(a) -> list:
    base = {"threads": a.threads, "warmup": a.warmup, "repeat": a.repeat,
            "budget_s": a.timeout * 0.4, "x_align": a.x_align}
    jobs = [("calibrate", _argv({**base, "kind": "calibrate"}))]
    for mode in a.modes:
        for n in a.sizes:
            for peer in a.peers:
                if peer == "scipy-csr" and mode != "fwd":
                    continue
                spec = {**base, "kind": "run", "peer": peer, "mode": mode, "n": n}
                jobs.append((f"{mode}/{n}/{peer}", _argv(spec)))
    return jobs


def first_call_jobs(a) -> list:
    spec = {"kind": "firstcall", "n": min(a.sizes), "threads": a.threads}
    return [(f"firstcall/{tag}", _argv(spec)) for tag in ("cold-cache", "warm-cache")]


def run_first_calls(a, env: dict) -> tuple[list, bool]:
    cache = tempfile.mkdtemp(prefix="tiga-bench-cache-")
    try:  # both processes share one cache dir: the first fills it, the second reads it
        return H.run_all(first_call_jobs(a), a.timeout, {**env, "TIGA_CACHE_DIR": cache},
                         desc="first-call")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def report_tables(results: list) -> str:
    runs = [r for r in results if r["label"].count("/") == 2]
    out = []
    for mode in ("fwd", "fwdbwd"):
        rows = []
        for n in sorted({int(r["label"].split("/")[1]) for r in runs}):
            group = [r for r in runs if r["label"].startswith(f"{mode}/{n}/")]
            ok = [r for r in group if r.get("status") == "ok"]
            peers = [r for r in ok if not r["label"].endswith("/tiga")]
            best = min((r["median_ms"] for r in peers), default=None)
            for r in group:
                rows.append(_row(r, n, mode, best))
        if rows:
            title = ("forward" if mode == "fwd"
                     else "forward + backward (grad of y.sum() w.r.t. x, w)")
            out.append(f"### {title}\n\n" + H.markdown_table(
                ["N", "impl", "median ms", "min–max ms", "reps", "peak ΔRSS MiB 1st / steady",
                 "numpy-traced MiB", "÷ fastest peer", "GB/s (compulsory)", "load"], rows))
    return "\n\n".join(out)


def _row(r, n, mode, best):
    peer = r["label"].split("/")[2]
    if r.get("status") != "ok":
        lines = [ln for ln in r.get("stderr_tail", "").splitlines() if ln.strip()]
        why = r.get("reason") or (lines[-1][-140:] if lines else "")
        why = why.replace("|", "/")
        return [n, peer, r.get("status"), why, "", "", "", "", "", ""]
    ratio = f"{r['median_ms'] / best:.2f}×" if best else "–"
    gbps = bytes_moved(n, mode) / (r["median_ms"] * 1e-3) / 1e9
    name = f"{peer} [{r['route'].split()[0]}]" if "route" in r else peer
    mib = lambda key: f"{r[key] / 2**20:.0f}"
    return [n, name, f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}–{r['max_ms']:.2f}", r["reps"],
            f"{mib('peak_rss_first_call_bytes')} / {mib('peak_rss_delta_bytes')}",
            f"{r['numpy_traced_peak_bytes'] / 2**20:.1f}", ratio, f"{gbps:.2f}",
            f"{r['loadavg_1min']:.1f}"]


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child is not None:
        spec = json.loads(a.child)
        kind = spec.pop("kind")
        fn = {"run": child_run, "firstcall": child_firstcall, "calibrate": child_calibrate}[kind]
        H.child_report(fn(spec))
        return 0
    if a.render:
        with open(a.render) as f:
            saved = json.load(f)
        print(summary(saved["results"], saved["machine"], argparse.Namespace(**saved["settings"])))
        return 0
    env = H.thread_env(a.threads)
    machine = H.machine_info(a.threads)
    machine["code"] = H.code_state(os.path.dirname(RESULTS_DIR) + "/..")
    raw, interrupted = [], False
    for rnd in range(a.rounds):  # whole passes, so a burst of other work hits one round only
        res, interrupted = H.run_all(build_jobs(a), a.timeout, env,
                                     desc=f"stored-csr {rnd + 1}/{a.rounds}")
        if not interrupted and "tiga" in a.peers:
            more, interrupted = run_first_calls(a, env)
            res += more
        raw += [{**r, "round": rnd} for r in res]
        if interrupted:
            break
    results = H.best_of_rounds(raw)
    date = datetime.date.today().isoformat()
    name = f"stored_csr-{date}{'-quick' if a.quick else ''}.json"
    path = a.out or os.path.join(RESULTS_DIR, name)
    settings = {k: v for k, v in vars(a).items() if k != "child"}
    H.write_json(path, {"workload": {"degree": DEGREE, "features": FEATURES, "seed": SEED,
                                     "dtype": "float32", "index_dtype": "int64"},
                        "settings": settings, "machine": machine, "interrupted": interrupted,
                        "results": results, "all_rounds": raw if a.rounds > 1 else None})
    print(summary(results, machine, a))
    print(f"\nresults: {path}")
    return 130 if interrupted else 0


def summary(results: list, machine: dict, a) -> str:
    lines = [f"machine: {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, "
             f"threads used {a.threads}; best of {getattr(a, 'rounds', 1)} round(s) per config; "
             f"caches {machine.get('caches')}; "
             f"load average at start {machine.get('loadavg_at_start')}; "
             f"versions {machine['versions']}"]
    cal = next((r for r in results if r["label"] == "calibrate" and r.get("status") == "ok"), None)
    if cal:
        bw, mm = cal["bandwidth"], cal["sgemm"]
        lines.append(f"numpy copy 256 MiB: {bw['read_write_GBps']:.1f} GB/s read+write "
                     f"({bw['copy_GBps']:.1f} GB/s copied); "
                     f"sgemm 2048^3: {mm['GFLOPs']:.0f} GFLOP/s")
    lines.append("")
    lines.append(report_tables(results))
    fc = [r for r in results if r["label"].startswith("firstcall/")]
    if fc:
        rows = [[r["label"].split("/")[1], r.get("route", r.get("status")),
                 *(f"{r[k]:.1f}" if k in r else "–" for k in
                   ("fwd_first_ms", "fwd_second_ms", "fwdbwd_first_ms", "fwdbwd_second_ms")),
                 f"{r['import_s'] * 1e3:.0f}" if "import_s" in r else "–"] for r in fc]
        lines.append(f"\n### Tiga first call, N = {min(a.sizes)}\n\n" + H.markdown_table(
            ["TIGA_CACHE_DIR", "route", "fwd 1st ms", "fwd 2nd ms", "fwd+bwd 1st ms",
             "fwd+bwd 2nd ms", "import ms"], rows))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
