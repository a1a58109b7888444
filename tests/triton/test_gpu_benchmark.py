"""The GPU check's driver (benchmarks/gpu_check.py) and workloads (benchmarks/gpu.py) without a
GPU: it skips without CUDA; a peer is stopped, never waited for, once it runs past 10x Tiga's
time (a scripted worker: stalled after setup, slow warm-up, never ready) and its result is
taken when it is in time; an absent peer falls to the next one installed; and the dry run
(GPU_CHECK_DRY=1: triton-interpreter, tiny sizes) runs a workload end to end in worker
processes, writing the JSON and the table with Tiga's result equal to the peer's."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load("gpu_check")
gpu = check.gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device runs the check")
def test_skips_without_cuda(capsys, tmp_path):
    assert check.main(["--out", str(tmp_path)]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out


class Scripted:
    """A worker whose events come after the given delays (seconds)."""

    def __init__(self, script):
        self.script, self.killed, self.sent = list(script), False, []

    def send(self, cmd):
        self.sent.append(cmd)

    def next(self, deadline):
        delay, ev = self.script.pop(0) if self.script else (1e9, None)
        now = time.monotonic()
        if now + delay > deadline:
            time.sleep(max(0.0, deadline - now))
            return None
        time.sleep(delay)
        return ev


class FakePool:
    def __init__(self, worker):
        self.worker = worker

    def get(self, side):
        return self.worker

    def kill(self, side):
        self.worker.killed = True


CMD = {"workload": "csr-32k", "warmup": 2, "repeat": 10, "side": "peer"}
READY = {"event": "ready", "peer": "slowpoke"}


@pytest.fixture
def short_floor(monkeypatch):
    monkeypatch.setattr(check, "PEER_FLOOR_S", 0.05)
    monkeypatch.setattr(check.gpu, "DRY", False)


def test_stalled_peer_is_stopped(short_floor):
    w = Scripted([(0.0, READY), (60.0, {"event": "warm", "est_ms": 1.0})])
    t0 = time.monotonic()
    got = check.run_peer(FakePool(w), CMD, setup_s=5.0, tiga_ms=1.0)
    assert time.monotonic() - t0 < 1.0     # 0.05 s + 10 x 1 ms x 3 calls, not 60 s
    assert w.killed and got["peer"] == "slowpoke"
    assert got["peer_status"].startswith("stopped: slower than 10x Tiga")


def test_slow_warm_up_is_stopped_at_once(short_floor):
    w = Scripted([(0.0, READY), (0.0, {"event": "warm", "est_ms": 900.0}),
                  (0.0, {"event": "done", "ms": 900.0})])
    got = check.run_peer(FakePool(w), CMD, setup_s=5.0, tiga_ms=2.0)
    assert w.killed and "warm-up call 900 ms" in got["peer_status"]


def test_peer_without_data_is_stopped(short_floor):
    w = Scripted([(60.0, READY)])
    got = check.run_peer(FakePool(w), CMD, setup_s=0.1, tiga_ms=1.0)
    assert w.killed and "no data on the device" in got["peer_status"]


def test_peer_in_time_is_taken(short_floor):
    done = {"event": "done", "ms": 5.0, "peer": "quick", "max_abs_diff": 0.0}
    w = Scripted([(0.0, READY), (0.01, {"event": "warm", "est_ms": 5.0}), (0.01, done)])
    assert check.run_peer(FakePool(w), CMD, setup_s=5.0, tiga_ms=1.0) == done
    assert not w.killed


def test_absent_peer_falls_to_the_next(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu, "DRY", True)
    x = torch.arange(6.0).reshape(3, 2)
    peers = [("absent", None), ("present", lambda: x * 2.0)]
    monkeypatch.setattr(gpu, "setup", lambda name: (lambda: x * 2.0 + 1.0, peers))
    save = str(tmp_path / "tiga.npy")
    cmd = {"workload": "csr-32k", "warmup": 1, "repeat": 2}
    tiga = gpu.run_command(dict(cmd, side="tiga", save=save))
    got = gpu.run_command(dict(cmd, side="peer", compare=save))
    assert tiga["event"] == got["event"] == "done" and got["peer"] == "present"
    assert got["max_abs_diff"] == 1.0 and got["scale"] == 11.0
    monkeypatch.setattr(gpu, "setup", lambda name: (lambda: x, [("absent", None)]))
    assert gpu.run_command(dict(cmd, side="peer"))["why"] == "no peer installed"
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["ready", "warm", "ready", "warm"]


def test_dry_run_end_to_end(tmp_path):
    env = dict(os.environ, GPU_CHECK_DRY="1", TRITON_INTERPRET="1",
               TIGA_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out",
                           str(tmp_path), "--only", "csr-32k", "--warmup", "1", "--repeat",
                           "1"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    (row,) = report["rows"]
    assert row["status"] == "ok" and row["peer"] == "torch.sparse"
    assert row["max_abs_diff"] <= 1e-5 * row["scale"] and row["tiga_ms"] > 0
    assert "| csr-32k |" in (tmp_path / "gpu-check.md").read_text()
    assert np.isfinite(row["speedup"])
