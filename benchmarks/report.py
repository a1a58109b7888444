"""benchmarks report: RESULTS.md and the plots, regenerated from one run's JSON.

    python benchmarks/report.py benchmarks/results/run-<date>-<commit>.json [...] [--out DIR]

Needs only the JSON (not the workload modules), so any saved run can be re-rendered. With
several runs, a later run's (workload, size) replaces the earlier ones' (a re-measurement on a
quieter machine, or of some workloads only), and the report names every run it used.

    python benchmarks/report.py --standing

rewrites only the "Current standing" table of RESULTS.md (the text between its marker
comments) from every recorded run: results/run-*.json and history.csv. Each row shows Tiga's
latest figure and the ratio to the fastest peer from the latest run that measured both.
A full render keeps the sections of RESULTS.md that it does not write itself.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys

METHOD = """\
## Method

- Every (workload, size, implementation) runs in a **fresh Python process**
  (`benchmarks/worker.py`), in a seeded random order, so no peer inherits another's caches,
  thread pools or allocator state, and slow drift of the machine spreads over all peers.
- Equal threads: `torch.set_num_threads`, `TIGA_NUM_THREADS`, `OMP/OPENBLAS/MKL_NUM_THREADS`
  and faiss's OpenMP pool all get `--threads`. torch runs with `THP_MEM_ALLOC_ENABLE=1` (its
  CPU allocator on huge pages, as numpy's large allocations already are); each peer gets the
  layout it is fastest with (torch.sparse: CSR; PyG: edge_index sorted by destination;
  SDPA: a batch axis so its flash kernel runs).
- One first call (timed apart: compiles, caches), warm-ups, then up to `--repeat` timed calls
  (at least 3; fewer once `--budget` seconds are spent): median and min-max.
- Every call's output, warm-ups and timed calls alike, is checked **outside the timer**
  against a float64 oracle computed independently in the worker (scipy, numpy, float64
  torch), with a tolerance set by the inputs' dtype (float32: 1e-4 relative to the largest
  reference value, scaled up for gradients that are sums with heavy cancellation). A peer
  that misses it is reported `wrong` and not timed.
- Peak memory: the kernel's high-water mark (`VmHWM` in `/proc/self/status`), reset through
  `/proc/self/clear_refs` before the timed calls, after freed heap pages went back to the
  kernel (`malloc_trim`); the figure is its growth over the resident size at that point
  (outputs, temporaries, allocator caches of the calls). The process's whole VmHWM
  (interpreter, libraries, inputs, oracle) is in the JSON.
- `--compare REV` adds Tiga as of REV (a temporary git worktree on PYTHONPATH, its own disk
  cache) as one more implementation, interleaved with the working tree in the same run.
"""


# ---------------------------------------------------------------- aggregation
def aggregate(results: list) -> dict:
    """(workload, size, impl) -> one record: over rounds, the median of the medians, the
    extreme min and max, the largest peak; the first non-ok status if none succeeded."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r["workload"], r["size"], r["impl"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        if not ok:
            out[key] = dict(rs[0])
            continue
        rec = dict(ok[0])
        rec.update(median_ms=statistics.median(r["median_ms"] for r in ok),
                   min_ms=min(r["min_ms"] for r in ok), max_ms=max(r["max_ms"] for r in ok),
                   reps=sum(r["reps"] for r in ok), rounds=len(ok),
                   peak_bytes=max(r.get("peak_bytes", 0) for r in ok))
        out[key] = rec
    return out


def tiga_impls(run: dict) -> tuple[str, str | None]:
    """(the working tree's Tiga label, the compared revision's label or None)."""
    cmp = run.get("compare")
    return ("tiga@worktree", cmp["impl"]) if cmp else ("tiga", None)


def fastest_peer(agg: dict, wl: str, size: int) -> tuple[str, dict] | None:
    peers = [(k[2], r) for k, r in agg.items() if k[0] == wl and k[1] == size
             and r.get("peer") != "tiga" and r.get("status") == "ok"]
    return min(peers, key=lambda p: p[1]["median_ms"]) if peers else None


def _sizes(agg: dict, wl: str) -> list:
    return sorted({k[1] for k in agg if k[0] == wl})


