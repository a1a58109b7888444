"""Distributed hex-mesh benchmark (issue 16): the report's 26-neighbour, 16-feature sum over
an L^3 mesh as 1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread (overlapped and
communicate-then-compute), halo bytes and boundary-row share, a gradient step, an MPI
ping-pong, and a model projecting strong scaling to 4..1024 ranks for L = 96..512.

    python benchmarks/distributed.py            # L = 32, 64, 96 (a few minutes; quiet machine)
    python benchmarks/distributed.py --quick    # a smoke run (small meshes, few repeats)

Each configuration is one `mpiexec -n P python -m mpi4py this --worker SPEC` launch (bounded
by MPIEXEC_TIMEOUT) that times every side; rank 0 prints one JSON line. The first call of
each step (compilation) is not timed; each timed call starts after a barrier and the time of
a call is the slowest rank's. One rank runs the plain single-process program (no partition).
The partition is the spatial one (recursive coordinate bisection; at 2 ranks it is the
same half split as "rows"). Writes results/distributed-<date>-<commit>.json and
plots/distributed.png.

The model: time per call on P ranks is the slowest rank's
    overlapped:                t_edge * E_boundary + max(t_edge * E_interior, T_comm)
    communicate-then-compute:  T_comm + t_edge * E_local
    T_comm = peers * latency + ghost bytes in / bandwidth
with t_edge the measured 1 rank x 1 thread time per edge, latency and bandwidth from the
measured ping-pong, and per-rank owned/ghost/boundary rows, edges and peers from the
partitioner's rule applied to the lattice (recursive bisection of the L^3 box). That lattice
count is checked against the real partitioner and halo plans (partition.owners +
halo.build_plan) at the smallest measured side, and the model against the measured 2-rank
point at every measured side.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
FEATURES = 16
BYTES = 4                       # float32 features
PROJECT_SIDES = (96, 128, 192, 256, 384, 512)
PROJECT_RANKS = tuple(2 ** k for k in range(0, 11))      # 1 .. 1024
RESULT = "RESULT "


# ---------------------------------------------------------------- worker (one MPI launch)
def _mesh(tg, side: int):
    from workloads.hex_mesh import mesh_csr

    row_ptr, col = mesh_csr(side)
    g = tg.Graph.from_csr(row_ptr, col, num_src=side ** 3)
    x = np.random.default_rng(0).standard_normal((side ** 3, FEATURES), dtype=np.float32)
    axes = np.indices((side, side, side)).reshape(3, -1).T.astype(np.float64)
    return g, x, axes


def _time_side(tg, comm, side: int, spec: dict, grad: bool) -> dict:
    g, x, axes = _mesh(tg, side)
    if comm.size > 1:
        graph = tg.distributed.partition(g, method="spatial", positions=axes)
        graph.overlap = spec["overlap"]
        xl = graph.local(x)
    else:
        graph, xl = g, x

    class Sum(tg.MessagePassing):
        reducer = tg.sum()

        def edge(self, src, dst, edge):
            return src.x

    if grad:
        step = tg.grad(lambda v: (Sum()(graph=graph, src={"x": v}) ** 2).sum())
    else:
        def step(v):
            return Sum()(graph=graph, src={"x": v})
    first = np.asarray(step(xl))
    if comm.size > 1 and not grad:      # correctness against the single-process call
        want = np.asarray(Sum()(graph=g, src={"x": x}))
        assert np.allclose(graph.gather(first), want, rtol=1e-4, atol=1e-4)
    times, waits = [], []
    deadline = time.perf_counter() + spec["seconds"]
    for k in range(spec["repeats"]):
        comm.raw.Barrier()
        with tg.profile() as prof:
            t0 = time.perf_counter()
            step(xl)
            times.append(time.perf_counter() - t0)
        halo = prof.measured("halo")
        waits.append(halo[-1].get("wait_s", 0.0) if comm.size > 1 and halo else 0.0)
        if k >= 2 and time.perf_counter() > deadline:
            break
    every = comm.allgather_array(np.array([np.median(times), np.median(waits)]), "bench")
    out = {"seconds": float(every[:, 0].max()), "wait_seconds": float(every[:, 1].max()),
           "calls": len(times), "edges": int(g.num_edges)}
    if comm.size > 1:
        p = graph.plan
        rows = comm.allgather_array(np.array([p.n_ghost, p.n_owned - p.n_interior,
                                              p.n_owned, len(p.col_idx)]), "plan")
        out.update(halo_bytes_in=int(rows[:, 0].max()) * FEATURES * BYTES,
                   boundary_share=float(rows[:, 1].sum() / max(rows[:, 2].sum(), 1)),
                   ghosts=rows[:, 0].tolist(), local_edges=rows[:, 3].tolist())
    return out


def _pingpong(comm) -> list:
    """[(bytes, seconds one way)] between ranks 0 and 1 (half the median round trip)."""
    raw, out = comm.raw, []
    for k in range(3, 25, 3):
        buf = np.zeros(2 ** k, np.uint8)
        reps = int(min(200, max(8, 2 ** 23 // buf.nbytes)))
        trips = []
        for _ in range(reps):
            raw.Barrier()
            t0 = time.perf_counter()
            if comm.rank == 0:
                raw.Send(buf, dest=1, tag=7)
                raw.Recv(buf, source=1, tag=7)
            elif comm.rank == 1:
                raw.Recv(buf, source=0, tag=7)
                raw.Send(buf, dest=0, tag=7)
            trips.append(time.perf_counter() - t0)
        out.append((buf.nbytes, float(np.median(trips)) / 2))
    return out


def worker(spec: dict) -> None:
    import tiga as tg

    comm = tg.distributed.init()
    res = {"ranks": comm.size, "threads": int(os.environ.get("TIGA_NUM_THREADS", "1")),
           "overlap": spec["overlap"], "sides": {}}
    for side in spec["sides"]:
        res["sides"][str(side)] = _time_side(tg, comm, side, spec, grad=False)
    if spec.get("grad_side"):
        res["grad"] = _time_side(tg, comm, spec["grad_side"], spec, grad=True)
    if spec.get("pingpong") and comm.size >= 2:
        res["pingpong"] = _pingpong(comm)
    if comm.rank == 0:
        print(RESULT + json.dumps(res), flush=True)


# ---------------------------------------------------------------- driver
CONFIGS = (("1 rank x 1 thread", 1, 1, True), ("1 rank x 2 threads", 1, 2, True),
           ("2 ranks x 1 thread, communicate-then-compute", 2, 1, False),
           ("2 ranks x 1 thread, overlapped", 2, 1, True))


def launch(ranks: int, threads: int, spec: dict, limit: int) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"     # the mpich wheel's
    if not mpiexec.exists():
        mpiexec = shutil.which("mpiexec") or "mpiexec"     # a cluster's own MPI
    env = dict(os.environ, TIGA_NUM_THREADS=str(threads), MPIEXEC_TIMEOUT=str(limit))
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, "-m", "mpi4py", __file__,
           "--worker", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 30, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT)]
    if out.returncode or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return json.loads(lines[0][len(RESULT):])


def fit_network(points: list) -> tuple:
    """(latency s, bandwidth B/s): least squares of t = latency + bytes / bandwidth, each
    point weighted by 1/t (small and large messages count alike)."""
    m = np.array([p[0] for p in points], np.float64)
    t = np.array([p[1] for p in points], np.float64)
    a = np.stack([np.ones_like(m), m], axis=1) / t[:, None]
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return max(float(lat), float(t.min()) * 0.1), 1.0 / max(float(inv_bw), 1e-15)


# ---------------------------------------------------------------- the model
def lattice_boxes(side: int, ranks: int) -> np.ndarray:
    """(ranks, 2, 3) [lo, hi) of each rank's box: partition.owners' "spatial" rule (halve
    the ranks, cut the longest extent at their share of the points) on the L^3 lattice,
    with cuts at fractional planes where the real one cuts inside a plane."""
    out, stack = [], [(np.zeros(3), np.full(3, float(side)), ranks)]
    while stack:
        lo, hi, parts = stack.pop()
        if parts == 1:
            out.append((lo, hi))
            continue
        left, axis = parts // 2, int(np.argmax(hi - lo))
        cut = lo[axis] + (hi[axis] - lo[axis]) * left / parts
        hi_left, lo_right = hi.copy(), lo.copy()
        hi_left[axis] = lo_right[axis] = cut
        stack += [(lo, hi_left, left), (lo_right, hi, parts - left)]
    return np.array(out)


def box_stats(side: int, ranks: int) -> dict:
    """Per-rank owned, ghost and boundary rows, local/interior edges and peers of the
    26-neighbour lattice over the lattice boxes (arrays over ranks)."""
    b = lattice_boxes(side, ranks)
    lo, hi = b[:, 0], b[:, 1]
    d = hi - lo
    s = (lo <= 1e-9).astype(float) + (hi >= side - 1e-9)      # sides on the domain boundary
    g = 2 - s                                                  # sides that have ghosts
    owned = d.prod(1)
    inner = np.maximum(d - g, 0)

    def edges(dims):       # each point reads the (3 or 2 per axis) neighbourhood, minus itself
        return np.where(dims.min(1) > 0, (3 * dims - s).clip(0).prod(1) - dims.prod(1), 0)

    gap = np.maximum(lo[:, None, :] - hi[None, :, :], lo[None, :, :] - hi[:, None, :])
    touch = (gap <= 1e-9).all(axis=2)
    np.fill_diagonal(touch, False)
    return {"owned": owned, "ghosts": (d + g).prod(1) - owned,
            "boundary": owned - inner.prod(1), "edges": edges(d),
            "interior_edges": edges(inner), "peers": touch.sum(1)}


def model_seconds(stats: dict, t_edge: float, lat: float, bw: float,
                  fixed: float = 0.0) -> dict:
    """Slowest rank's seconds per call; `fixed` is the per-call overhead of a distributed
    call (dispatch, launches, waits' wake-up), fitted at the smallest measured side."""
    comm = stats["peers"] * lat + stats["ghosts"] * FEATURES * BYTES / bw
    e_int = stats["interior_edges"]
    e_bnd = stats["edges"] - e_int
    over = fixed + t_edge * e_bnd + np.maximum(t_edge * e_int, comm)
    cct = fixed + comm + t_edge * stats["edges"]
    return {"overlapped": float(over.max()), "communicate_then_compute": float(cct.max()),
            "comm": float(comm.max())}


def check_lattice_model(side: int) -> list:
    """The lattice counts against the real partitioner and halo plans at `side`."""
    from workloads.hex_mesh import mesh_csr

    from tiga.xla_free_runtime.distributed.halo import build_plan
    from tiga.xla_free_runtime.distributed.partition import owners

    row_ptr, col = mesh_csr(side)
    axes = np.indices((side,) * 3).reshape(3, -1).T.astype(np.float64)
    rows = []
    for ranks in (2, 4, 8):
        owner = owners(row_ptr, ranks, "spatial", axes)
        plans = [build_plan(row_ptr, col, None, owner, r) for r in range(ranks)]
        real = {"ghosts": max(p.n_ghost for p in plans),
                "boundary": sum(p.n_owned - p.n_interior for p in plans),
                "edges": max(len(p.col_idx) for p in plans),
                "peers": max(len(p.peers()) for p in plans)}
        st = box_stats(side, ranks)
        lattice = {"ghosts": float(st["ghosts"].max()), "boundary": float(st["boundary"].sum()),
                   "edges": float(st["edges"].max()), "peers": int(st["peers"].max())}
        rows.append({"side": side, "ranks": ranks, "real": real, "lattice": lattice})
    return rows


def fit_compute(one: dict) -> tuple:
    """(fixed s per call, s per edge) of 1 rank x 1 thread: least squares over the measured
    sides, weighted by 1/t (one side: no fixed part)."""
    sides = list(one["sides"].values())
    e = np.array([r["edges"] for r in sides], np.float64)
    t = np.array([r["seconds"] for r in sides], np.float64)
    if len(sides) == 1:
        return 0.0, float(t[0] / e[0])
    a = np.stack([np.ones_like(e), e], axis=1) / t[:, None]
    (fixed, per_edge), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if per_edge <= 0:
        return 0.0, float((t / e).min())
    return max(float(fixed), 0.0), float(per_edge)


def project(fit: dict) -> dict:
    """{side: [(ranks, speed-up overlapped, speed-up communicate-then-compute, comm s)]}."""
    out = {}
    t_edge, lat, bw = fit["t_edge_s"], fit["latency_s"], fit["bandwidth_Bps"]
    for side in PROJECT_SIDES:
        one = fit["fixed_one_s"] + t_edge * float(box_stats(side, 1)["edges"][0])
        pts = []
        for ranks in PROJECT_RANKS:
            if ranks == 1:
                pts.append((1, 1.0, 1.0, 0.0))
                continue
            m = model_seconds(box_stats(side, ranks), t_edge, lat, bw, fit["fixed_dist_s"])
            pts.append((ranks, one / m["overlapped"], one / m["communicate_then_compute"],
                        m["comm"]))
        out[side] = pts
    return out


# ---------------------------------------------------------------- report
def plot(run: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax_p, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for side, pts in run["projection"].items():
        ranks = [p[0] for p in pts]
        ax_p.plot(ranks, [p[1] for p in pts], marker="o", ms=3, label=f"L = {side}")
    ax_p.plot(PROJECT_RANKS, PROJECT_RANKS, "k--", lw=0.8, label="ideal")
    for side, chk in run["model_check"].items():
        ax_p.plot([2], [chk["measured_speedup"]], "kx", ms=8)
        ax_p.annotate(f"L={side} measured", (2, chk["measured_speedup"]), fontsize=7,
                      xytext=(4, -8), textcoords="offset points")
    ax_p.set(xscale="log", yscale="log", xlabel="ranks (1 thread each)",
             ylabel="speed-up over 1 rank x 1 thread",
             title="model: overlapped strong scaling")
    ax_p.set_xscale("log", base=2)
    sides = sorted(run["measured"][CONFIGS[0][0]]["sides"], key=int)
    for name, *_ in CONFIGS:
        res = run["measured"][name]["sides"]
        ax_m.plot([int(s) for s in sides], [res[s]["seconds"] * 1e3 for s in sides],
                  marker="o", label=name)
    ax_m.set(xlabel="L (mesh side)", ylabel="median ms per call", yscale="log",
             title="measured hex-mesh sum (26 neighbours, 16 features)")
    for ax in (ax_p, ax_m):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def summarise(run: dict) -> None:
    m, big = run["measured"], str(max(int(s) for s in run["sides"]))
    for side in sorted(m[CONFIGS[0][0]]["sides"], key=int):
        base = m[CONFIGS[0][0]]["sides"][side]["seconds"]
        print(f"L = {side} ({int(side) ** 3} nodes, {m[CONFIGS[0][0]]['sides'][side]['edges']}"
              " edges)")
        for name, ranks, *_ in CONFIGS:
            res = m[name]["sides"][side]
            extra = "" if ranks == 1 else (
                f", halo {res['halo_bytes_in'] / 2**20:.2f} MiB in per rank, boundary rows "
                f"{100 * res['boundary_share']:.1f}%, blocked in wait "
                f"{res['wait_seconds'] * 1e3:.2f} ms")
            print(f"  {name:46s} {res['seconds'] * 1e3:9.2f} ms  x{base / res['seconds']:.2f}"
                  f"{extra}")
    t = run["targets"]
    print(f"targets at L = {big}: 2 ranks / 1 rank x 1 thread = x{t['vs_one_thread']:.2f} "
          f"(>= 1.8), / 1 rank x 2 threads = x{t['vs_two_threads']:.2f} (>= 0.9); overlap "
          f"hides {100 * t['hidden']:.0f}% of the exchange (>= 80%); gradient step "
          f"x{t['grad_speedup']:.2f} (>= 1.6)")
    lat, bw = run["network"]["latency_s"], run["network"]["bandwidth_Bps"]
    f = run["fit"]
    print(f"ping-pong: latency {lat * 1e6:.1f} us, bandwidth {bw / 2**30:.2f} GiB/s; "
          f"compute {f['t_edge_s'] * 1e9:.3f} ns per edge + {f['fixed_one_s'] * 1e3:.3f} ms "
          f"per call; distributed call overhead {f['fixed_dist_s'] * 1e3:.3f} ms (fitted at "
          f"L = {min(run['sides'])})")
    for side, chk in run["model_check"].items():
        print(f"model vs measured 2 ranks, L = {side}: overlapped "
              f"{chk['model_overlapped_s'] * 1e3:.2f} / {chk['measured_overlapped_s'] * 1e3:.2f}"
              f" ms, communicate-then-compute {chk['model_cct_s'] * 1e3:.2f} / "
              f"{chk['measured_cct_s'] * 1e3:.2f} ms")
    for row in run["lattice_check"]:
        print(f"lattice model vs real partitioner, L = {row['side']}, {row['ranks']} ranks: "
              f"{row['lattice']} vs {row['real']}")
    for side, pts in run["projection"].items():
        print(f"projected L = {side}: " + ", ".join(f"{p[0]}: x{p[1]:.0f}" for p in pts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", type=int, nargs="+", default=[32, 64, 96])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=8.0,
                    help="time budget per side and configuration (at least 3 calls)")
    ap.add_argument("--quick", action="store_true", help="smoke run: L = 12, 16, 3 calls")
    ap.add_argument("--out", default=str(HERE), help="directory for results/ and plots/")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker is not None:
        worker(json.loads(a.worker))
        return
    if a.quick:
        a.sides, a.repeats, a.seconds = [12, 16], 3, 1.0
    t_start, big = time.monotonic(), max(a.sides)
    measured = {}
    for name, ranks, threads, overlap in CONFIGS:
        spec = {"sides": a.sides, "repeats": a.repeats, "seconds": a.seconds,
                "overlap": overlap, "grad_side": big if threads == 1 and overlap else None,
                "pingpong": ranks == 2 and overlap}
        measured[name] = launch(ranks, threads, spec, limit=600)
        print(f"  ran {name} ({time.monotonic() - t_start:.0f} s)", flush=True)
    run = analyse(measured, a.sides)
    run.update(date=datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), commit=_commit(),
               quick=a.quick, wall_seconds=time.monotonic() - t_start)
    out = Path(a.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    tag = "-quick" if a.quick else ""
    dest = out / "results" / f"distributed-{run['date']}-{run['commit']}{tag}.json"
    dest.write_text(json.dumps(run, indent=1))
    png = out / "plots" / f"distributed{tag}.png"
    drawn = plot(run, png)
    summarise(run)
    print(f"results: {dest}" + (f"\nplot: {png}" if drawn else "\n(no matplotlib: no plot)"))


def analyse(measured: dict, sides: list) -> dict:
    one, two_t = measured[CONFIGS[0][0]], measured[CONFIGS[1][0]]
    cct, over = measured[CONFIGS[2][0]], measured[CONFIGS[3][0]]
    big, small = str(max(sides)), min(sides)
    fixed_one, t_edge = fit_compute(one)
    lat, bw = fit_network(over["pingpong"])
    # the distributed call's own fixed cost: what the smallest side measured beyond the
    # model's compute and transfers (the larger sides are then an out-of-sample check)
    bare = model_seconds(box_stats(small, 2), t_edge, lat, bw)["overlapped"]
    fixed_dist = max(over["sides"][str(small)]["seconds"] - bare, 0.0)
    fit = {"t_edge_s": t_edge, "fixed_one_s": fixed_one, "fixed_dist_s": fixed_dist,
           "latency_s": lat, "bandwidth_Bps": bw}
    check = {}
    for side in map(str, sides):
        m = model_seconds(box_stats(int(side), 2), t_edge, lat, bw, fixed_dist)
        check[side] = {"model_overlapped_s": m["overlapped"],
                       "model_cct_s": m["communicate_then_compute"],
                       "measured_overlapped_s": over["sides"][side]["seconds"],
                       "measured_cct_s": cct["sides"][side]["seconds"],
                       "measured_speedup": one["sides"][side]["seconds"] /
                       over["sides"][side]["seconds"]}
    exchange = cct["sides"][big]["wait_seconds"]
    targets = {"vs_one_thread": one["sides"][big]["seconds"] / over["sides"][big]["seconds"],
               "vs_two_threads": two_t["sides"][big]["seconds"] /
               over["sides"][big]["seconds"],
               "hidden": 1.0 - over["sides"][big]["wait_seconds"] / exchange
               if exchange > 0 else 1.0,
               "grad_speedup": one["grad"]["seconds"] / over["grad"]["seconds"]}
    return {"sides": sides, "measured": measured, "fit": fit, "t_edge_s": t_edge,
            "network": {"latency_s": lat, "bandwidth_Bps": bw,
                        "pingpong": over["pingpong"]},
            "targets": targets, "model_check": check,
            "lattice_check": check_lattice_model(min(sides)),
            "projection": {str(s): v for s, v in project(fit).items()}}


if __name__ == "__main__":
    main()
