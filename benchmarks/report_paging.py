"""benchmarks: the paging benchmark's outputs: its JSON, plots/paging.png and PAGING.md.

    python benchmarks/report_paging.py results/paging-<date>-<commit>.json   # re-render

Each paged call is put against its floor (issue 28), from figures of the same run only:
max(bytes the call read from the disk / the disk's read bandwidth, bytes it wrote to the disk
tier / the write bandwidth, the in-memory call's warm median). The bytes are the call's own run
report (tg.profile(): PageStats), except that reads the page cache served are no disk reads:
the read term takes the smaller of the report's disk-tier bytes and what the process had the
block layer read during the call (/proc/self/io). The bandwidths are disk_floor.py's,
measured on the store's directory after ingest.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

TARGETS = """\
Targets (issue 28, this 2-core machine, same run): 1B edges forward (2 GiB host budget) <= 1.3x
its floor cold, RSS <= 1 GiB; 100M edges, result on the host (2 GiB budget), warm <= 1.5x the
in-memory call; 100M edges, result on disk (0.5 GiB budget), warm <= 1.3x its floor; 10M
edges, result on the host, warm <= 1.5x the in-memory call; 1B gradient w.r.t. the source
field <= 1.3x its floor once the transposed relation exists."""

STANDARD = (10_000_000, 100_000_000, 1_000_000_000)
CAVEATS = """\
How to read the floor: the run report counts the bytes delivered to pages from the disk tier
(decoded chunks), whether the disk or the page cache served them; the block layer
(/proc/self/io of the calling process, its prefetch threads included) counts what the disk
itself read. The read term takes the smaller: a cold call's report (the block layer read a
few percent more: chunk headers, metadata), nothing for a warm call whose chunks the page
cache held. Writes are O_DIRECT, counted by the report. The bandwidths are one sequential
pass at queue depth one with 8 MiB requests (disk_floor.py); a call that keeps more requests
in flight can beat the read term."""


IO_ALONE = """I/O alone: the call's own disk traffic with no computing, measured in the same run
right before the calls (paging.py's io phase, disk_floor.call_io): every file of the store
read cold by two threads (O_DIRECT), the result's bytes written O_DIRECT and fsynced by one,
and both at once for a call that does both. On this machine's single virtual disk, reads and
writes share the device's bandwidth, so a call that reads and writes cannot reach max(read
term, write term); the I/O-alone time is what the disk itself takes for the call's bytes.
The gradient's backward pass reads the transposed relation and the cotangent (the forward's
result) and writes a gradient of the forward's size: its I/O alone is measured on those
files right before it (after the transpose build and the forward that wrote the cotangent)."""


def _med(xs) -> float | None:
    return statistics.median(xs) if xs else None


def _f(x, unit: str = "s", digits: int = 3) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}g} {unit}".strip()


def _mb(x) -> str:
    return "–" if x is None else f"{x / 1e6:,.1f} MB"


def disk_reads(st: dict) -> int:
    """Bytes a call read from the disk itself: its report's disk-tier bytes, less what the
    page cache served (the block layer read fewer)."""
    reported, block = st["bytes_read"].get("disk", 0), st.get("block_io", {}).get("read")
    return reported if block is None else min(reported, block)


def floor_of(st: dict, disk: dict, memory_s: float | None) -> dict | None:
    """The floor of one paged call from its run report `st` (bytes per tier), the disk's
    measured bandwidths and the in-memory call: seconds, its bounding term, every term."""
    if not disk or "read_Bps" not in disk or not st:
        return None
    terms = {"read": disk_reads(st) / disk["read_Bps"],
             "write": st["bytes_written"].get("disk", 0) / disk["write_Bps"]}
    if memory_s:
        terms["in-memory"] = memory_s
    bound = max(terms, key=terms.get)
    return {"s": terms[bound], "bound": bound, "terms": terms}


def io_alone(st: dict, io: dict) -> float | None:
    """The seconds the call's I/O takes with nothing else (the io phase, same run): reads
    and writes at once, reads alone or writes alone, as the call read the disk (cold) and
    wrote its result; None for a call that moved nothing through the disk."""
    if not io or "read_s" not in io or not st:
        return None
    read = disk_reads(st) > 0.5 * io["read_bytes"]
    wrote = st["bytes_written"].get("disk", 0) > 0
    key = "read_write_s" if read and wrote else "read_s" if read else \
        "write_s" if wrote else None
    return io.get(key) if key else None


def warm_floor(runs: list, disk: dict, memory_s: float | None) -> dict | None:
    """The median floor of the warm calls (`runs`: their run reports)."""
    floors = [f for f in (floor_of(s, disk, memory_s) for s in runs) if f]
    return sorted(floors, key=lambda f: f["s"])[len(floors) // 2] if floors else None


def calls(run: dict) -> list:
    """Every measured paged call as (edges, label, run report, seconds, floor, its I/O
    alone): the cold forward, the warm forwards (median), the sweep's, the gradient's
    backward pass (its I/O measured right before it where the run did)."""
    out = []
    for edges, r in sorted(run["sizes"].items(), key=lambda kv: int(kv[0])):
        disk, mem = r.get("disk", {}), _med(r.get("memory", {}).get("warm_s"))
        fws = [("forward" if k == "forward" else f"forward, {k[8:]} budget", v)
               for k, v in r.items() if k.startswith("forward")] + [
            (f"sweep {p}", v) for p, v in sorted(r.get("sweep", {}).items(), key=lambda kv:
                                                  int(kv[0]))]
        for label, fw in fws:
            runs = fw.get("runs", [])
            if runs:
                out.append((int(edges), f"{label}, cold", runs[0], fw["cold_s"],
                            floor_of(runs[0], disk, mem), r.get("io")))
            if len(runs) > 1:
                out.append((int(edges), f"{label}, warm (median of {len(runs) - 1})", runs[1],
                            _med(fw["warm_s"]), warm_floor(runs[1:], disk, mem), r.get("io")))
        gr = r.get("gradient", {})
        if "backward_run" in gr:      # (no in-memory gradient peer: its I/O terms only)
            out.append((int(edges), "gradient backward, cold", gr["backward_run"],
                        gr["backward_s"], floor_of(gr["backward_run"], disk, None),
                        gr.get("backward_io", r.get("io"))))
    return out


def rows(run: dict) -> list:
    out = []
    for edges, r in sorted(run["sizes"].items(), key=lambda kv: int(kv[0])):
        ing, fw, mem, gr = (r.get(k, {}) for k in ("ingest", "forward", "memory", "gradient"))
        warm, peer = _med(fw.get("warm_s")), _med(mem.get("warm_s"))
        runs, disk = fw.get("runs", []), r.get("disk", {})
        cold_f = floor_of(runs[0], disk, peer) if runs else None
        warm_f = warm_floor(runs[1:], disk, peer)
        out.append({
            "edges": int(edges), "budget": r.get("budget"),
            "ingest_s": ing.get("seconds"), "ingest_rss": ing.get("peak_rss_mib"),
            "cold_s": fw.get("cold_s"), "warm_s": warm, "fwd_rss": fw.get("peak_rss_mib"),
            "memory_s": peer, "memory_rss": mem.get("peak_rss_mib"),
            "ratio": warm / peer if warm and peer else None,
            "cold_floor": cold_f, "warm_floor": warm_f,
            "cold_x": fw["cold_s"] / cold_f["s"] if cold_f else None,
            "warm_x": warm / warm_f["s"] if warm_f and warm else None,
            "transpose_s": gr.get("transpose_build_s"), "backward_s": gr.get("backward_s"),
            "grad_rss": gr.get("peak_rss_mib"),
            "errors": {k: v["error"] for k, v in r.items() if isinstance(v, dict) and
                       "error" in v}})
    return out


def _disk_lines(run: dict) -> list:
    lines = ["The disk, measured in the same run on the store's directory after ingest "
             "(`benchmarks/disk_floor.py`; the last three columns: the forward's own bytes, "
             "I/O alone):", "",
             "| edges | file | write | read | O_DIRECT | store read cold | result written | "
             "both at once | directory |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for edges, r in sorted(run["sizes"].items(), key=lambda kv: int(kv[0])):
        d, io = r.get("disk", {}), r.get("io", {})
        if "read_Bps" not in d:
            lines.append(f"| {int(edges):,} | – | – | – | not measured | – | – | – | – |")
            continue
        rw = "–" if "read_s" not in io else (
            f"{_mb(io['read_bytes'])} in {_f(io['read_s'])} | {_mb(io['write_bytes'])} in "
            f"{_f(io.get('write_s'))} | {_f(io.get('read_write_s'))}")
        lines.append(f"| {int(edges):,} | {d['bytes'] / 2**20:.0f} MiB | "
                     f"{d['write_Bps'] / 1e9:.3g} GB/s | {d['read_Bps'] / 1e9:.3g} GB/s | "
                     f"{'yes' if d['direct'] else 'no: ' + d['fallback']} | "
                     + (rw if "read_s" in io else "– | – | –") + f" | `{d['directory']}` |")
    return lines


def _floor_lines(run: dict) -> list:
    lines = ["", "Each paged call against its floor, max(read ÷ read bandwidth, written ÷ write "
             "bandwidth, in-memory call); bytes from the call's run report and the block "
             "layer (/proc/self/io):", "",
             "| edges | call | disk tier read (report) | disk written (report) | block layer "
             "read / written | read term | write term | in-memory | floor | paged | × floor | "
             "I/O alone | × I/O alone |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for edges, label, st, t, f, call_io in calls(run):
        io = st.get("block_io", {})
        terms = f["terms"] if f else {}
        alone = io_alone(st, call_io)
        lines.append(
            f"| {edges:,} | {label} | {_mb(st['bytes_read'].get('disk'))} | "
            f"{_mb(st['bytes_written'].get('disk'))} | {_mb(io.get('read'))} / "
            f"{_mb(io.get('written'))} | {_f(terms.get('read'))} | {_f(terms.get('write'))} | "
            f"{_f(terms.get('in-memory'))} | "
            + (f"{_f(f['s'])} ({f['bound']})" if f else "–")
            + f" | {_f(t)} | {_f(t / f['s'] if f and t else None, '×')} | {_f(alone)} | "
            f"{_f(t / alone if alone and t else None, '×')} |")
    return lines + ["", CAVEATS, "", IO_ALONE]


def _not_measured(run: dict) -> list:
    sizes = {int(e): r for e, r in run["sizes"].items()}
    lines = [f"- {e:,} edges: not run in this run" for e in STANDARD if e not in sizes]
    for e, r in sorted(sizes.items()):
        if "memory" not in r:
            lines.append(f"- {e:,} edges: no in-memory call (the floors have no in-memory "
                         "term)")
        if "gradient" not in r:
            lines.append(f"- {e:,} edges: no gradient")
        else:
            lines.append(f"- {e:,} edges: no in-memory gradient peer (the backward pass's "
                         "floor is its I/O terms only)")
        if "sweep" not in r and e == 10_000_000:
            lines.append(f"- {e:,} edges: no page-size sweep")
    return ["", "Not measured in this run:", ""] + (lines or ["- (everything above)"])


def _head(run: dict, json_name: str) -> list:
    note = run.get("note")
    return ["# Paging benchmark", "",
            f"Generated by `benchmarks/paging.py` from `results/{json_name}`; re-render with "
            "`python benchmarks/report_paging.py results/<json>`.", "",
            f"- Run {run['date']}, commit `{run['code'].get('short', '?')}`; "
            f"{run['machine'].get('cpu_model', '')}; load average at start "
            f"{run['machine'].get('loadavg_at_start')}",
            f"- Page cache: {run['page_cache']}"] + ([f"- {note}"] if note else []) + \
        ["", TARGETS, "",
         "The write paths of this machine, why the result's write bounds the 100M call, and "
         "the page loaders' stages before and after the native gathers (issue 28): "
         "[PAGING_NOTES.md](PAGING_NOTES.md).", ""]


def markdown(run: dict, json_name: str) -> str:
    lines = _head(run, json_name) + [
        "| edges | host budget | ingest | ingest RSS | forward cold | forward warm | "
        "forward RSS | in-memory | paged ÷ in-memory | cold ÷ floor | warm ÷ floor | "
        "transpose build | backward | gradient RSS |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows(run):
        lines.append(
            f"| {r['edges']:,} | {r['budget']} | {_f(r['ingest_s'])} | "
            f"{_f(r['ingest_rss'], 'MiB', 4)} | {_f(r['cold_s'])} | {_f(r['warm_s'])} | "
            f"{_f(r['fwd_rss'], 'MiB', 4)} | {_f(r['memory_s'])} | "
            f"{_f(r['ratio'], '×')} | {_f(r['cold_x'], '×')} | {_f(r['warm_x'], '×')} | "
            f"{_f(r['transpose_s'])} | {_f(r['backward_s'])} | "
            f"{_f(r['grad_rss'], 'MiB', 4)} |")
        for phase, err in r["errors"].items():
            lines.append(f"\n{r['edges']:,} edges, {phase}: **error** {err}\n")
    lines += [""] + _disk_lines(run) + _floor_lines(run) + _stage_lines(run)
    lines += _not_measured(run) + ["", "![time, floor and RSS against edges](plots/paging.png)",
                                   ""]
    return "\n".join(lines)


def _stage_lines(run: dict) -> list:
    lines = ["", "Per-stage seconds of the paged forward (the first, cold call; `read`, "
             "`gather` summed over the prefetch threads; `waited`: the computing thread "
             "waiting for a page):", "",
             "| edges | host budget | page rows | pages | read | gather | compute | write | "
             "waited | total | bytes read (disk) | distinct ratio | result on | pages | "
             "RSS anon / file after |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for edges, r in sorted(run["sizes"].items(), key=lambda kv: int(kv[0])):
        runs = [v for k, v in r.items() if k.startswith("forward")] + [
            v for _, v in sorted(r.get("sweep", {}).items())]
        for fw in runs:
            for st in fw.get("runs", [])[:1]:
                s = st["stages_s"]
                lines.append(
                    f"| {int(edges):,} | {fw.get('budget', '–')} | {st['page_rows']} | "
                    f"{st['pages']} | "
                    f"{s['read']:.3f} | {s['gather']:.3f} | {s['compute']:.3f} | "
                    f"{s['write']:.3f} | {s['wait']:.3f} | {s['total']:.3f} | "
                    f"{st['bytes_read'].get('disk', 0):,} | {st['distinct_ratio']:.3f} | "
                    f"{st['result_tier']} | {'mapped' if st.get('mapped') else 'read'} | "
                    f"{_rss_split(fw.get('rss_now_mib'))} |")
    sweep = [(int(edges), p, v) for edges, r in run["sizes"].items()
             for p, v in r.get("sweep", {}).items() if "warm_s" in v]
    if sweep:
        lines += ["", "Page-size sweep (warm median seconds):", "",
                  "| edges | page rows | warm | cold | peak RSS |", "|---:|---:|---:|---:|---:|"]
        for edges, p, v in sorted(sweep):
            lines.append(f"| {edges:,} | {p} | {_f(_med(v['warm_s']))} | {_f(v['cold_s'])} | "
                         f"{_f(v['peak_rss_mib'], 'MiB', 4)} |")
    return lines


def _rss_split(split) -> str:
    """RssAnon / RssFile (a mapped store's page-cache pages) after the calls, or "–"."""
    if not split or "anon" not in split:
        return "–"
    return f"{split['anon']:.0f} / {split.get('file', 0):.0f} MiB"


def plot(run: dict, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rs = [r for r in rows(run) if r["cold_s"] is not None]
    if not rs:
        return False
    e = [r["edges"] for r in rs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label, style in (("cold_s", "paged, cold", "-"), ("warm_s", "paged, warm", "-"),
                              ("memory_s", "in-memory", "-"),
                              ("backward_s", "paged backward", "-"),
                              ("cold_floor", "floor, cold call", "k--"),
                              ("warm_floor", "floor, warm call", "k:")):
        pts = [(x, r[key]["s"] if isinstance(r[key], dict) else r[key])
               for x, r in zip(e, rs) if r[key]]
        if pts:
            ax1.loglog(*zip(*pts), style, label=label,
                       marker="x" if key.endswith("floor") else "o", markersize=8)
    ax1.set_xlabel("edges"), ax1.set_ylabel("seconds"), ax1.legend(fontsize=8)
    for key, label in (("fwd_rss", "paged forward"), ("memory_rss", "in-memory"),
                       ("ingest_rss", "ingest"), ("grad_rss", "paged gradient")):
        pts = [(x, r[key]) for x, r in zip(e, rs) if r[key]]
        if pts:
            ax2.loglog(*zip(*pts), "o-", label=label)
    ax2.set_xlabel("edges"), ax2.set_ylabel("peak RSS (MiB)"), ax2.legend(fontsize=8)
    fig.suptitle("Paged forward from a zarr store vs in memory and the I/O floor "
                 "(16 neighbours, 32 features)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(run: dict, out: str) -> str:
    os.makedirs(os.path.join(out, "results"), exist_ok=True)
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    name = f"paging-{run['date'][:10]}-{run['code'].get('short', 'unknown')}.json"
    with open(os.path.join(out, "results", name), "w") as f:
        json.dump(run, f, indent=1)
    plot(run, os.path.join(out, "plots", "paging.png"))
    text = markdown(run, name)
    with open(os.path.join(out, "PAGING.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    src = sys.argv[1]
    with open(src) as f:
        r = json.load(f)
    here = os.path.dirname(os.path.abspath(__file__))
    plot(r, os.path.join(here, "plots", "paging.png"))
    with open(os.path.join(here, "PAGING.md"), "w") as f:
        f.write(markdown(r, os.path.basename(src)))
