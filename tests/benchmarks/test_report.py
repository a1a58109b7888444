"""benchmarks/report.py renders RESULTS.md with one plot per workload from stored JSON: lines
over several sizes, bars for a single size (quick runs), and without matplotlib it keeps the
links to the PNGs already there (a render once dropped every link) and says why."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)
import report  # noqa: E402

# stored runs: paging.fwd at two sizes; hex_mesh.csr and stored_csr.fwd at one size each
RUNS = ("run-2026-11-23-83f9904-2.json", "run-2026-11-26-b4a2d70-2.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _merged() -> dict:
    runs = []
    for name in RUNS:
        with open(os.path.join(BENCH, "results", name)) as f:
            runs.append(json.load(f))
    return report.merge_runs(runs)


def _sections(md: str) -> dict:
    """workload -> the image links of its section."""
    parts = re.split(r"^## .*\(`([\w.]+)`\)$", md, flags=re.M)
    return {wl: re.findall(r"!\[[^\]]*\]\((plots/[\w.]+\.png)\)", body)
            for wl, body in zip(parts[1::2], parts[2::2])}


def test_every_workload_section_embeds_its_plot(tmp_path):
    pytest.importorskip("matplotlib")
    md_path = report.write_report(_merged(), str(tmp_path), "results/x.json")
    sections = _sections(open(md_path).read())
    assert set(sections) == {"paging.fwd", "hex_mesh.csr", "stored_csr.fwd"}
    for wl, links in sections.items():
        assert links == [f"plots/{wl.replace('.', '_')}.png"], (wl, links)
        with open(tmp_path / links[0], "rb") as f:
            assert f.read(8) == PNG_MAGIC, wl


def test_without_matplotlib_existing_plots_stay_linked(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(report, "_pyplot", lambda: None)
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "paging_fwd.png").write_bytes(PNG_MAGIC)
    md_path = report.write_report(_merged(), str(tmp_path), "results/x.json")
    sections = _sections(open(md_path).read())
    assert sections == {"paging.fwd": ["plots/paging_fwd.png"], "hex_mesh.csr": [],
                        "stored_csr.fwd": []}
    assert "matplotlib is not installed" in capsys.readouterr().err