# ---------------------------------------------------------------- tables
def table(headers: list, rows: list) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _ms(r: dict | None) -> str:
    if r is None:
        return "–"
    return f"{r['median_ms']:.3g}" if r.get("status") == "ok" else f"*{r.get('status')}*"


def standing_rows(run: dict) -> tuple[list, list]:
    agg = aggregate(run["results"])
    new, old = tiga_impls(run)
    headers = ["workload", "size", "Tiga ms", "fastest peer", "peer ms", "Tiga ÷ peer"]
    if old:
        headers += [f"{old} ms", "new ÷ old"]
    rows = []
    for wl, meta in run["workloads"].items():
        for size in _sizes(agg, wl):
            t, best = agg.get((wl, size, new)), fastest_peer(agg, wl, size)
            ratio = (f"**{t['median_ms'] / best[1]['median_ms']:.2f}**"
                     if best and t and t.get("status") == "ok" else "–")
            row = [wl, f"{meta['size_label']} = {size}", _ms(t), best[0] if best else "–",
                   _ms(best[1]) if best else "–", ratio]
            if old:
                o = agg.get((wl, size, old))
                both = t and o and t.get("status") == o.get("status") == "ok"
                row += [_ms(o), f"{t['median_ms'] / o['median_ms']:.2f}" if both else "–"]
            rows.append(row)
    return headers, rows


def standing_text(run: dict) -> str:
    return "Current standing (Tiga ÷ fastest peer, median time; < 1: Tiga faster)\n" + \
        table(*standing_rows(run))


# ---------------------------------------------------------------- the standing table
# RESULTS.md's "Current standing" section is generated between these markers from every
# recorded run (results/run-*.json, and history.csv rows of runs whose JSON is not kept);
# `python benchmarks/report.py --standing` rewrites only the text between them
STANDING_BEGIN = "<!-- standing-table: generated by benchmarks/report.py --standing -->"
STANDING_END = "<!-- /standing-table -->"
# implementations that are Tiga as of the run's commit (a compared revision, tiga@<rev>,
# is older code); for the paging workloads Tiga is the paged run, measured against Tiga
# on the same relation in memory
TIGA_NOW = ("tiga", "tiga@worktree")
TIGA_PAGED = "tiga paged"


def recorded_runs(results_dir: str, history_path: str | None = None) -> list:
    """Every recorded run, oldest first: the run JSONs of `results_dir` (ordered by their
    start time), then runs that only history.csv holds (its rows of one (date, commit)
    that no JSON covers; ordered by date, then by their place in the file). Each run is
    {"label", "date", "started", "machine", "workloads", "results"}."""
    runs, covered = [], set()
    for name in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
        if not (name.startswith("run-") and name.endswith(".json")):
            continue
        with open(os.path.join(results_dir, name)) as f:
            run = json.load(f)
        if "results" not in run or run.get("settings", {}).get("quick"):
            continue
        covered.add((run["date"], run["code"]["short"]))
        runs.append({"label": f"{run['date']} `{run['code']['short']}`", "date": run["date"],
                     "started": run.get("started", run["date"]), "file": name,
                     "machine": run.get("machine"), "workloads": run.get("workloads", {}),
                     "results": run["results"]})
    runs.sort(key=lambda r: (r["started"], r["file"]))
    extra: dict = {}
    if history_path and os.path.exists(history_path):
        with open(history_path, newline="") as f:
            for row in csv.DictReader(f):
                key = (row["date"], row["commit"])
                if key in covered or not row.get("median_ms"):
                    continue
                extra.setdefault(key, []).append(
                    {"workload": row["workload"], "size": int(row["size"]),
                     "impl": row["peer"], "peer": _family(row["peer"]),
                     "rev": row["peer"].split("@", 1)[1] if "@" in row["peer"] and
                     row["peer"] != "tiga@worktree" else None, "status": "ok",
                     "median_ms": float(row["median_ms"])})
    for (date, commit), results in sorted(extra.items(), key=lambda kv: kv[0][0]):
        runs.append({"label": f"{date} `{commit}`", "date": date, "started": date,
                     "file": "history.csv", "machine": None, "workloads": {},
                     "results": results})
    return runs


def _family(impl: str) -> str:
    return "tiga" if impl.startswith("tiga@") else impl


