"""Benchmark of tg.vmap and tg.jvp over a stored-CSR propagate (issue 38), and of control
flow's gradients (issue 39).

Workload: a stored CSR relation of `--rows` destinations with `--neighbors` random sources
each, and the propagate `sum over edges of src.x * edge.w` (one weight per edge). Measured,
in one process, the median of `--reps` warm calls each:

- `one propagate, 128 features`: the function on one (rows, B * F) field;
- `vmap over B field sets`: tg.vmap of the function over (B, rows, F) fields (batch first,
  so the batched program transposes in and out), and with `in_axes=1, out_axes=1` (fields
  already (rows, B, F): no transpose);
- `jvp`: tg.jvp of the function on the (rows, B * F) field, against the primal alone.

The same through the torch bridge (`--no-torch` skips it), on torch tensors sharing the
arrays: `torch.func.vmap` of the call over the (B, rows, F) fields (Tiga's batched program,
one run) against the call on the (rows, B * F) field, and `torch.func.jvp` of the call
(Tiga's JVP program) against the call alone.

Reference rows explain the ratios: `two outputs (x and t) in one walk` is the propagate
written by hand with the tangent's message next to the primal's (what a fused JVP computes:
two gathered 128-feature rows per edge), and `transpose of the (B, rows, F) fields` is one
numpy copy of the layout change a batch-first vmap makes before its propagate (the result
comes back as a view, batch axis moved: no copy after it); `the same, as the batched
program runs it` is that copy by the transpose impl rule the program runs.

Ratios: vmap / one propagate (target: at most 1.2) and jvp / primal (target: at most 1.5).
Every result is checked against the unbatched call (vmap) and the linear function itself
(jvp of a linear map is the map of the tangent) before timing. The cases run interleaved
(each round calls every case once, `--reps` rounds), so a load that comes and goes on a
shared machine weighs on all of them alike; the median and the minimum are printed.

Control flow (`--control`, issue 39): the gradient of a `--steps`-step tg.scan whose body is
one propagate over a `--control-rows` relation, with tg.checkpoint policy "all" and "sqrt":
the residual bytes each keeps (tiga.autodiff.remat.residual_bytes on the gradient program;
target: sqrt at most 1/16) and the time of each (target: sqrt at most 2x); and a
tg.fixed_point PageRank over the same relation: its value against its value and implicit
gradient (target: the gradient costs at most the forward's iterations again, a ratio <= 2).

    python benchmarks/transforms.py                  # the issue's size: 131072 rows, 16, 16 x 8
    python benchmarks/transforms.py --quick          # a check that it runs: 4096 rows, 3 reps
    python benchmarks/transforms.py --control        # scan/checkpoint/fixed_point rows only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np

import tiga as tg
from tiga.core.prims.shape import transpose_impl_rule


def relation(rows: int, neighbors: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    row_ptr = np.arange(rows + 1, dtype=np.int64) * neighbors
    col = rng.integers(0, rows, rows * neighbors).astype(np.int64)
    return tg.Graph.from_csr(row_ptr, col, num_src=rows)


def median_ms(fn, reps: int) -> float:
    fn()   # warm: traced, compiled, prepared
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        np.asarray(out if not isinstance(out, tuple) else out[-1])
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def interleaved_ms(cases: dict, reps: int) -> dict:
    """{name: (median ms, min ms)}: every case warmed (traced, compiled, prepared), then
    `reps` rounds that call each case once."""
    for fn in cases.values():
        fn()
    times: dict = {k: [] for k in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            out = fn()
            np.asarray(out if not isinstance(out, tuple) else out[-1])
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def run(rows: int, neighbors: int, batch: int, features: int, reps: int) -> dict:
    g = relation(rows, neighbors)
    rng = np.random.default_rng(1)
    w = rng.standard_normal(rows * neighbors).astype(np.float32)

    def fw(x, w):
        return tg.propagate(g, lambda s, d, e: s.x * e.w, tg.sum(), src={"x": x},
                            edge={"w": w})

    xs = rng.standard_normal((batch, rows, features)).astype(np.float32)
    wide = np.ascontiguousarray(np.moveaxis(xs, 0, 1).reshape(rows, batch * features))
    rows_first = np.ascontiguousarray(np.moveaxis(xs, 0, 1))
    wb = w_inst = w   # one weight per edge, shared by every field set
    vm = tg.vmap(fw, in_axes=(0, None))
    vm_rows = tg.vmap(fw, in_axes=(1, None), out_axes=1)
    _check(fw, vm, vm_rows, xs, rows_first, w_inst)
    tangent = rng.standard_normal(wide.shape).astype(np.float32)
    y_dot = np.asarray(tg.jvp(lambda x: fw(x, wb), (wide,), (tangent,))[1])
    np.testing.assert_allclose(y_dot, np.asarray(fw(tangent, wb)), rtol=1e-4, atol=1e-4)
    def fw2(x, t, w):
        return tg.propagate(g, lambda s, d, e: (s.x * e.w, s.t * e.w), tg.sum(),
                            src={"x": x, "t": t}, edge={"w": w})

    def primal(x):
        return fw(x, wb)

    return interleaved_ms({
        "one propagate, B*F features": lambda: fw(wide, wb),
        "vmap over B field sets (batch first)": lambda: vm(xs, w_inst),
        "vmap over B field sets (in/out_axes=1)": lambda: vm_rows(rows_first, w_inst),
        "jvp of the propagate": lambda: tg.jvp(primal, (wide,), (tangent,)),
        "two outputs (x and t) in one walk": lambda: fw2(wide, tangent, wb),
        "transpose of the (B, rows, F) fields": lambda: np.ascontiguousarray(
            xs.transpose(1, 0, 2)),
        "the same, as the batched program runs it": lambda: transpose_impl_rule(
            xs, permutation=(1, 0, 2))[0],
    }, reps)


def run_torch(rows: int, neighbors: int, batch: int, features: int, reps: int) -> dict:
    """The workload through the torch bridge: torch.func.vmap and torch.func.jvp."""
    import torch
    from torch.func import jvp, vmap

    g = relation(rows, neighbors)
    rng = np.random.default_rng(1)
    w = torch.from_numpy(rng.standard_normal(rows * neighbors).astype(np.float32))

    def fw(x):
        return tg.propagate(g, lambda s, d, e: s.x * e.w, tg.sum(), src={"x": x},
                            edge={"w": w})

    xs = torch.from_numpy(rng.standard_normal((batch, rows, features)).astype(np.float32))
    wide = xs.movedim(0, 1).reshape(rows, batch * features).contiguous()
    tangent = torch.from_numpy(rng.standard_normal(tuple(wide.shape)).astype(np.float32))
    vm = vmap(fw)
    got = vm(xs)
    for b in (0, batch - 1):
        torch.testing.assert_close(got[b], fw(xs[b].contiguous()), rtol=1e-4, atol=1e-4)
    y_dot = jvp(fw, (wide,), (tangent,))[1]
    torch.testing.assert_close(y_dot, fw(tangent), rtol=1e-4, atol=1e-4)
    return interleaved_ms({
        "torch: the call, B*F features": lambda: fw(wide),
        "torch.func.vmap over B field sets": lambda: vm(xs),
        "torch.func.jvp of the call": lambda: jvp(fw, (wide,), (tangent,)),
    }, reps)


def run_control(steps: int, rows: int, neighbors: int, reps: int) -> dict:
    """Gradient of a checkpointed scan (policies "all" and "sqrt") and of a fixed_point."""
    from tiga.autodiff.remat import residual_bytes

    g = relation(rows, neighbors, seed=2)
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((rows, 4)) * 0.1
    kicks = rng.standard_normal((steps, 1)) * 0.01

    def traj(x0):
        def step(x, k):
            mean = tg.propagate(g, lambda s, d, e: s.x, tg.mean(), src={"x": x})
            x = 0.9 * x + 0.1 * tg.math.tanh(mean) + k
            return x, tg.math.sum(x * x)
        return tg.math.sum(tg.scan(step, x0, kicks)[1])

    out = {}
    grads = {}
    for policy in ("all", "sqrt"):
        f = tg.grad(tg.checkpoint(traj, policy))
        grads[policy] = np.asarray(f(x0))
        out[f"scan {steps} steps, grad, policy={policy}"] = median_ms(lambda f=f: f(x0), reps)
        program = tg.make_program(f)(x0)
        out[f"residual bytes, policy={policy}"] = residual_bytes(program)
    np.testing.assert_allclose(grads["sqrt"], grads["all"], rtol=1e-9, atol=1e-12)
    deg = np.maximum(np.diff(np.asarray(g.resolve_csr()[0])), 1).astype(np.float64)[:, None]
    v = np.full((rows, 1), 1.0 / rows)

    def pagerank(v):
        def sweep(r):
            return 0.15 * v + 0.85 * tg.propagate(g, lambda s, d, e: s.r, tg.sum(),
                                                  src={"r": r / deg})
        return tg.fixed_point(sweep, v, tol=1e-10, max_iterations=1000)

    out["fixed_point PageRank, value"] = median_ms(lambda: pagerank(v), reps)
    vg = tg.value_and_grad(lambda v: tg.math.sum(pagerank(v)[: rows // 2]))
    out["fixed_point PageRank, value and implicit grad"] = median_ms(lambda: vg(v), reps)
    return out


def _report_control(args) -> None:
    res = run_control(args.steps, args.control_rows, args.neighbors, args.reps)
    print(f"control flow: {args.steps}-step scan over {args.control_rows} rows x "
          f"{args.neighbors} neighbours (median of {args.reps} warm calls)")
    for name, v in res.items():
        print(f"  {name:52s} {v:12.3f}" + ("" if "bytes" in name else " ms"))
    kept = res["residual bytes, policy=sqrt"] / res["residual bytes, policy=all"]
    slow = (res[f"scan {args.steps} steps, grad, policy=sqrt"]
            / res[f"scan {args.steps} steps, grad, policy=all"])
    fp = (res["fixed_point PageRank, value and implicit grad"]
          / res["fixed_point PageRank, value"])
    print(f"sqrt / all residual bytes: {kept:.4f} (target <= 1/16 = 0.0625); time: "
          f"{slow:.2f} (target <= 2); fixed_point value+grad / value: {fp:.2f} (target <= 2)")


def _check(fw, vm, vm_rows, xs, rows_first, w_inst):
    got = np.asarray(vm(xs, w_inst))
    got_rows = np.asarray(vm_rows(rows_first, w_inst))
    for b in (0, len(xs) - 1):
        want = np.asarray(fw(xs[b], w_inst))
        np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_rows[:, b], want, rtol=1e-4, atol=1e-4)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=131072)
    parser.add_argument("--neighbors", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--quick", action="store_true",
                        help="a check that it runs: 4096 rows, 3 reps (no ratios to record)")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip the torch.func rows (torch bridge)")
    parser.add_argument("--control", action="store_true",
                        help="only the control-flow rows (scan + checkpoint, fixed_point)")
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--control-rows", type=int, default=4096)
    parser.add_argument("--json", metavar="PATH",
                        help="also write the rows (median and min ms), the commit and the "
                        "load average as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.reps, args.steps, args.control_rows = 4096, 3, 64, 256
    if args.control:
        _report_control(args)
        return
    load = os.getloadavg()
    res = run(args.rows, args.neighbors, args.batch, args.features, args.reps)
    record = {"args": vars(args), "threads": _threads(), "load_before": load,
              "commit": _commit(), "tiga": _as_json(res)}
    print(f"stored CSR, {args.rows} rows x {args.neighbors} neighbours, B = {args.batch} "
          f"field sets x {args.features} features ({args.reps} interleaved rounds; "
          f"{_threads()})")
    ratios = _print(res, "one propagate, B*F features")
    print(f"vmap / one propagate: {ratios['vmap over B field sets (batch first)']} "
          f"(target <= 1.2); with in/out_axes=1: "
          f"{ratios['vmap over B field sets (in/out_axes=1)']}")
    print(f"jvp / primal: {ratios['jvp of the propagate']} (target <= 1.5); the hand-fused "
          f"two-output walk: {ratios['two outputs (x and t) in one walk']}")
    try:
        if args.no_torch:
            return
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch.func rows skipped: torch is not installed")
            return
        res = run_torch(args.rows, args.neighbors, args.batch, args.features, args.reps)
        record["torch"] = _as_json(res)
        ratios = _print(res, "torch: the call, B*F features")
        print(f"torch.func.vmap / one call: {ratios['torch.func.vmap over B field sets']} "
              f"(target <= 1.2); torch.func.jvp / call: "
              f"{ratios['torch.func.jvp of the call']} (target <= 1.5)")
    finally:
        if args.json:
            record["load_after"] = os.getloadavg()
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)


def _as_json(res: dict) -> dict:
    return {k: {"median_ms": ms, "min_ms": lo} for k, (ms, lo) in res.items()}


def _commit() -> str | None:
    """The checkout's commit (with "+dirty" when tiga/ differs from it), for the record; an
    export of a commit (no git) names it in TIGA_BENCH_COMMIT."""
    if os.environ.get("TIGA_BENCH_COMMIT"):
        return os.environ["TIGA_BENCH_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "../tiga"],
                               cwd=here, capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _print(res: dict, base_name: str) -> dict:
    """Rows of median and minimum ms with their ratios to `base_name`'s; the ratios as
    'median ratio (min ratio)' strings."""
    base, base_min = res[base_name]
    ratios = {}
    for name, (ms, lo) in res.items():
        print(f"  {name:42s} {ms:9.3f} ms  x{ms / base:5.2f}   min {lo:9.3f} ms  "
              f"x{lo / base_min:5.2f}")
        ratios[name] = f"{ms / base:.2f} (min: {lo / base_min:.2f})"
    return ratios


def _threads() -> str:
    from tiga.xla_free_runtime.calls.threads import num_threads
    return f"{num_threads()} Tiga threads"

if __name__ == "__main__":
    main()
