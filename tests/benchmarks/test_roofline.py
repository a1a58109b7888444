"""benchmarks/roofline.py without timing anything: the floor of each workload follows its
byte/flop model and the rates given, and the RESULTS.md section it writes replaces only its
own marked block (the other sections of the file stay as they are)."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import roofline as RL  # noqa: E402

RATES = {"native_triad_GBs": 20.0, "numpy_copy_GBs": 10.0, "gather_L2_64B_GBs": 40.0,
         "gather_L2_128B_GBs": 40.0, "gather_L3_128B_GBs": 25.0, "gather_L3_16B_GBs": 5.0,
         "gather_L2_16B_GBs": 10.0, "gather_DRAM_128B_GBs": 4.0, "sgemm_GFLOPs": 100.0}


def test_stencil_floor_is_its_streamed_bytes():
    m = RL.model("hex_mesh.stencil", 96)
    assert m["gathers"] == [] and m["stream"] == 2 * 96 ** 3 * 64
    assert RL.model("hex_mesh.csr", 96)["gathers"][0][2] == "L1"
    f = RL.floor_ms(m, RATES)
    assert f["bound"] == "stream"
    assert abs(f["floor_ms"] - 2 * 96 ** 3 * 64 / 20e9 * 1e3) < 1e-9


def test_csr_floor_takes_the_slower_of_stream_and_gather():
    m = RL.model("stored_csr.fwd", 131072)
    e = 131072 * 32
    assert m["gathers"] == [(e, 128, "L3")]        # x is 16 MiB: L3-resident
    assert RL.model("stored_csr.fwd", 8192)["gathers"][0][2] == "L2"   # 1 MiB
    f = RL.floor_ms(m, RATES)
    assert f["bound"] == "gather"
    assert abs(f["gather_ms"] - e * 128 / 25e9 * 1e3) < 1e-9
    step = RL.model("stored_csr.step", 131072)
    assert step["gathers"][0][0] == 2 * e and step["stream"] > m["stream"]


def test_attention_floor_is_the_sgemm_time():
    f = RL.floor_ms(RL.model("attention.fwd", 1024), RATES)
    assert f["bound"] == "flop"
    assert abs(f["flop_ms"] - 2 * 1024 ** 2 * 64 * 16 / 100e9 * 1e3) < 1e-9
    assert RL.model("attention.step", 1024)["flops"] == 3 * RL.model("attention.fwd",
                                                                     1024)["flops"]


def _run(tiga_ms: float, peer_ms: float) -> dict:
    results = [{"workload": "hex_mesh.stencil", "size": 32, "peer": "tiga", "role": "tiga",
                "status": "ok", "median_ms": tiga_ms},
               {"workload": "hex_mesh.stencil", "size": 32, "peer": "torch conv3d",
                "role": "peer", "status": "ok", "median_ms": peer_ms}]
    return {"started": "2026-01-01T00:00:00", "code": {"short": "abc1234"}, "threads": 2,
            "machine_info": {"loadavg_at_start": [1.0, 1.0, 1.0]},
            "rates": {"1": RATES, "2": RATES}, "_path": "results/roofline-x.json",
            "models": {"hex_mesh.stencil/32": RL.model("hex_mesh.stencil", 32)},
            "results": results}


def test_section_rewrites_only_its_block(tmp_path):
    floor = RL.floor_ms(RL.model("hex_mesh.stencil", 32), RATES)["floor_ms"]
    row = RL.rows_of(_run(2 * floor, 5 * floor))[0]
    assert abs(row["tiga_x"] - 2) < 1e-9 and abs(row["peer_x"] - 5) < 1e-9
    doc = "# R\n\n## Current standing\n\ntable\n\n## Other\n\nhand text\n\n## Method\n\nm\n"
    (tmp_path / "RESULTS.md").write_text(doc)
    RL.write_section([_run(2 * floor, 5 * floor)], str(tmp_path))
    first = (tmp_path / "RESULTS.md").read_text()
    assert first.count("## Roofline") == 1 and "hand text" in first
    assert first.index("## Roofline") < first.index("## Method")
    RL.write_section([_run(3 * floor, 5 * floor)], str(tmp_path))   # a second run replaces it
    second = (tmp_path / "RESULTS.md").read_text()
    assert second.count("## Roofline") == 1 and "**3.00**" in second and "**2.00**" not in second
    assert second.replace(second[second.index(RL.ROOFLINE_BEGIN):
                                 second.index(RL.ROOFLINE_END)], "") == \
        first.replace(first[first.index(RL.ROOFLINE_BEGIN):first.index(RL.ROOFLINE_END)], "")