def _run_medians(run: dict) -> dict:
    """(workload, size) -> {impl: median ms over the run's ok rounds}, Tiga's compared
    revisions left out."""
    groups: dict = {}
    for r in run["results"]:
        impl = r["impl"]
        if r.get("status") != "ok" or r.get("rev") is not None or (
                impl.startswith("tiga@") and impl != "tiga@worktree"):
            continue
        groups.setdefault((r["workload"], r["size"]), {}).setdefault(impl, []).append(
            r["median_ms"])
    # over rounds, the median of the medians (as aggregate())
    return {key: {impl: statistics.median(ms) for impl, ms in impls.items()}
            for key, impls in groups.items()}


def _tiga_impl(impls: dict) -> str | None:
    for name in (*TIGA_NOW, TIGA_PAGED):
        if name in impls:
            return name
    return None


def _peers(impls: dict, tiga: str) -> dict:
    return {k: v for k, v in impls.items() if k != tiga and k not in TIGA_NOW
            and (not k.startswith("tiga") or tiga == TIGA_PAGED)}


def standing_from_records(runs: list) -> tuple[list, list, list]:
    """(headers, rows, runs used) of the standing table: per (workload, size) Tiga's
    latest figure and the run that measured it, and the ratio to the fastest other
    implementation from the latest run that measured both (never across runs)."""
    latest: dict = {}      # (workload, size) -> (run, tiga impl, ms)
    paired: dict = {}      # (workload, size) -> (run, peer, peer ms, tiga ms)
    peer_only: dict = {}   # (workload, size) -> (run, peer, peer ms)
    workloads: dict = {}   # newest definition first
    for run in runs:
        workloads = {**workloads, **run["workloads"]}
        for key, impls in _run_medians(run).items():
            tiga = _tiga_impl(impls)
            peers = _peers(impls, tiga)
            best = min(peers.items(), key=lambda kv: kv[1]) if peers else None
            if tiga is not None:
                latest[key] = (run, tiga, impls[tiga])
                if best:
                    paired[key] = (run, best[0], best[1], impls[tiga])
            elif best:
                peer_only[key] = (run, best[0], best[1])
    order = {wl: i for i, wl in enumerate(workloads)}
    keys = sorted(set(latest) | set(peer_only), key=lambda k: (order.get(k[0], 1e9), k))
    keys = [k for k in keys if k[1] in workloads.get(k[0], {}).get("sizes", [k[1]])]
    headers = ["workload", "size", "Tiga ms", "measured", "fastest peer", "peer ms",
               "Tiga ÷ peer", "ratio measured"]
    rows, used = [], []
    for wl, size in keys:
        label = workloads.get(wl, {}).get("size_label")
        row = [wl, f"{label} = {size}" if label else str(size)]
        t = latest.get((wl, size))
        row += [f"{t[2]:.3g}", t[0]["label"]] if t else ["–", "never measured"]
        pair = paired.get((wl, size))
        if pair:
            same = t is not None and pair[0] is t[0]
            row += [pair[1], f"{pair[2]:.3g}", f"**{pair[3] / pair[2]:.2f}**",
                    "same run" if same else f"{pair[0]['label']} (Tiga {pair[3]:.3g} ms)"]
            used += [pair[0]]
        else:
            alone = peer_only.get((wl, size))
            row += ([alone[1], f"{alone[2]:.3g}", "–", "no run measured both"] if alone
                    else ["–", "–", "–", "no peer measured"])
        used += [t[0]] if t else []
        rows.append(row)
    seen, runs_used = set(), []
    for run in used:
        if id(run) not in seen:
            seen.add(id(run))
            runs_used.append(run)
    return headers, rows, runs_used


def _machines(runs: list) -> str:
    names = []
    for run in runs:
        m = run.get("machine")
        text = (f"{m.get('cpu_model')}, {m.get('logical_cpus')} logical CPUs, "
                f"{m.get('threads_used')} threads per library" if m else
                "machine not recorded (history.csv only)")
        if text not in names:
            names.append(text)
    return "; ".join(names) or "none"


