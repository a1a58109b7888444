"""benchmarks: causal attention as message passing vs torch SDPA and a naive torch version.

Workload: causal self-attention, 16 heads, head width 64, float32, N in {1024, 4096}, inputs
head-major (H, N, D) viewed as (N, H, D) through permute. Peers:

- tiga:  the CausalAttention MessagePassing program (tiled streaming route), torch tensors in
         and out through the torch bridge; fwd+bwd is torch autograd through Tiga's VJP;
- sdpa:  torch.nn.functional.scaled_dot_product_attention(is_causal=True);
- naive: explicit scores, masked_fill, softmax, weights @ v (materialises N x N per head).

Every (peer, mode, N) runs in a fresh child process (peak memory = VmHWM growth during the timed
calls). Rounds interleave the peers, so each round's ratios come from back-to-back runs on the
same (shared, noisy) machine; the table reports the median over rounds.

    python benchmarks/attention.py [--sizes 1024 4096] [--rounds 2] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

HEADS, WIDTH = 16, 64
PEERS = ("tiga", "sdpa", "naive")


def child(cfg: dict) -> None:
    import torch

    import tiga as tg

    class CausalAttention(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge, scale):
            score = (dst.query * src.key).sum(dim=-1) * scale
            return self.reducer(score, src.value)

    n, peer, mode = cfg["n"], cfg["peer"], cfg["mode"]
    torch.manual_seed(0)
    grad = mode == "fwd+bwd"
    q, k, v = (torch.randn(HEADS, n, WIDTH).permute(1, 0, 2).requires_grad_(grad)
               for _ in range(3))
    ct = torch.randn(n, HEADS, WIDTH)
    scale = WIDTH ** -0.5
    graph = tg.Graph.triangular(n)
    program = CausalAttention()
    future = None

    def forward():
        nonlocal future
        if peer == "tiga":
            return program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                           scale=scale)
        qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
        if peer == "sdpa":
            # (1, H, N, D): torch's CPU flash kernel needs the batch axis (with 3-D inputs
            # SDPA takes the math path, ~6x slower and O(N^2) memory)
            out = torch.nn.functional.scaled_dot_product_attention(
                qh[None], kh[None], vh[None], is_causal=True)[0]
        else:
            if future is None:
                future = torch.ones(n, n, dtype=torch.bool).triu(1)
            s = (qh @ kh.transpose(-1, -2)) * scale
            out = (s.masked_fill(future, -torch.inf).softmax(-1) @ vh)
        return out.transpose(0, 1)

    def step():
        if grad:
            return torch.autograd.grad(forward(), (q, k, v), ct)
        with torch.no_grad():
            return forward()

    step()
    peak = H.PeakRSS()
    peak.start()
    timing = H.time_calls(step, warmup=1, repeat=cfg["repeat"], budget_s=cfg["budget_s"])
    timing["peak_bytes"] = peak.stop()
    timing["threads"] = torch.get_num_threads()
    H.child_report(timing)


def interleaved(n: int, rounds: int, grad: bool) -> dict:
    """tiga and SDPA alternating in one process (same load, same moment): per-round ratios."""
    import time

    import torch

    import tiga as tg

    class CausalAttention(tg.MessagePassing):
        reducer = tg.online_softmax()

        def edge(self, src, dst, edge, scale):
            return self.reducer((dst.query * src.key).sum(dim=-1) * scale, src.value)

    torch.manual_seed(0)
    q, k, v = (torch.randn(HEADS, n, WIDTH).permute(1, 0, 2).requires_grad_(grad)
               for _ in range(3))
    ct = torch.randn(n, HEADS, WIDTH)
    graph, program = tg.Graph.triangular(n), CausalAttention()

    def run(peer):
        with torch.set_grad_enabled(grad):
            if peer == "tiga":
                y = program(graph=graph, src={"key": k, "value": v}, dst={"query": q},
                            scale=WIDTH ** -0.5)
            else:
                y = torch.nn.functional.scaled_dot_product_attention(
                    *(x.transpose(0, 1)[None] for x in (q, k, v)), is_causal=True)[0]
                y = y.transpose(0, 1)
            if grad:
                torch.autograd.grad(y, (q, k, v), ct)

    times = {"tiga": [], "sdpa": []}
    for peer in times:
        run(peer)
    for _ in range(rounds):
        for peer in times:
            t0 = time.perf_counter()
            run(peer)
            times[peer].append((time.perf_counter() - t0) * 1e3)
    ratios = [a / b for a, b in zip(times["tiga"], times["sdpa"])]
    return {"n": n, "mode": "fwd+bwd" if grad else "fwd", "times_ms": times,
            "ratios": ratios, "median_ratio": statistics.median(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=8.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--child")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "attention.json"))
    ap.add_argument("--interleaved", type=int, default=0, metavar="ROUNDS",
                    help="only run tiga and SDPA alternately in this process, ROUNDS pairs")
    args = ap.parse_args()
    if args.interleaved:
        for n in args.sizes:
            for mode in args.modes:
                r = interleaved(n, args.interleaved, mode == "fwd+bwd")
                print(f"N={n} {r['mode']}: tiga {[round(t) for t in r['times_ms']['tiga']]} ms, "
                      f"sdpa {[round(t) for t in r['times_ms']['sdpa']]} ms, tiga/sdpa per "
                      f"pair {[round(x, 2) for x in r['ratios']]} (median "
                      f"{r['median_ratio']:.2f})")
        return
    if args.child:
        child(json.loads(args.child))
        return
    env = dict(os.environ)
    jobs = []
    for r in range(args.rounds):
        for n in args.sizes:
            for mode in args.modes:
                for peer in PEERS:
                    cfg = {"n": n, "peer": peer, "mode": mode, "repeat": args.repeat,
                           "budget_s": args.budget_s, "round": r}
                    jobs.append((f"{peer} {mode} N={n} r{r}",
                                 [sys.executable, __file__, "--child", json.dumps(cfg)]))
    results, _ = H.run_all(jobs, args.timeout, env, desc="attention")
    for (_, argv), res in zip(jobs, results):
        res["cfg"] = json.loads(argv[-1])
    rows = []
    for n in args.sizes:
        for mode in args.modes:
            per = {p: [r for r in results if r["cfg"]["n"] == n and r["cfg"]["mode"] == mode
                       and r["cfg"]["peer"] == p and r.get("status") == "ok"] for p in PEERS}
            ratios = []
            for r in range(args.rounds):
                t = [x for x in per["tiga"] if x["cfg"]["round"] == r]
                s = [x for x in per["sdpa"] if x["cfg"]["round"] == r]
                if t and s:
                    ratios.append(t[0]["median_ms"] / s[0]["median_ms"])

            def med(p, key="median_ms", per=per):
                xs = [x[key] for x in per[p]]
                return statistics.median(xs) if xs else float("nan")

            rows.append([n, mode] + [f"{med(p):.0f}" for p in PEERS]
                        + [f"{statistics.median(ratios):.2f}" if ratios else "n/a"]
                        + [f"{med(p, 'peak_bytes') / 2**20:.0f}" for p in PEERS])
    headers = ["N", "mode", "tiga ms", "sdpa ms", "naive ms", "tiga/sdpa (per round)",
               "tiga peak MiB", "sdpa peak MiB", "naive peak MiB"]
    table = H.markdown_table(headers, rows)
    print(table)
    H.write_json(args.out, {"machine": H.machine_info(os.cpu_count() or 1),
                            "results": results, "table": table})


if __name__ == "__main__":
    main()