def standing_section(results_dir: str, history_path: str | None = None) -> str:
    """The standing table's markdown, markers included, from every recorded run."""
    runs = recorded_runs(results_dir, history_path)
    headers, rows, used = standing_from_records(runs)
    files = sorted({r["file"] for r in used})
    return "\n".join([
        STANDING_BEGIN, "",
        "Tiga's latest median time per workload and size, and Tiga's median ÷ the fastest "
        "other implementation's (below 1: Tiga is faster), taken from the latest run that "
        "measured both: a ratio is never formed across runs. Every figure passed its "
        "float64 check. Tiga as of each run's commit; compared older revisions "
        "(`tiga@<rev>`) are left out.", "",
        f"Machine: {_machines(used)}. Generated from {len(runs)} recorded runs "
        f"({len(files)} of them give a figure here: "
        + ", ".join(f"`{f}`" for f in files) + ").", "",
        table(headers, rows), "", STANDING_END])


def replace_standing(md: str, section: str) -> str:
    """`md` with the text between the standing markers replaced by `section` (markers
    included); without markers, the body of its "## Current standing" section (up to the
    next "## " heading) becomes `section`. Nothing else changes."""
    if STANDING_BEGIN in md and STANDING_END in md:
        head, rest = md.split(STANDING_BEGIN, 1)
        return head + section + rest.split(STANDING_END, 1)[1]
    lines = md.split("\n")
    try:
        start = lines.index("## Current standing")
    except ValueError:
        raise SystemExit("report: RESULTS.md has neither the standing markers nor a "
                         "'## Current standing' heading") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return "\n".join(lines[:start + 1] + ["", section, ""] + lines[end:])


def update_standing(md_path: str, results_dir: str, history_path: str | None) -> str:
    """Rewrite only the standing table of the RESULTS.md at `md_path`."""
    with open(md_path) as f:
        md = f.read()
    new = replace_standing(md, standing_section(results_dir, history_path))
    with open(md_path, "w") as f:
        f.write(new)
    return md_path


def workload_table(agg: dict, wl: str, size_label: str) -> str:
    rows = []
    for size in _sizes(agg, wl):
        best = fastest_peer(agg, wl, size)
        recs = sorted(((k[2], r) for k, r in agg.items() if k[0] == wl and k[1] == size),
                      key=lambda p: (p[1].get("status") != "ok", p[1].get("median_ms", 0)))
        for impl, r in recs:
            if r.get("status") != "ok":
                why = str(r.get("reason", "")).replace("|", "/")[:120]
                rows.append([size, impl, f"*{r.get('status')}*", why, "", "", "", "", ""])
                continue
            ratio = f"{r['median_ms'] / best[1]['median_ms']:.2f}" if best else "–"
            rows.append([size, impl, f"{r['median_ms']:.3g}",
                         f"{r['min_ms']:.3g}–{r['max_ms']:.3g}", r["reps"],
                         f"{r.get('first_call_ms', 0):.3g}",
                         f"{r.get('peak_bytes', 0) / 2**20:.1f}", ratio,
                         f"{r.get('rel_err', 0):.1e}"])
    return table([size_label, "implementation", "median ms", "min–max ms", "reps",
                  "first call ms", "peak MiB", "÷ fastest peer", "rel. err"], rows)


# ---------------------------------------------------------------- plots
def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _ok_points(agg: dict, wl: str) -> dict:
    """implementation -> [(size, record)] of its successful measurements, sizes ascending."""
    out: dict = {}
    for (w, size, impl), r in sorted(agg.items(), key=lambda kv: kv[0][1]):
        if w == wl and r.get("status") == "ok":
            out.setdefault(impl, []).append((size, r))
    return dict(sorted(out.items()))


def _draw_lines(ax_t, ax_m, points: dict, size_label: str) -> None:
    for impl, pts in points.items():
        style = dict(marker="o", lw=2.2 if impl.startswith("tiga") else 1.3, label=impl)
        xs = [s for s, _ in pts]
        ax_t.plot(xs, [r["median_ms"] for _, r in pts], **style)
        ax_t.fill_between(xs, [r["min_ms"] for _, r in pts], [r["max_ms"] for _, r in pts],
                          alpha=0.15)
        # a call that needed no new pages reads 0: drawn at the 0.1 MiB floor
        ax_m.plot(xs, [max(r.get("peak_bytes", 0) / 2**20, 0.1) for _, r in pts], **style)
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(size_label)
    ax_t.legend(fontsize=8)


def _draw_bars(ax_t, ax_m, points: dict, size_text: str) -> None:
    """One size (a quick run, a single-size workload): a bar per implementation, with the
    min-max range of its times as an error bar."""
    names = list(points)
    recs = [pts[0][1] for pts in points.values()]
    med = [r["median_ms"] for r in recs]
    err = [[m - r["min_ms"] for m, r in zip(med, recs)],
           [r["max_ms"] - m for m, r in zip(med, recs)]]
    colors = [f"C{i}" for i in range(len(names))]
    ax_t.barh(names, med, xerr=err, color=colors)
    ax_m.barh(names, [max(r.get("peak_bytes", 0) / 2**20, 0.1) for r in recs], color=colors)
    ax_m.set_yticklabels([])
    for ax in (ax_t, ax_m):
        ax.invert_yaxis()
        ax.set_title(size_text, fontsize=9)


def plot_workload(agg: dict, wl: str, meta: dict, path: str, plt) -> bool:
    """Time and peak memory per implementation: against size on log axes, or as bars when
    the run measured one size. False when no implementation succeeded."""
    points = _ok_points(agg, wl)
    if not points:
        return False
    sizes = sorted({s for pts in points.values() for s, _ in pts})
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    if len(sizes) == 1:
        _draw_bars(ax_t, ax_m, points, f"{meta['size_label']} = {sizes[0]}")
    else:
        _draw_lines(ax_t, ax_m, points, meta["size_label"])
    time_ax = "x" if len(sizes) == 1 else "y"
    for ax, label in ((ax_t, "median time per call (ms)"), (ax_m, "peak memory of calls (MiB)")):
        getattr(ax, f"set_{time_ax}scale")("log")
        getattr(ax, f"set_{time_ax}label")(label)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(meta["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- RESULTS.md
def machine_lines(run: dict) -> list:
    m, code = run["machine"], run["code"]
    vers = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    dirty = f" + {code['tiga_dirty_files']} uncommitted tiga/ files" \
        if code.get("tiga_dirty_files") else ""
    return [f"- **CPU**: {m['cpu_model']}; {m.get('physical_cores')} cores, "
            f"{m['logical_cpus']} logical CPUs; **RAM** {m.get('memory_GiB')} GiB; "
            f"transparent huge pages `{m.get('thp')}`",
            f"- **Threads** per library: {m['threads_used']}; load average at start "
            f"{m.get('loadavg_at_start')}",
            f"- **Versions**: Python {m['python']}, {vers}",
            f"- **Run**: {run['started']}, commit `{code['short']}`{dirty}, "
            f"{_ran(run)} of {len(run['order'])} configurations run in {run['wall_s']:.0f} s "
            f"(one process each), order seed "
            f"{run['seed']}" + (" (**quick** smoke run)" if run["settings"].get("quick") else "")
            + (" — **interrupted**, partial" if run.get("interrupted") else "")]


def _ran(run: dict) -> int:
    return sum(1 for r in run["results"] if "round" in r)


def render(run: dict, json_name: str, plots: dict, standing: str | None = None) -> str:
    """RESULTS.md from `run`; `standing`: the standing table's section (standing_section,
    from every recorded run), else one made from `run` alone."""
    agg = aggregate(run["results"])
    if standing is None:
        standing = "\n".join([
            STANDING_BEGIN, "",
            "Tiga's median time ÷ the fastest other implementation's, per workload and size "
            "(below 1: Tiga is faster). Every figure passed its float64 check.", "",
            table(*standing_rows(run)), "", STANDING_END])
    out = ["# Tiga benchmark results", "",
           f"Generated by `benchmarks/run.py` (`make bench`) from `{json_name}`; do "
           "not edit by hand (`python benchmarks/report.py <json>` re-renders; "
           "`--standing` redoes only the standing table from every recorded run). History "
           "of every run: `history.csv`.", "", *machine_lines(run), "",
           "## Current standing", "", standing, ""]
    for wl, meta in run["workloads"].items():
        if not any(k[0] == wl for k in agg):
            continue
        out += [f"## {meta['title']} (`{wl}`)", "", meta["description"], "",
                "Implementations: " + "; ".join(f"**{p}**: {n}" if n else f"**{p}**"
                                                 for p, n in meta["peers"].items()) + ".", "",
                workload_table(agg, wl, meta["size_label"]), ""]
        if wl in plots:
            out += [f"![{meta['title']}](plots/{plots[wl]})", ""]
    return "\n".join(out + [METHOD])


def write_report(run: dict, dest: str, json_name: str | None = None) -> str:
    """RESULTS.md and plots/<workload>.png under `dest`; returns the markdown's path."""
    agg = aggregate(run["results"])
    plot_dir = os.path.join(dest, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    plt, plots = _pyplot(), {}
    if plt is None:
        # renders without matplotlib once dropped every image link: say so, keep the links
        print("report: matplotlib is not installed (pip install -e '.[bench]'): plots not "
              "redrawn; RESULTS.md links the PNGs already in plots/", file=sys.stderr)
    for wl, meta in run["workloads"].items():
        name = f"{wl.replace('.', '_')}.png"
        path = os.path.join(plot_dir, name)
        drawn = plt is not None and plot_workload(agg, wl, meta, path, plt)
        if drawn or (plt is None and os.path.exists(path)):
            plots[wl] = name
    json_name = json_name or (f"results/run-{run['date']}-{run['code']['short']}"
                              f"{'-quick' if run['settings'].get('quick') else ''}.json")
    path = os.path.join(dest, "RESULTS.md")
    results_dir = os.path.join(dest, "results")
    # a quick smoke run is never a standing figure: its report's table is its own
    standing = (standing_section(results_dir, os.path.join(dest, "history.csv"))
                if os.path.isdir(results_dir) and not run.get("settings", {}).get("quick")
                else None)
    md = render(run, json_name, plots, standing)
    if os.path.exists(path):       # sections written by hand stay, before the method
        with open(path) as f:
            kept = hand_written_sections(f.read())
        if kept:
            head, method = md.split("\n## Method\n", 1)
            md = head.rstrip("\n") + "\n\n" + kept + "\n\n## Method\n" + method
    with open(path, "w") as f:
        f.write(md)
    return path


def hand_written_sections(md: str) -> str:
    """The "## " sections of an existing RESULTS.md that render() does not write (added by
    hand, or by another tool), in their order."""
    parts = re.split(r"^(?=## )", md, flags=re.M)
    generated = re.compile(r"## (Current standing|Method|.* \(`[\w.]+`\))\s*$")
    kept = [p.rstrip("\n") for p in parts[1:]
            if not generated.match(p.split("\n", 1)[0])]
    return "\n\n".join(kept)


def merge_runs(runs: list) -> dict:
    """One run from several, oldest first: the newest run's metadata; for each (workload,
    size) the results of the newest run that measured it."""
    merged = dict(runs[-1])
    results, seen, workloads, order = [], set(), {}, []
    for run in reversed(runs):
        covered = {(r["workload"], r["size"]) for r in run["results"]}
        results += [r for r in run["results"] if (r["workload"], r["size"]) not in seen]
        seen |= covered
        workloads = {**run["workloads"], **workloads}
        order += run["order"]
    # a size the newest definition of its workload no longer lists was retired (a run
    # without "sizes" keeps all)
    results = [r for r in results if r["size"] in workloads.get(r["workload"], {}).get(
        "sizes", [r["size"]])]
    merged.update(results=results, workloads=workloads, order=order,
                  wall_s=sum(r["wall_s"] for r in runs))
    return merged


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="*")
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--standing", action="store_true",
                   help="rewrite only RESULTS.md's standing table (between its markers) "
                        "from every run in OUT/results and OUT/history.csv")
    a = p.parse_args(argv)
    if a.standing:
        print(update_standing(os.path.join(a.out, "RESULTS.md"),
                              os.path.join(a.out, "results"),
                              os.path.join(a.out, "history.csv")))
        return 0
    if not a.json:
        p.error("give run JSONs to render, or --standing")
    runs = []
    for path in a.json:
        with open(path) as f:
            runs.append(json.load(f))
    names = ", ".join(f"results/{os.path.basename(j)}" for j in a.json)
    print(write_report(merge_runs(runs), a.out, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
